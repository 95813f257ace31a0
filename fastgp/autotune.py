"""Pick the fastest exact variant of the gradient penalty for one critic loss.

    tuning = autotune(critic_loss, params, *args)                   # timed on this device
    tuning = autotune(critic_loss, params, *args, generation="v5e")  # ranked, compiled for TPU
    tuning.best       -> {"second_order": ..., "remat": ..., "backend": ...}
    tuning.results    -> one VariantResult per variant: the exact ones fastest first, then the rest
    tuning.table()    -> the same as a markdown table

``critic_loss(params, *args, penalty=...) -> scalar`` is the user's own loss. It calls
``penalty(critic, x, **options)`` where it would call ``fastgp.gradient_penalty`` (``kind``,
``target``, ``weight`` as usual; ``second_order``, ``remat`` and ``backend`` are what is tuned, so
it must not pass them). Give the single-device loss: no ``axis_name``, no ``shard_map``.

Every variant (second order x remat policy x backend) is first checked against the naive nested
``jax.grad`` penalty on the current device: the loss's value and its gradient with respect to
``params``, each to ``rtol`` times the reference's largest |entry|. Only exact variants are
ranked. Without ``generation`` they are timed: ``jax.jit(jax.value_and_grad(loss))``, rounds
interleaved (``fastgp.measure.interleaved_times``), median seconds. With ``generation`` ("v5e",
"v6e", ...) each is compiled for one chip of that TPU generation from this host
(``fastgp.measure``; needs ``jax[tpu]``) and ranked by the roofline bound of its compiled
figures; a program that does not fit the chip's HBM is reported and not ranked. The Pallas
backend is a candidate where it runs (TPU, GPU, or a named TPU generation, whose kernels are
checked here in interpret mode).
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastgp._backends import attention_backend
from fastgp._measure import compiled as compiled
from fastgp._measure.comparison import host_leaves, reference_scale, relative_errors
from fastgp._measure.timing import interleaved_times
from fastgp._penalty.reference import naive_gradient_penalty
from fastgp._typing import Backend, PyTree, Remat, SecondOrder
from fastgp.penalty import REMAT_POLICIES, SECOND_ORDER, gradient_penalty

TUNED = ("second_order", "remat", "backend")
CriticLoss = Callable[..., jax.Array]  # critic_loss(params, *args, penalty=...) -> scalar
PenaltyFn = Callable[..., jax.Array]  # penalty(critic, x, **options) -> scalar


class Variant(NamedTuple):
    """One way of taking the penalty: ``gradient_penalty``'s ``second_order``, ``remat``,
    ``backend``."""

    second_order: SecondOrder = "reverse-over-forward"
    remat: Remat = None
    backend: Backend = "xla"
    attention: str | None = None  # fastgp.attention's backend in the critic, where it has one

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``gradient_penalty`` (the attention backend is not one)."""
        return {name: getattr(self, name) for name in TUNED}

    def label(self) -> str:
        text = f"{self.second_order}, remat={self.remat}, {self.backend}"
        return text if self.attention is None else f"{text}, attention={self.attention}"


DEFAULT = Variant()  # fastgp.gradient_penalty's defaults ("auto" is XLA)


class VariantResult(NamedTuple):
    """What was measured for one variant (``variant`` None: the naive penalty, the yardstick).

    ``seconds``: the median step time, or with a TPU generation the roofline bound of the
    compiled program; ``program``: that program's ``fastgp.measure.figures``; ``problem``: why
    the variant is not ranked (not exact, does not fit, does not compile), else None."""

    variant: Variant | None
    value_error: float
    gradient_error: float
    seconds: float | None = None
    program: dict[str, Any] | None = None
    problem: str | None = None

    @property
    def label(self) -> str:
        return "naive (nested jax.grad)" if self.variant is None else self.variant.label()


class Tuning(NamedTuple):
    """The pick (``best``: keyword arguments for ``gradient_penalty``) and every measurement."""

    best: dict[str, Any]
    results: tuple[VariantResult, ...]
    naive: VariantResult
    measured_on: str  # e.g. "cpu: wall time, median of 10 interleaved rounds"
    # the best variant's fastgp.attention backend (use it as attention_fn's backend, or inside
    # fastgp.attention_backend), or None when the critic has no fastgp.attention
    attention: str | None = None

    def table(self) -> str:
        """A markdown table: every variant's errors, seconds, ratios and memory."""
        base = self.naive.seconds
        lines = [
            f"Measured on {self.measured_on}.",
            "",
            "| variant | exact | value err | grad err | ms | / naive | peak MiB | note |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in (*self.results, self.naive):
            ms = "-" if r.seconds is None else f"{r.seconds * 1e3:.3g}"
            ratio = "-" if r.seconds is None or not base else f"{r.seconds / base:.3f}x"
            peak = "-" if r.program is None else f"{r.program['peak'] / 2**20:.1f}"
            exact = "reference" if r.variant is None else ("no" if _inexact(r) else "yes")
            note = r.problem or (
                "**best**" if r.variant is not None and r is self.results[0] else ""
            )
            lines.append(
                f"| {r.label} | {exact} | {r.value_error:.1e} | {r.gradient_error:.1e} | {ms} "
                f"| {ratio} | {peak} | {note} |"
            )
        return "\n".join(lines)


def candidates(platform: str, attention: bool = False) -> tuple[Variant, ...]:
    """Every variant for a platform ("cpu", "gpu", "tpu"): the Pallas kernels only where they
    compile (TPU, GPU). With ``attention`` (the critic calls ``fastgp.attention``), each also
    with every attention backend that compiles there. The default comes first."""
    backends: tuple[Backend, ...] = ("xla", "pallas") if platform in ("tpu", "gpu") else ("xla",)
    every = [
        Variant(order, remat, backend)
        for backend in backends
        for order in SECOND_ORDER
        for remat in REMAT_POLICIES
    ]
    if attention:
        kernels = ("xla", "pallas") if platform in ("tpu", "gpu") else ("xla",)
        default = DEFAULT._replace(attention="xla")
        every = [v._replace(attention=a) for a in kernels for v in every]
        return (default, *(v for v in every if v != default))
    return (DEFAULT, *(v for v in every if v != DEFAULT))


def uses_attention(critic_loss: CriticLoss, params: PyTree, args: Sequence[Any]) -> bool:
    """Whether the loss's program holds ``fastgp.attention`` (traced with the naive penalty)."""
    jaxpr = jax.make_jaxpr(_loss_with(critic_loss, _penalty(None, None, [])))(params, *args)
    return "fastgp_attention_forward" in str(jaxpr)


def _inexact(result: VariantResult) -> bool:
    return result.problem is not None and result.problem.startswith("not exact")


def _penalty(variant: Variant | None, backend_here: Backend | None, calls: list[int]) -> PenaltyFn:
    """The ``penalty=`` given to the user's loss: fastgp's penalty as ``variant`` (on
    ``backend_here`` where the variant's own backend cannot run on this host), or the naive one."""

    def penalty(critic: Callable[..., jax.Array], x: PyTree, **options: Any) -> jax.Array:
        tuned = sorted(set(options) & set(TUNED))
        if tuned:
            raise ValueError(
                f"critic_loss passed {tuned} to penalty(...); autotune chooses "
                f"{', '.join(TUNED)} itself, so leave them out of the call"
            )
        calls.append(1)
        if variant is None:
            return naive_gradient_penalty(critic, x, **options)
        chosen = dict(variant.options(), backend=backend_here or variant.backend)
        return gradient_penalty(critic, x, **options, **chosen)

    return penalty


def _loss_with(
    critic_loss: CriticLoss, penalty: PenaltyFn, attention: str | None = None
) -> Callable[..., jax.Array]:
    """The loss with ``penalty``; with ``attention``, traced under that attention backend."""

    def loss(params: PyTree, *args: Any) -> jax.Array:
        if attention is None:
            return critic_loss(params, *args, penalty=penalty)
        with attention_backend(attention):
            return critic_loss(params, *args, penalty=penalty)

    return loss


def _check_loss(critic_loss: CriticLoss, params: PyTree, args: Sequence[Any]) -> None:
    """Trace the loss once with the naive penalty; a clear error for each way it can be wrong."""
    if not callable(critic_loss):
        raise TypeError(f"critic_loss must be callable, got {type(critic_loss).__name__}")
    calls: list[int] = []
    try:
        out = jax.eval_shape(_loss_with(critic_loss, _penalty(None, None, calls)), params, *args)
    except TypeError as err:
        if "penalty" not in str(err):
            raise
        raise TypeError(
            f"critic_loss must take the penalty as a keyword argument, "
            f"critic_loss(params, *args, penalty=fastgp.gradient_penalty), and call "
            f"penalty(critic, x, ...) for its gradient penalty; calling it with penalty= "
            f"failed: {err}"
        ) from err
    if not calls:
        raise ValueError(
            "critic_loss(params, *args, penalty=...) never called penalty(critic, x, ...): "
            "there is no gradient penalty to tune; call the penalty it is given where it calls "
            "fastgp.gradient_penalty"
        )
    if not (
        isinstance(out, jax.ShapeDtypeStruct)
        and out.shape == ()
        and jnp.issubdtype(out.dtype, jnp.floating)
    ):
        got = f"shape {out.shape}, dtype {out.dtype}" if hasattr(out, "shape") else repr(out)
        raise ValueError(
            f"critic_loss must return a floating scalar (the loss to differentiate), got {got}"
        )


def _value_and_grad(
    critic_loss: CriticLoss, penalty: PenaltyFn, attention: str | None = None
) -> Callable[..., Any]:
    return jax.jit(jax.value_and_grad(_loss_with(critic_loss, penalty, attention)))


def _relative_error(ours: Any, ref: list[np.ndarray], what: str) -> float:
    """max |ours - ref| over every leaf, relative to the reference's largest |entry|."""
    leaves = host_leaves(ours)
    names = [what] * len(leaves)
    return max(relative_errors(leaves, ref, reference_scale(ref, what), names))


def _reference(critic_loss: CriticLoss, params: PyTree, args: Sequence[Any]) -> Any:
    value, grads = jax.block_until_ready(
        _value_and_grad(critic_loss, _penalty(None, None, []))(params, *args)
    )
    ref = (host_leaves(value), host_leaves(grads))
    reference_scale(ref[0], "loss")
    reference_scale(ref[1], "parameter gradient")
    return ref


def _check(
    critic_loss: CriticLoss,
    variant: Variant,
    backend_here: Backend | None,
    params: PyTree,
    args: Sequence[Any],
    ref: Any,
    rtol: float,
) -> VariantResult:
    attention = variant.attention
    if attention == "pallas" and backend_here is not None:
        attention = backend_here  # the kernels checked in interpret mode on this host
    fn = _value_and_grad(critic_loss, _penalty(variant, backend_here, []), attention)
    value, grads = jax.block_until_ready(fn(params, *args))
    value_error = _relative_error(value, ref[0], "loss")
    gradient_error = _relative_error(grads, ref[1], "parameter gradient")
    problem = None
    if not max(value_error, gradient_error) <= rtol:
        problem = f"not exact: error > rtol={rtol:.0e}"
    return VariantResult(variant, value_error, gradient_error, problem=problem)


def _blocking_call(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    """``fn(*args)`` as a no-argument call that waits for the device."""
    return lambda: jax.block_until_ready(fn(*args))


def _timed(
    critic_loss: CriticLoss,
    results: list[VariantResult],
    params: PyTree,
    args: Sequence[Any],
    rounds: int,
    warmup: int,
) -> list[VariantResult]:
    calls = {}
    for index, r in enumerate(results):
        attention = None if r.variant is None else r.variant.attention
        fn = _value_and_grad(critic_loss, _penalty(r.variant, None, []), attention)
        calls[str(index)] = _blocking_call(fn, params, *args)
    samples = interleaved_times(calls, rounds=rounds, warmup=warmup)
    return [r._replace(seconds=float(np.median(samples[str(i)]))) for i, r in enumerate(results)]


def _structs(tree: Any) -> Any:
    def struct(leaf: Any) -> Any:
        dtype = leaf.dtype if hasattr(leaf, "dtype") else jnp.result_type(leaf)
        return jax.ShapeDtypeStruct(np.shape(leaf), dtype)

    return jax.tree.map(struct, tree)


def _compiled_for(
    critic_loss: CriticLoss,
    result: VariantResult,
    generation: str,
    params: PyTree,
    args: Sequence[Any],
) -> VariantResult:
    attention = None if result.variant is None else result.variant.attention
    fn = jax.value_and_grad(_loss_with(critic_loss, _penalty(result.variant, None, []), attention))
    try:
        program = compiled.figures(
            compiled.compile_for(compiled.tpu_device(generation), fn, *_structs((params, *args)))
        )
    except Exception as err:  # a compiler's refusal is a measurement here
        if compiled.is_out_of_memory(err):
            return result._replace(problem=f"does not fit {generation}'s HBM")
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return result._replace(problem=f"does not compile for {generation}: {first[:160]}")
    return result._replace(seconds=compiled.roofline_s(program, generation), program=program)


def _check_all(
    critic_loss: CriticLoss,
    variants: Sequence[Variant],
    params: PyTree,
    args: Sequence[Any],
    rtol: float,
) -> list[VariantResult]:
    """Every variant checked against the naive penalty; kernels named for a TPU generation are
    checked on a CPU host in interpret mode."""
    interpret: Backend | None = "interpret" if jax.default_backend() == "cpu" else None
    ref = _reference(critic_loss, params, args)
    return [
        _check(
            critic_loss,
            v,
            interpret if "pallas" in (v.backend, v.attention) else None,
            params,
            args,
            ref,
            rtol,
        )
        for v in variants
    ]


def _measure(
    critic_loss: CriticLoss,
    exact: list[VariantResult],
    generation: str | None,
    params: PyTree,
    args: Sequence[Any],
    rounds: int,
    warmup: int,
) -> tuple[VariantResult, list[VariantResult], str]:
    """(the naive yardstick, the exact variants, how) timed here or compiled for a chip."""
    naive = VariantResult(None, 0.0, 0.0)
    if generation is None:
        measured = _timed(critic_loss, [*exact, naive], params, args, rounds, warmup)
        how = f"{jax.default_backend()}: wall time, median of {rounds} interleaved rounds"
        return measured[-1], measured[:-1], how
    naive = _compiled_for(critic_loss, naive, generation, params, args)
    exact = [_compiled_for(critic_loss, r, generation, params, args) for r in exact]
    return naive, exact, f"one {generation} chip: roofline bound of the compiled program"


def autotune(
    critic_loss: CriticLoss,
    params: PyTree,
    *args: Any,
    generation: str | None = None,
    variants: Sequence[Variant] | None = None,
    rounds: int = 10,
    warmup: int = 2,
    rtol: float = 1e-5,
) -> Tuning:
    """The fastest exact variant of the gradient penalty inside ``critic_loss``.

    Args:
      critic_loss: ``critic_loss(params, *args, penalty=...) -> scalar``, calling
        ``penalty(critic, x, ...)`` for its gradient penalty (see the module docstring).
      params: the pytree the loss is differentiated with respect to (the critic's parameters).
      args: the loss's other arguments (concrete arrays: real, fake, a key, ...).
      generation: None to time on JAX's default device; a TPU generation ("v4", "v5e", "v5p",
        "v6e", "7x") to rank programs compiled for one chip of it from this host.
      variants: the candidates (default :func:`candidates` of the platform).
      rounds, warmup: timed and untimed calls per variant (timing only).
      rtol: tolerance of the check against the naive penalty, relative to the reference's
        largest |entry| (1e-5 suits float32; a bfloat16 loss needs about 1e-2).

    Returns:
      a :class:`Tuning`; ``best`` are keyword arguments for ``fastgp.gradient_penalty``.

    Raises:
      TypeError / ValueError naming the problem when the loss does not take or call ``penalty``,
      does not return a floating scalar, passes a tuned option itself, or when the naive
      reference is not finite; ValueError when no variant is exact (or none fits).
    """
    if generation is not None and generation not in compiled.TOPOLOGIES:
        raise ValueError(
            f"unknown TPU generation {generation!r}; expected one of {tuple(compiled.TOPOLOGIES)}"
        )
    _check_loss(critic_loss, params, args)
    platform = "tpu" if generation else jax.default_backend()
    if variants is None:
        variants = candidates(platform, uses_attention(critic_loss, params, args))
    variants = tuple(variants)
    checked = _check_all(critic_loss, variants, params, args, rtol)
    exact = [r for r in checked if r.problem is None]
    naive, exact, how = _measure(critic_loss, exact, generation, params, args, rounds, warmup)
    ranked = sorted((r for r in exact if r.problem is None), key=lambda r: r.seconds or 0.0)
    rest = [r for r in checked if r.problem is not None] + [r for r in exact if r.problem]
    tuning = Tuning({}, (*ranked, *rest), naive, how)
    if not ranked:
        raise ValueError(f"no variant of the penalty is exact and runs here:\n{tuning.table()}")
    best = ranked[0].variant
    assert best is not None  # the naive yardstick is never ranked
    return tuning._replace(best=best.options(), attention=best.attention)


__all__ = [
    "DEFAULT",
    "TUNED",
    "Tuning",
    "Variant",
    "VariantResult",
    "autotune",
    "candidates",
    "uses_attention",
]
