"""Backend names, what ``"auto"`` means for each op, and the interpret modes' translation.

    resolve(op, backend)   -> the concrete backend a call runs ("auto" resolved; ValueError for
                              a name the op does not know)
    platform()             -> "cpu", "tpu", "cuda" or "rocm": what "auto" is chosen for, the
                              platform of the device traced for (traced_device())
    interpret_mode(name)   -> the ``interpret=`` argument of a Pallas kernel call
    generation(name)       -> the TPU generation a kernel backend tiles for (None: unknown)

``"auto"`` is :data:`AUTO`'s choice for the op on the platform being traced for
(:func:`platform`), XLA where it names none; the figures behind each choice are in
docs/performance.md ("What auto runs"). Inside :func:`attention_backend` it means another backend
for attention only (how ``fastgp.autotune`` tries attention backends in a critic it does not own).

Two limits of Pallas interpret mode (JAX 0.10.2) on CPU, and what fastgp does about each:

* generic interpret mode (``"interpret"``, ``"gpu-interpret"``) cannot trace inside
  ``shard_map(check_vma=True)``: its while-loop carry loses the manual axis types; TPU interpret
  mode can. :func:`check_backend_for_manual_axes` turns the deep JAX error into one naming it.
* interpret-mode kernels call back into JAX from a host thread; dispatching more work while those
  callbacks run can deadlock the CPU client. :func:`blocking` makes every call wait its result.
"""

import contextlib
import contextvars
from collections.abc import Callable, Collection, Iterator
from typing import Any, Literal, TypeAlias, TypeVar, cast, get_args

import jax
import jax.extend
from jax.experimental.pallas import tpu as pltpu

from fastgp._gpu import pallas as pallas_gpu
from fastgp._typing import Backend

Op: TypeAlias = Literal["penalty", "attention"]

BACKENDS: tuple[Backend, ...] = get_args(Backend)
INTERPRET_BACKENDS: tuple[Backend, ...] = ("interpret", "tpu-interpret", "gpu-interpret")
KERNEL_BACKENDS: tuple[Backend, ...] = ("pallas", *INTERPRET_BACKENDS)
OP_BACKENDS: dict[Op, tuple[Backend, ...]] = {"penalty": BACKENDS, "attention": BACKENDS}
_CALLER: dict[Op, str] = {"penalty": "fastgp", "attention": "fastgp.attention"}
_NOT_IN_SHARD_MAP: tuple[Backend, ...] = ("interpret", "gpu-interpret")
GPU_PLATFORMS = ("cuda", "rocm")

# Per op, the platforms (as :func:`platform` names them) where "auto" is not XLA (figures:
# docs/performance.md, "What auto runs"). The penalty's kernels do not beat XLA's fused reduction
# in the zoo's compiled steps, nor its bandwidth on a GPU at large rows. Attention's Mosaic kernels
# keep each score tile in VMEM where XLA's loops write every tile to HBM; its Triton kernels were
# checked and timed on an NVIDIA GPU, and not on an AMD one.
AUTO: dict[Op, dict[str, Backend]] = {
    "penalty": {},
    "attention": {"tpu": "pallas", "cuda": "pallas"},
}

_attention_auto: contextvars.ContextVar[Backend | None] = contextvars.ContextVar(
    "fastgp_attention_auto", default=None
)


def check_name(op: Op, backend: str) -> Backend:
    """``backend`` itself if ``op`` has it; else a ValueError listing the op's backends."""
    if backend not in OP_BACKENDS[op]:
        raise ValueError(
            f"{_CALLER[op]}: unknown backend {backend!r}; expected one of {OP_BACKENDS[op]}"
        )
    return backend


def auto_backend(op: Op, platform: str) -> Backend:
    """The backend ``backend="auto"`` runs for ``op`` ("penalty" or "attention") on ``platform``
    ("cpu", "tpu", "cuda", "rocm"): :data:`AUTO`'s kernel choice there, else XLA. ValueError for
    an unknown op. (Where a call's operands or the GPU's JAX cannot run that choice's kernels,
    :func:`resolve` runs XLA instead.)"""
    if op not in AUTO:
        raise ValueError(f"fastgp: unknown op {op!r}; expected one of {tuple(AUTO)}")
    return AUTO[op].get(platform, "xla")


def resolve(op: Op, backend: str, kernels_run_here: Callable[[], bool] = lambda: True) -> Backend:
    """The backend that ``op`` runs for ``backend``: ``"auto"`` resolved here and nowhere else.

    ``kernels_run_here()``: whether the op's kernels can run on this call's operands as they are
    sharded; where they cannot, "auto" runs XLA instead of :data:`AUTO`'s kernels. On a GPU whose
    kernels this JAX cannot run (no Pallas Triton), "auto" runs XLA and says so once
    (``fastgp._gpu.pallas.note_auto_without_triton``); ``"gpu-interpret"`` there raises a
    ValueError naming what is missing."""
    backend = check_name(op, backend)
    if backend == "gpu-interpret" and not pallas_gpu.has_triton():
        raise ValueError(
            pallas_gpu.missing_triton(
                f"{_CALLER[op]}(backend='gpu-interpret'), the GPU kernels in interpret mode,",
                "backend='interpret' or 'tpu-interpret' (the TPU kernels on CPU), or 'xla'",
            )
        )
    if backend != "auto":
        return backend
    chosen = _attention_auto.get() if op == "attention" else None
    if chosen is not None:
        return chosen
    here = platform()
    platform_choice = auto_backend(op, here)
    if platform_choice == "xla" or not kernels_run_here():
        return "xla"
    if here in GPU_PLATFORMS and not pallas_gpu.gpu_kernels_run(op, traced_device()):
        pallas_gpu.note_auto_without_triton()
        return "xla"
    return platform_choice


def platform() -> str:
    """The platform being traced for, named as ``lax.platform_dependent`` names it: "cpu", "tpu",
    or a GPU by its vendor's stack, "cuda" or "rocm". That of :func:`traced_device`; an abstract
    GPU (``jax.sharding.AbstractDevice``, a lowering from a host with no GPU) has no client to
    ask, and is named by its kind as JAX's GPU lowerings name it (AMD's "gfx..." is ROCm)."""
    device = traced_device()
    name = device.platform
    if name != "gpu":
        return str(name)
    if isinstance(device, jax.sharding.AbstractDevice):
        return "rocm" if device.device_kind.startswith(("gfx", "AMD")) else "cuda"
    version = jax.extend.backend.get_backend("gpu").platform_version.lower()
    return "rocm" if "rocm" in version else "cuda"


def traced_device() -> Any:
    """The device a function is traced for, the one Pallas tiles for: the device of the mesh set
    around the trace (``shard_map``, ``jax.set_mesh``), else JAX's default device
    (``jax.default_device``, else the first). A compile-only TPU device or mesh on a CPU host is
    a TPU here."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    if device is not None:
        return device
    default = jax.config.jax_default_device  # type: ignore[attr-defined]  # a context flag
    if isinstance(default, str):
        return jax.local_devices(backend=default)[0]
    return default if default is not None else jax.local_devices()[0]


@contextlib.contextmanager
def attention_backend(backend: str) -> Iterator[None]:
    """While tracing inside this block, ``attention(backend="auto")`` runs ``backend``: how
    ``fastgp.autotune`` tries each attention backend in a critic it does not own. It acts when a
    function is traced: a jitted function already traced keeps the backend it was traced with."""
    backend = check_name("attention", backend)
    token = _attention_auto.set(None if backend == "auto" else backend)
    try:
        yield
    finally:
        _attention_auto.reset(token)


def interpret_mode(backend: Backend) -> bool | pltpu.InterpretParams:
    """A kernel call's ``interpret=``: False (compiled), True (generic) or TPU interpret mode."""
    if backend in ("interpret", "gpu-interpret"):
        return True
    if backend == "tpu-interpret":
        return pltpu.InterpretParams()
    return False


def current_generation() -> str | None:
    """Generation of the TPU a function is traced for, else None.

    That is the device Pallas itself tiles for: the abstract mesh's device, else JAX's default
    device. So ``jax.default_device`` of a compile-only TPU device (``fastgp.measure``) tiles
    for that chip from a CPU host."""
    try:
        return str(pltpu.get_tpu_info().chip_version.value)
    except (ValueError, RuntimeError):  # not a TPU, or no device at all
        return None


def generation(backend: Backend) -> str | None:
    """The TPU generation a kernel tiles for: the device's for ``"pallas"``, else unknown (None:
    the smallest blocks of any generation, which also keeps interpret mode's programs small)."""
    return current_generation() if backend == "pallas" else None


def check_backend_for_manual_axes(backend: Backend, manual_axes: Collection[str]) -> None:
    """Raise a ValueError if ``backend`` cannot run on data that varies over ``manual_axes``."""
    if manual_axes and backend in _NOT_IN_SHARD_MAP:
        raise ValueError(
            f"backend={backend!r} (generic Pallas interpret mode) cannot run inside shard_map "
            f"(the data varies over mesh axes {tuple(sorted(manual_axes))}); use "
            f"backend='tpu-interpret' to run the TPU kernel on CPU there, or 'xla'"
        )


class _Blocking:
    """A jitted function that returns only once its result is ready (``lower`` is kept for AOT)."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn
        self.lower = fn.lower

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return jax.block_until_ready(self._fn(*args, **kwargs))


F = TypeVar("F", bound=Callable[..., Any])


def blocking(fn: F, backend: str) -> F:
    """``fn`` itself, or for an interpret backend a wrapper that waits for every result (a jitted
    ``fn``'s ``lower`` kept)."""
    return cast(F, _Blocking(fn)) if backend in INTERPRET_BACKENDS else fn


__all__ = [
    "AUTO",
    "BACKENDS",
    "GPU_PLATFORMS",
    "INTERPRET_BACKENDS",
    "KERNEL_BACKENDS",
    "OP_BACKENDS",
    "Op",
    "attention_backend",
    "auto_backend",
    "blocking",
    "check_backend_for_manual_axes",
    "check_name",
    "current_generation",
    "generation",
    "interpret_mode",
    "resolve",
]
