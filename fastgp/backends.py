"""Backend resolution: which implementation of the three row primitives a call uses.

The primitives (see ``fastgp.rowops``) are

    stats(g, carry, kind, target) -> (8, B) float32   sums of squares, norms, penalties
    scale(s, g, out_dtype)        -> (B, D)            s[b] * g[b, :]
    dot(a, b)                     -> (B,) float32      per-sample dot products

``"auto"`` picks the Pallas TPU kernels where the program is lowered for TPU and the XLA version
everywhere else (CUDA included, until the Triton kernels have been run and timed on a GPU),
decided at lowering time by ``lax.platform_dependent`` (so ahead-of-time export for TPU from a CPU
host gets the kernels). ``"pallas"`` runs the TPU kernels on TPU and the Triton kernels on CUDA,
and fails to lower, with a ValueError naming the alternatives, anywhere else.
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import tpu as pltpu
from jax.extend.core import Primitive
from jax.interpreters import mlir

from fastgp import kernels
from fastgp.kernels import penalty_gpu
from fastgp.kernels.stats_layout import NORM_ROW, PENALTY_ROW, STATS_ROWS, SUM_ROW

BACKENDS = ("auto", "pallas", "interpret", "tpu-interpret", "gpu-interpret", "xla")


class RowOps(NamedTuple):
    stats: Callable
    scale: Callable
    dot: Callable


# --- XLA ----------------------------------------------------------------------------------------

def _accumulator(*arrays):
    """float32, or float64 for float64 input (with x64 enabled): never narrower than the input."""
    return jnp.result_type(jnp.float32, *(a.dtype for a in arrays))


def _xla_stats(g, carry=None, *, kind=None, target=1.0):
    x = g.astype(_accumulator(g))
    total = jnp.sum(x * x, axis=1)
    if carry is not None:
        total = total + carry[SUM_ROW]
    rows = [total]
    if kind is not None:
        norm = jnp.sqrt(total)
        rows += [norm, kernels.penalty_of_norm(total, norm, kind, target)]
    rows += [jnp.zeros_like(total)] * (STATS_ROWS - len(rows))
    return jnp.stack(rows)


def _xla_scale(scale, g, *, out_dtype=None):
    dtype = _accumulator(scale, g)
    out = scale.astype(dtype)[:, None] * g.astype(dtype)
    return out.astype(out_dtype or g.dtype)


def _xla_dot(a, b):
    dtype = _accumulator(a, b)
    return jnp.sum(a.astype(dtype) * b.astype(dtype), axis=1)


XLA = RowOps(_xla_stats, _xla_scale, _xla_dot)


# --- Pallas -------------------------------------------------------------------------------------

def _pallas_ops(module, interpret) -> RowOps:
    """RowOps over a kernel module (``kernels.penalty_tpu`` or ``kernels.penalty_gpu``)."""
    def stats(g, carry=None, *, kind=None, target=1.0):
        return module.row_stats(g, carry=carry, kind=kind, target=target, interpret=interpret)

    return RowOps(
        stats,
        functools.partial(module.scale_rows, interpret=interpret),
        functools.partial(module.row_dot, interpret=interpret),
    )


# A primitive whose only job is to fail, with a clear message, when lowered for a platform that
# the requested backend cannot run on. Tracing it is fine: lax.platform_dependent traces every
# branch but lowers only the ones for the platforms being compiled.
_unsupported_p = Primitive("fastgp_backend_unsupported")
_unsupported_p.def_abstract_eval(lambda x, *, message: x)


def _raise_on_lowering(ctx, x, *, message):
    raise ValueError(message)


mlir.register_lowering(_unsupported_p, _raise_on_lowering)


def _unsupported(fn: Callable, backend: str) -> Callable:
    """A stand-in for ``fn`` whose lowering raises a ValueError naming the alternatives."""
    message = (f"backend={backend!r} runs the Pallas TPU or GPU kernels, but this program is being "
               f"lowered for another platform ({jax.default_backend()!r} by default). Use "
               f"backend='interpret' or 'tpu-interpret' to run the kernel on CPU, 'xla' for plain "
               f"JAX, or 'auto' to pick per platform.")

    def placeholder(spec):
        # Typed like the kernel's output (manual axes included), so that lax.platform_dependent
        # accepts the branch inside shard_map and the lowering is reached.
        zeros = jnp.zeros(spec.shape, spec.dtype)
        manual = getattr(spec, "manual_axis_type", None)
        axes = tuple(sorted(manual.varying)) if manual is not None else ()
        if axes:
            zeros = lax.pcast(zeros, axes, to="varying")
        return _unsupported_p.bind(zeros, message=message)

    def unsupported(*args, **kwargs):
        return jax.tree.map(placeholder, jax.eval_shape(functools.partial(fn, **kwargs), *args))

    return unsupported


def _per_platform(tpu: Callable, cuda: Callable, default: Callable) -> Callable:
    def wrapped(*args, **kwargs):
        return lax.platform_dependent(*args, tpu=functools.partial(tpu, **kwargs),
                                      cuda=functools.partial(cuda, **kwargs),
                                      default=functools.partial(default, **kwargs))
    return wrapped


def resolve(backend: str) -> RowOps:
    """The RowOps for a backend name; raises ValueError for an unknown name."""
    if backend == "xla":
        return XLA
    if backend == "interpret":
        return _pallas_ops(kernels.penalty_tpu, True)
    if backend == "tpu-interpret":
        return _pallas_ops(kernels.penalty_tpu, pltpu.InterpretParams())
    if backend == "gpu-interpret":
        return _pallas_ops(penalty_gpu, True)
    tpu, gpu = _pallas_ops(kernels.penalty_tpu, False), _pallas_ops(penalty_gpu, False)
    if backend == "pallas":
        return RowOps(*(_per_platform(t, g, _unsupported(t, backend)) for t, g in zip(tpu, gpu)))
    if backend == "auto":  # CUDA stays on XLA until the Triton kernel has been timed on a GPU
        return RowOps(*(_per_platform(t, x, x) for t, x in zip(tpu, XLA)))
    raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def resolve_for(backend: str, *arrays) -> RowOps:
    """The RowOps for ``backend`` on these operands: float64 runs on XLA (the kernels accumulate in
    float32), which ``"auto"`` and ``"xla"`` allow and the kernel backends refuse."""
    wide = [a.dtype for a in arrays if jnp.dtype(a.dtype).itemsize > 4]
    if not wide:
        return resolve(backend)
    if backend in ("auto", "xla"):
        return XLA
    raise ValueError(f"backend={backend!r} runs kernels that accumulate in float32, but the "
                     f"input has dtype {wide[0]}; use backend='auto' or 'xla' for float64, or "
                     f"cast to float32")


__all__ = ["BACKENDS", "NORM_ROW", "PENALTY_ROW", "RowOps", "SUM_ROW", "XLA", "resolve", "resolve_for"]
