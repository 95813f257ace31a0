"""Input validation: every bad input gets a ValueError/TypeError that names the problem."""

import math
import numbers
from collections.abc import Collection
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fastgp._backends import BACKENDS, check_backend_for_manual_axes
from fastgp._penalty.kinds import KINDS
from fastgp._typing import AxisName, Backend, Critic, Kind, PyTree
from fastgp.distributed import (
    SLICES_AS_SAMPLES,
    check_axis_kinds,
    collective_axes,
    require_axis_name,
    varying_axes,
)


def leaves_of(tree: PyTree, what: str) -> tuple[tuple[jax.Array, ...], int]:
    """The leaves of a pytree of (B, ...) float arrays, as a tuple in their own shapes, and B.

    Leaves are not reshaped: a kernel reads each in its own layout (see ``binding``)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError(f"{what} is an empty pytree; expected at least one (B, ...) array")
    batch: int | None = None
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        name = f"{what}{jax.tree_util.keystr(path)}"
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise TypeError(f"{name} is a {type(leaf).__name__}, expected an array")
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise TypeError(
                f"{name} has dtype {leaf.dtype}; gradient penalties need a floating "
                f"dtype (float32, bfloat16, float16, or float64 with x64); pass integer inputs "
                f"such as class labels by closing over them in the critic"
            )
        if leaf.ndim == 0:
            raise ValueError(f"{name} is a scalar; expected a leading batch axis (B, ...)")
        if leaf.shape[0] == 0:
            raise ValueError(f"{name} has batch size 0 (shape {leaf.shape}); need B >= 1")
        if math.prod(leaf.shape[1:]) == 0:
            raise ValueError(f"{name} has no features per sample (shape {leaf.shape})")
        if batch is None:
            batch = leaf.shape[0]
        elif leaf.shape[0] != batch:
            raise ValueError(
                f"{name} has batch size {leaf.shape[0]} but earlier leaves have "
                f"{batch}; every leaf must share the leading batch axis"
            )
    assert batch is not None  # set by the first of the (at least one) leaves
    return tuple(leaves), batch


def call_critic(critic: Critic, x: PyTree) -> jax.Array:
    """``critic(x)``; a failure inside the critic gets a note on what fastgp passed to it."""
    try:
        return critic(x)
    except (TypeError, ValueError) as err:
        shapes = jax.tree.map(lambda leaf: tuple(leaf.shape), x)
        err.add_note(
            f"fastgp called the critic on the whole batch x of shape {shapes}; a "
            f"critic must map (B, ...) to scores of shape (B,) or (B, 1). A per-sample "
            f"model (an Equinox module, say) must be passed as jax.vmap(model)."
        )
        raise


def check_same_structure(real: PyTree, fake: PyTree) -> None:
    """real and fake must have the same tree structure, shapes and dtypes."""
    # jaxlib 0.10.2 ships no type stubs for PyTreeDef, so mypy cannot type its comparison.
    if jax.tree.structure(real) != jax.tree.structure(fake):  # type: ignore[operator]
        raise ValueError(
            f"real and fake have different structures: {jax.tree.structure(real)} "
            f"vs {jax.tree.structure(fake)}"
        )
    for (path, r), f in zip(
        jax.tree_util.tree_leaves_with_path(real), jax.tree.leaves(fake), strict=True
    ):
        if r.shape != f.shape:
            raise ValueError(
                f"real{jax.tree_util.keystr(path)} has shape {r.shape} but fake has {f.shape}"
            )
        if r.dtype != f.dtype:
            raise TypeError(
                f"real{jax.tree_util.keystr(path)} has dtype {r.dtype} but fake has {f.dtype}"
            )


def check_choice(name: str, value: Any, choices: Collection[Any]) -> None:
    """``value`` must be one of ``choices``; the error names the argument."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {choices}")


def check_axis_name(axis_name: AxisName, what: str = "axis_name") -> None:
    """None, a mesh axis name, or a tuple of them (``()`` for a deliberate per-shard value), each
    bound where the call is traced (:func:`require_bound_axes`)."""
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if axis_name is not None and not all(isinstance(n, str) and n for n in names):
        raise TypeError(
            f"{what} must be None, a mesh axis name or a tuple of names, got {axis_name!r}"
        )
    require_bound_axes(axis_name, what)


AXIS_ROLES = {
    "axis_name": "the mesh axis that splits the batch (the mean is then over the global batch)",
    "sample_axis_name": "the mesh axis that splits each sample's tokens, rows or features (each "
    "norm then sums over it)",
}


def require_bound_axes(axis_name: AxisName, what: str = "axis_name") -> None:
    """A ValueError naming every axis of ``axis_name`` that no enclosing ``shard_map`` (or
    ``vmap``/``pmap`` axis) binds here, where a collective over it would raise JAX's
    ``NameError: unbound axis name``."""
    unbound = []
    for name in collective_axes(axis_name):
        try:
            lax.axis_size(name)
        except NameError:
            unbound.append(name)
    if not unbound:
        return
    one = len(unbound) == 1
    spelled = unbound[0] if one else tuple(unbound)
    noun, them = ("the mesh axis", "it") if one else ("the mesh axes", "them")
    raise ValueError(
        f"{what}={axis_name!r} names {noun} {spelled!r}, which no enclosing jax.shard_map binds "
        f"here. {what} is {AXIS_ROLES.get(what, 'a mesh axis')}; it applies only inside "
        f"jax.shard_map over a mesh that has {them}: call this function inside "
        f"jax.shard_map(..., mesh=mesh) with {spelled!r} in mesh.axis_names. Under plain "
        f"jax.jit with sharded arrays the arrays are global, so every shard is already in: "
        f"leave {what}=None there."
    )


def check_mesh_axes(
    tree: PyTree,
    what: str,
    axis_name: AxisName,
    sample_axis_name: AxisName,
    consequence: str = SLICES_AS_SAMPLES,
) -> None:
    """Both axis arguments well formed (TypeError), no mesh axis in both, and every manual mesh
    axis ``tree`` varies over named by one of them (ValueErrors naming ``what`` and the
    ``consequence`` of the forgotten axis: ``fastgp.distributed.require_axis_name``)."""
    check_axis_name(axis_name)
    check_axis_name(sample_axis_name, "sample_axis_name")
    check_axis_kinds(axis_name, sample_axis_name)
    require_axis_name(tree, axis_name, what, consequence, sample_axis_name)


def check_backend_on_data(backend: Backend, tree: PyTree) -> None:
    """Backends that cannot run on this data (interpret mode inside shard_map, kernels on f64)."""
    check_backend_for_manual_axes(backend, varying_axes(tree))
    if backend not in ("auto", "xla"):
        for leaf in jax.tree.leaves(tree):
            if jnp.dtype(leaf.dtype).itemsize > 4:
                raise ValueError(
                    f"backend={backend!r} runs kernels that accumulate in float32, "
                    f"but the input has dtype {leaf.dtype}; use backend='auto' or "
                    f"'xla' for float64, or cast to float32"
                )


def check_kind(kind: Kind) -> None:
    """``kind`` must be one of ``KINDS`` (the type says so; callers may still pass any string)."""
    if kind in KINDS:
        return
    hint = ""
    if isinstance(kind, str) and kind.lower() == "r2":
        hint = "; R2 is the R1 penalty taken at the fakes: kind='r1' with x the fake batch"
    elif isinstance(kind, str) and kind.lower() in KINDS:
        hint = f"; kinds are lower case: {kind.lower()!r}"
    raise ValueError(f"unknown penalty kind {kind!r}; expected one of {KINDS}{hint}")


def check_backend(backend: Backend) -> None:
    """``backend`` must be one of ``BACKENDS``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def check_target(target: float) -> float:
    """The target is compiled into the kernel, so it must be a static, finite, positive number."""
    if isinstance(target, jax.core.Tracer) or not isinstance(target, numbers.Real):
        raise TypeError(f"target must be a static Python number, got {type(target).__name__}")
    target = float(target)
    if not math.isfinite(target) or target <= 0:
        raise ValueError(f"target must be finite and > 0, got {target}")
    return target


def check_weight(weight: float | jax.Array) -> float | jax.Array:
    """Weights may be traced (schedules, taken as given); concrete ones must be finite, >= 0."""
    if isinstance(weight, jax.core.Tracer):
        return weight
    try:
        value = float(weight)
    except TypeError as err:
        raise TypeError(f"weight must be a real scalar, got {weight!r}") from err
    if not math.isfinite(value):
        raise ValueError(f"weight must be finite, got {value}")
    if value < 0:
        raise ValueError(
            f"weight must be >= 0, got {value}: the penalty is added to the critic's loss, so a "
            f"negative weight rewards steep gradients instead of penalising them"
        )
    return weight


def check_scores(
    scores: jax.Array,
    batch: int,
    x: PyTree = None,
    axis_name: AxisName = None,
    sample_axis_name: AxisName = None,
) -> jax.Array:
    """Critic output at ``x`` must be (B,) or (B, 1); returns it as (B,). Inside shard_map the
    scores must be whole-sample scores along ``sample_axis_name`` (the mesh axes that split each
    sample), and must differ between the shards of the ``axis_name`` axes that x varies over:
    scores equal on every shard of such an axis say that it splits samples, not the batch."""
    sample_axes = collective_axes(sample_axis_name)
    batch_axes = set(collective_axes(axis_name)) & varying_axes(x)
    shape = getattr(scores, "shape", None)
    if shape is None:
        raise ValueError(
            f"critic must return an array of scores of shape ({batch},) or ({batch}, 1) for a "
            f"batch of {batch}, got a {type(scores).__name__}"
        )
    if shape not in ((batch,), (batch, 1)):
        several = len(shape) > 1 and shape[0] == batch
        raise ValueError(
            f"critic must return scores of shape ({batch},) or ({batch}, 1) for a "
            f"batch of {batch}, got {shape}"
            + (
                ": several scores per sample (patches or heads) need one per sample. R1 as "
                "StyleGAN2 takes it is the gradient of their sum: pass lambda x: "
                f"critic(x).sum(axis={tuple(range(1, len(shape)))}) (or .mean, to match a loss "
                "that averages them: its gradient is the sum's over their count)"
                if several
                else ""
            )
        )
    if not jnp.issubdtype(scores.dtype, jnp.floating):
        raise TypeError(f"critic scores have dtype {scores.dtype}; expected a floating dtype")
    partial = tuple(sorted(set(varying_axes(scores)) & set(sample_axes)))
    if partial:
        raise ValueError(
            f"the critic's scores vary over the sample axes {partial}: each slice scored only its "
            f"own part of every sample, so the input-gradient would not be the whole sample's. "
            f"Make the critic return whole-sample scores on every slice (e.g. psum its pooled "
            f"features over {partial} before the head), or name those axes in axis_name if "
            f"they split the batch."
        )
    whole = tuple(sorted(set(batch_axes) - set(varying_axes(scores))))
    if whole:
        raise ValueError(
            f"axis_name names {whole} as axes that split the batch, but the critic's scores are "
            f"the same on every shard of them while x differs: the shards hold slices of the "
            f"same samples. Name those axes in sample_axis_name (the norm then sums over them) "
            f"and keep only the axes that split the batch in axis_name."
        )
    return scores.reshape(batch)
