"""The Pallas GPU backends this JAX ships, and fastgp's GPU kernel modules, imported on first use.

    has_triton() -> bool            ``jax.experimental.pallas.triton`` imports
    has_mosaic_gpu() -> bool        ``jax.experimental.pallas.mosaic_gpu`` exports ``kernel`` and
                                    ``InterpretGPUParams`` (the API the Mosaic kernel is written
                                    and checked with: JAX 0.11 and later)
    mosaic_gpu_runs(device) -> bool  the Mosaic GPU kernel runs there (the API, Hopper or newer)
    penalty_kernel(device) -> "triton", "mosaic_gpu" or None: the penalty's GPU kernel for the
                                    traced device (None: neither backend runs it)
    gpu_kernels_run(op, device) -> bool   whether ``op``'s GPU kernels run there
    triton_penalty(), triton_attention(), mosaic_penalty()
                                 -> the kernel modules; ValueError (``missing_triton``) where the
                                    backend is missing
    deprecation_once(x) -> x        on a Triton kernel's operand: JAX's deprecation shown once
    missing_triton(what) -> str     the error: what is missing, and the ways out
    note_auto_without_triton()      the one warning "auto" gives when it falls back to XLA

Why on first use: JAX deprecates its Pallas Triton backend since 0.11 and will remove it, and
``fastgp.kernels.penalty.gpu`` and ``fastgp.kernels.attention.gpu`` import it; ``import fastgp``
must not. The penalty's Mosaic GPU kernel runs where Triton is gone, on Hopper (sm_90) and
newer, Mosaic GPU's target; while JAX ships Triton, the Triton kernel, which has run on a GPU,
stays the one ``"pallas"`` runs.

JAX's deprecation is a DeprecationWarning at every lowering of a Triton kernel. It is raised while
the caller's program is lowered, after fastgp's functions have returned, so no
``warnings.catch_warnings`` around fastgp's calls can hold it. Instead fastgp passes each Triton
kernel's operand through :func:`deprecation_once`, whose lowering, just before the kernel's, puts
one filter first in the warnings filters, matched on that message alone, with action "once":
JAX's warning is shown the first time and not repeated while the filters stay as they are (a
``warnings.catch_warnings`` block, as pytest opens around each test, resets what Python remembers
as shown); no other warning is touched.
"""

import functools
import importlib
import warnings
from types import ModuleType
from typing import Any, Literal

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

GpuKernel = Literal["mosaic_gpu", "triton"]

JAX_TRITON_DEPRECATION = "The Pallas Triton backend is deprecated"
_ONCE = ("once", JAX_TRITON_DEPRECATION, DeprecationWarning)
MOSAIC_GPU_MIN_MAJOR = 9  # Hopper
ON_GPU = "backend='auto' or 'xla' (XLA on the GPU)"  # what runs on a GPU without Triton


def _imports(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


@functools.cache
def has_triton() -> bool:
    """Whether this JAX ships Pallas's Triton backend (``jax.experimental.pallas.triton``)."""
    return _imports("jax.experimental.pallas.triton") is not None


@functools.cache
def has_mosaic_gpu() -> bool:
    """Whether this JAX's ``jax.experimental.pallas.mosaic_gpu`` has the public ``kernel`` and
    GPU interpret mode (``InterpretGPUParams``) that fastgp's Mosaic GPU kernel is checked with."""
    module = _imports("jax.experimental.pallas.mosaic_gpu")
    return module is not None and all(
        hasattr(module, name) for name in ("kernel", "InterpretGPUParams")
    )


def mosaic_gpu_runs(device: Any) -> bool:
    """Whether the penalty's Mosaic GPU kernel runs on ``device`` under this JAX: Mosaic GPU's API
    (:func:`has_mosaic_gpu`) and a Hopper or newer GPU. A device that reports no compute
    capability (an abstract device, a lowering from a host with no GPU) is taken as Mosaic GPU
    takes it: sm_90."""
    major = str(getattr(device, "compute_capability", "")).split(".")[0]
    return has_mosaic_gpu() and (not major.isdigit() or int(major) >= MOSAIC_GPU_MIN_MAJOR)


def penalty_kernel(device: Any) -> GpuKernel | None:
    """The penalty's GPU kernel on ``device`` under this JAX: Triton where this JAX still ships it
    (the kernel run and checked on a GPU), else Mosaic GPU where this JAX has it and the device is
    Hopper or newer (checked in GPU interpret mode and lowered for CUDA, not yet run on a GPU),
    else None."""
    if has_triton():
        return "triton"
    return "mosaic_gpu" if mosaic_gpu_runs(device) else None


def gpu_kernels_run(op: str, device: Any) -> bool:
    """Whether ``op``'s GPU kernels run on ``device`` under this JAX: attention's are Triton
    kernels, the penalty's Mosaic GPU or Triton (:func:`penalty_kernel`)."""
    return has_triton() if op == "attention" else penalty_kernel(device) is not None


def missing_triton(what: str, instead: str = ON_GPU) -> str:
    """The message of the error raised where ``what`` needs Pallas's Triton backend; ``instead``
    names the backends that run without it."""
    return (
        f"{what} needs Pallas's Triton backend, which this JAX does not ship "
        f"(jax.experimental.pallas.triton does not import: JAX deprecated it in 0.11 in favour "
        f"of Mosaic GPU and removes it). Use {instead}, or a JAX that still ships "
        f"jax.experimental.pallas.triton."
    )


def _show_jax_deprecation_once() -> None:
    first = warnings.filters[0] if warnings.filters else None
    if first is None or (first[0], getattr(first[1], "pattern", None), first[2]) != _ONCE:
        warnings.filterwarnings("once", message=JAX_TRITON_DEPRECATION, category=DeprecationWarning)


_once_p = Primitive("fastgp_jax_triton_deprecation_once")
_once_p.def_abstract_eval(lambda x: x)
_once_p.def_impl(lambda x: x)
ad.primitive_jvps[_once_p] = lambda primals, tangents: (_once_p.bind(primals[0]), tangents[0])
batching.primitive_batchers[_once_p] = lambda args, dims: (_once_p.bind(args[0]), dims[0])


def _lower_once(ctx: Any, x: Any) -> list[Any]:
    _show_jax_deprecation_once()
    return [x]


# Uncached: the filter is put in place at every lowering, each perhaps under other filters.
mlir.register_lowering(_once_p, _lower_once, cacheable=False)


def deprecation_once(x: jax.Array) -> jax.Array:
    """``x``, in a program whose lowering makes JAX's Triton deprecation show once: pass a Triton
    kernel's operand through it (its lowering precedes the kernel's, which reads its result)."""
    return _once_p.bind(x)


def _triton_module(module: str, what: str) -> ModuleType:
    if not has_triton():
        raise ValueError(missing_triton(what))
    return importlib.import_module(module)


def triton_penalty() -> ModuleType:
    """``fastgp.kernels.penalty.gpu``; ValueError without Pallas Triton."""
    return _triton_module("fastgp.kernels.penalty.gpu", "the penalty's GPU (Triton) kernel")


def triton_attention() -> ModuleType:
    """``fastgp.kernels.attention.gpu``; ValueError without Pallas Triton."""
    return _triton_module("fastgp.kernels.attention.gpu", "attention's GPU (Triton) kernels")


def mosaic_penalty() -> ModuleType:
    """``fastgp.kernels.penalty.mosaic_gpu``; ValueError where :func:`has_mosaic_gpu` is False."""
    if not has_mosaic_gpu():
        raise ValueError(
            "the penalty's Mosaic GPU kernel needs jax.experimental.pallas.mosaic_gpu with "
            "kernel and InterpretGPUParams (JAX 0.11 or later); this JAX lacks them. Use the "
            "Triton kernel (fastgp.kernels.penalty.gpu) or backend='xla'."
        )
    return importlib.import_module("fastgp.kernels.penalty.mosaic_gpu")


@functools.cache
def note_auto_without_triton() -> None:
    """Warn, once a process, that ``backend="auto"`` runs XLA on this GPU for want of Triton."""
    warnings.warn(
        "fastgp: backend='auto' runs XLA on this GPU where it would run fastgp's GPU kernels: "
        "they need Pallas's Triton backend, which this JAX does not ship "
        "(jax.experimental.pallas.triton does not import). A JAX that still ships it runs them.",
        UserWarning,
        stacklevel=2,
    )


__all__ = [
    "GpuKernel",
    "JAX_TRITON_DEPRECATION",
    "deprecation_once",
    "gpu_kernels_run",
    "has_mosaic_gpu",
    "has_triton",
    "missing_triton",
    "mosaic_gpu_runs",
    "mosaic_penalty",
    "note_auto_without_triton",
    "penalty_kernel",
    "triton_attention",
    "triton_penalty",
]
