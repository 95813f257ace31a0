"""Helpers for users' own test suites: check a gradient penalty against the naive one, time it.

    assert_penalty_matches_naive(apply, params, x, *, orders=2, ...)  -> PenaltyErrors
    assert_kernels_match_naive(apply, params, x, *, backends=...)     -> {backend: PenaltyErrors}
    compare_penalty_steps(make_step, args, *, rounds=20, warmup=2)    -> {naive_s, fastgp_s, ...}
    benchmark_penalty_steps(benchmark, make_step, args, ...)          -> the same, recorded

The oracle is :func:`fastgp.naive_gradient_penalty` (nested ``jax.grad``). ``apply`` is
the user's critic, ``apply(params, x) -> scores (B,) or (B, 1)``; the penalty is differentiated
with respect to ``params``, the way a critic step differentiates it.

This module imports jax, numpy and fastgp's library modules only: importing it pulls in neither
pytest nor ``fastgp.train``.
"""

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastgp._backends import INTERPRET_BACKENDS
from fastgp._measure.comparison import reference_scale, relative_errors
from fastgp._measure.timing import interleaved_times
from fastgp._penalty.reference import naive_gradient_penalty
from fastgp._typing import Backend, Critic, Kind, PyTree, Remat, SecondOrder
from fastgp.penalty import DEFAULT_WEIGHT, gradient_penalty

PenaltyFn = Callable[[Critic, PyTree], jax.Array]  # penalty_fn(critic, x) -> scalar
Apply = Callable[[PyTree, PyTree], jax.Array]  # apply(params, x) -> scores (B,) or (B, 1)
MakeStep = Callable[[PenaltyFn], Callable[..., Any]]  # make_step(penalty_fn) -> step(*args)
ORDER_NAMES = ("value", "parameter gradient", "Hessian-vector product")


class PenaltyErrors(NamedTuple):
    """Max relative error per derivative order (``None`` where that order was not checked)."""

    value: float
    gradient: float | None = None
    hvp: float | None = None


# --- Checking a penalty against the naive one ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _PenaltyOptions:
    """The penalty's options: ``kind``, ``target``, ``weight`` for both sides, the rest fastgp's."""

    kind: Kind = "wgan-gp"
    target: float = 1.0
    weight: float = DEFAULT_WEIGHT
    backend: Backend = "auto"
    second_order: SecondOrder = "reverse-over-forward"
    remat: Remat = None

    def naive(self) -> PenaltyFn:
        """The naive penalty with these options, as ``penalty_fn(critic, x) -> scalar``."""
        return functools.partial(
            naive_gradient_penalty, kind=self.kind, target=self.target, weight=self.weight
        )

    def fastgp(self) -> PenaltyFn:
        """``fastgp.gradient_penalty`` with these options, as ``penalty_fn(critic, x)``."""
        return functools.partial(gradient_penalty, **vars(self))


def _random_tangent(params: PyTree, seed: int) -> PyTree:
    """A standard-normal pytree shaped and typed like ``params`` (one key per leaf)."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(
        treedef,
        [
            jax.random.normal(k, jnp.shape(leaf), jnp.result_type(leaf))
            for k, leaf in zip(keys, leaves, strict=True)
        ],
    )


def _derivatives(penalty_fn: PenaltyFn, apply: Apply, orders: int) -> Callable[..., list[Any]]:
    """Jitted ``(params, x, tangent) -> [value, d/dparams, HVP along tangent][:orders + 1]``."""

    def loss(params: PyTree, x: PyTree) -> jax.Array:
        return penalty_fn(functools.partial(apply, params), x)

    def run(params: PyTree, x: PyTree, tangent: PyTree) -> list[Any]:
        out = [loss(params, x)]
        if orders >= 1:
            out.append(jax.grad(loss)(params, x))
        if orders >= 2:
            grad = lambda p: jax.grad(loss)(p, x)
            out.append(jax.jvp(grad, (params,), (tangent,))[1])
        return out

    return jax.jit(run)


def _evaluate(fn: Callable[..., list[Any]], params: PyTree, x: PyTree, tangent: PyTree) -> Any:
    """``fn(params, x, tangent)`` as host float64 arrays, waiting for the result.

    (Interpret-mode kernels call back into JAX from a host thread; blocking before the next
    dispatch keeps the CPU client from deadlocking, see ``fastgp._backends``.)"""
    out = jax.block_until_ready(fn(params, x, tangent))
    return jax.tree.map(lambda leaf: np.asarray(leaf, np.float64), out)


def _leaf_names(tree: PyTree, prefix: str) -> list[str]:
    """``prefix`` followed by each leaf's ``jax.tree_util.keystr`` path, in leaf order."""
    return [
        prefix + jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)
    ]


def _compare_order(order: int, ours: Any, ref: Any, names: list[str]) -> tuple[float, str]:
    """(max relative error, name of the worst entry) of one order's result against the reference.

    Relative to the largest |entry| of the whole reference (all leaves together), so that
    entries near zero, or a leaf the penalty does not depend on, do not dominate."""
    what = ORDER_NAMES[order]
    if order == 0:
        if np.shape(ours) != ():
            raise AssertionError(
                f"the penalty's value has shape {np.shape(ours)}; expected a scalar"
            )
        ours, ref, names = [ours], [ref], [what]
    else:
        # jaxlib 0.10.2 ships no type stubs for PyTreeDef, so mypy cannot type its comparison.
        if jax.tree.structure(ours) != jax.tree.structure(ref):  # type: ignore[operator]
            raise AssertionError(
                f"the {what} has structure {jax.tree.structure(ours)}; the "
                f"reference's is {jax.tree.structure(ref)}"
            )
        ours, ref = jax.tree.leaves(ours), jax.tree.leaves(ref)
        names = [f"{what} of {name}" for name in names]
    errors = relative_errors(ours, ref, reference_scale(ref, what), names)
    worst = int(np.argmax(errors))
    return errors[worst], names[worst]


def _summary(errors: Sequence[float]) -> str:
    """'value 1.2e-07, parameter gradient 3.4e-01' for the orders compared so far."""
    return ", ".join(f"{ORDER_NAMES[i]} {e:.1e}" for i, e in enumerate(errors))


def _shown(error: float) -> str:
    """'1.23e-04', or a note that the penalty's result had non-finite entries."""
    return "inf (the penalty's result is not finite)" if math.isinf(error) else f"{error:.2e}"


def assert_penalty_matches_naive(
    apply: Apply,
    params: PyTree,
    x: PyTree,
    *,
    orders: int = 2,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    weight: float = DEFAULT_WEIGHT,
    backend: Backend = "auto",
    second_order: SecondOrder = "reverse-over-forward",
    remat: Remat = None,
    rtol: float = 1e-5,
    penalty_fn: PenaltyFn | None = None,
    seed: int = 0,
) -> PenaltyErrors:
    """Assert that a gradient penalty and its parameter derivatives equal the naive penalty's.

    Compares, for order 0 up to ``orders``: the value; the gradient with respect to ``params``
    (``jax.grad``); and a Hessian-vector product (``jax.jvp`` of ``jax.grad``) along a standard
    normal tangent drawn from ``seed``. Each to ``rtol`` times the largest |entry| of the
    reference (the value: |reference value|), computed in float64 on the host.

    Args:
      apply: the critic, ``apply(params, x) -> scores`` of shape (B,) or (B, 1); samples must be
        independent (no batch norm).
      params: pytree of floating arrays; the derivatives are taken with respect to it.
      x: (B, ...) floating array, or a pytree of them sharing the batch axis, where the penalty
        is evaluated (interpolates, say); no sample's input-gradient may vanish (the naive
        reference is NaN there).
      orders: 0, 1 or 2, the highest order compared.
      kind, target, weight: the penalty, for both sides.
      backend, second_order, remat: options of ``fastgp.gradient_penalty`` (ignored when
        ``penalty_fn`` is given).
      rtol: tolerance, relative to the largest |entry| of each reference result.
      penalty_fn: the penalty under test, ``penalty_fn(critic, x) -> scalar`` with ``critic`` a
        closure ``x -> scores``; by default ``fastgp.gradient_penalty`` with the options above.
      seed: the tangent's PRNG seed.

    Returns:
      the max relative error found per order.

    Raises:
      AssertionError naming the order (and the parameter leaf), the error and the tolerance, at
      the lowest order that fails; ValueError when a reference is all zero or not finite.
    """
    if orders not in (0, 1, 2):
        raise ValueError(f"orders must be 0, 1 or 2 (the highest order compared), got {orders!r}")
    options = _PenaltyOptions(kind, target, weight, backend, second_order, remat)
    penalty_fn = options.fastgp() if penalty_fn is None else penalty_fn
    tangent = _random_tangent(params, seed)
    ours = _evaluate(_derivatives(penalty_fn, apply, orders), params, x, tangent)
    ref = _evaluate(_derivatives(options.naive(), apply, orders), params, x, tangent)
    return PenaltyErrors(*_errors_by_order(ours, ref, _leaf_names(params, "params"), rtol, kind))


def _errors_by_order(ours: Any, ref: Any, names: list[str], rtol: float, kind: Kind) -> list[float]:
    """The max relative error of each order, failing at the lowest order above ``rtol``."""
    errors = []
    for order, (our, their) in enumerate(zip(ours, ref, strict=True)):
        error, name = _compare_order(order, our, their, names)
        errors.append(error)
        if not error <= rtol:
            raise AssertionError(
                f"the penalty's {name} differs from the naive penalty's: max relative error "
                f"{_shown(error)} (relative to the reference's largest entry) > rtol={rtol:.1e} "
                f"[kind={kind!r}; errors so far: {_summary(errors)}]"
            )
    return errors


def assert_kernels_match_naive(
    apply: Apply,
    params: PyTree,
    x: PyTree,
    *,
    backends: Sequence[Backend] = INTERPRET_BACKENDS,
    **kwargs: Any,
) -> dict[str, PenaltyErrors]:
    """:func:`assert_penalty_matches_naive` for each Pallas interpret-mode backend, on one device.

    On the CPU, ``"interpret"`` runs the TPU kernel in generic Pallas interpret mode,
    ``"tpu-interpret"`` the TPU kernel in TPU interpret mode and ``"gpu-interpret"`` the Triton
    kernel in generic interpret mode. One device only: this does not check ``shard_map`` (where
    the generic interpret modes cannot run). ``kwargs`` are the other options of
    :func:`assert_penalty_matches_naive` except ``backend`` and ``penalty_fn``. The
    AssertionError names the backend that failed. Returns the errors per backend.
    """
    for reserved in ("backend", "penalty_fn"):
        if reserved in kwargs:
            raise TypeError(
                f"assert_kernels_match_naive sets {reserved!r} itself; use "
                f"assert_penalty_matches_naive for one {reserved}"
            )
    results: dict[str, PenaltyErrors] = {}
    for backend in backends:
        try:
            results[backend] = assert_penalty_matches_naive(
                apply, params, x, backend=backend, **kwargs
            )
        except AssertionError as err:
            raise AssertionError(f"backend={backend!r}: {err}") from err
    return results


# --- Timing a critic step with the naive penalty and with fastgp's ------------------------------


def _penalty_steps(
    make_step: MakeStep, args: Sequence[Any], options: _PenaltyOptions
) -> dict[str, Callable[[], Any]]:
    """{"naive": call, "fastgp": call}: zero-argument calls of each step that block on its result.

    ``make_step(penalty_fn)`` builds the user's (jitted) step ``step(*args)`` around a
    ``penalty_fn(critic, x) -> scalar``."""
    steps = {"naive": make_step(options.naive()), "fastgp": make_step(options.fastgp())}

    def blocking_call(step: Callable[..., Any]) -> Callable[[], Any]:
        return lambda: jax.block_until_ready(step(*args))

    return {name: blocking_call(step) for name, step in steps.items()}


def _timing_summary(samples: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Medians (seconds), fastgp / naive as a ratio of medians and as a median of per-round ratios.

    A ratio below 1 means the fastgp step is the faster."""
    naive, ours = np.asarray(samples["naive"]), np.asarray(samples["fastgp"])
    return {
        "naive_s": float(np.median(naive)),
        "fastgp_s": float(np.median(ours)),
        "ratio": float(np.median(ours) / np.median(naive)),
        "paired_ratio": float(np.median(ours / naive)),
        "rounds": len(naive),
        "samples_s": {name: [float(s) for s in values] for name, values in samples.items()},
    }


def compare_penalty_steps(
    make_step: MakeStep,
    args: Sequence[Any],
    *,
    rounds: int = 20,
    warmup: int = 2,
    **options: Any,
) -> dict[str, Any]:
    """Time the user's step with the naive penalty and with fastgp's, interleaved in one run.

    Args:
      make_step: ``make_step(penalty_fn) -> step``, a jitted ``step(*args)`` (a whole critic
        step, say) that calls ``penalty_fn(critic, x) -> scalar`` for its gradient penalty.
      args: the step's arguments, the same for both.
      rounds: timed rounds; each calls both steps once, in alternating order.
      warmup: untimed calls of each step first (the first compiles).
      options: ``kind``, ``target``, ``weight`` (both penalties), ``backend``, ``second_order``,
        ``remat`` (fastgp's).

    Returns:
      {"naive_s", "fastgp_s": median seconds per call; "ratio": fastgp_s / naive_s;
      "paired_ratio": the median of per-round fastgp / naive ratios; "rounds"; "samples_s":
      {"naive", "fastgp": per-round seconds}}. Nothing is asserted about the times.
    """
    calls = _penalty_steps(make_step, args, _PenaltyOptions(**options))
    return _timing_summary(interleaved_times(calls, rounds=rounds, warmup=warmup))


def benchmark_penalty_steps(
    benchmark: Any,
    make_step: MakeStep,
    args: Sequence[Any],
    *,
    rounds: int = 20,
    warmup: int = 2,
    **options: Any,
) -> dict[str, Any]:
    """:func:`compare_penalty_steps` for a pytest-benchmark ``benchmark`` fixture.

    The interleaved figures go to ``benchmark.extra_info`` (under their own names); the
    fixture's own statistics are then those of the fastgp step, timed by ``benchmark.pedantic``
    for ``rounds`` rounds. Returns the figures. Nothing is asserted about the times.
    """
    calls = _penalty_steps(make_step, args, _PenaltyOptions(**options))
    figures = _timing_summary(interleaved_times(calls, rounds=rounds, warmup=warmup))
    benchmark.extra_info.update(figures)
    benchmark.pedantic(calls["fastgp"], rounds=rounds, iterations=1, warmup_rounds=1)
    return figures


__all__ = [
    "PenaltyErrors",
    "assert_kernels_match_naive",
    "assert_penalty_matches_naive",
    "benchmark_penalty_steps",
    "compare_penalty_steps",
]
