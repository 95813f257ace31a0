"""Workarounds for the Pallas interpret modes that run the kernels on CPU (JAX 0.10.2).

Two limits of interpret mode, and what fastgp does about each:

* Generic Pallas interpret mode (``backend="interpret"``, and ``"gpu-interpret"``) cannot trace
  inside ``shard_map(check_vma=True)``: its while-loop carry loses the manual axis types. TPU
  interpret mode (``"tpu-interpret"``) can. :func:`check_backend_for_manual_axes` turns the deep
  JAX error into a ValueError that names the working alternative.
* Interpret-mode kernels call back into JAX from a host thread; dispatching more work while those
  callbacks run can deadlock the CPU client (seen with 4 CPU devices). :func:`blocking` wraps a
  jitted function so that, for interpret backends, every call waits for its result.
"""

from collections.abc import Callable, Collection
from typing import Any, TypeVar, cast

import jax

from fastgp._typing import Backend

INTERPRET_BACKENDS: tuple[Backend, ...] = ("interpret", "tpu-interpret", "gpu-interpret")
NOT_IN_SHARD_MAP: tuple[Backend, ...] = ("interpret", "gpu-interpret")


def check_backend_for_manual_axes(backend: Backend, manual_axes: Collection[str]) -> None:
    """Raise a ValueError if ``backend`` cannot run on data that varies over ``manual_axes``."""
    if manual_axes and backend in NOT_IN_SHARD_MAP:
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


__all__ = ["INTERPRET_BACKENDS", "blocking", "check_backend_for_manual_axes"]
