"""Kernel launch settings per GPU, from the table the device sweep writes.

    attention_launch(pass_name, head_dim) -> Launch     the pass's tile edge, warps and stages
    penalty_programs() -> int                          programs that fill the traced GPU

The table is ``fastgp/tuned/gpu.json``: ``{device kind: {"attention": {pass: {head dim:
{"block": b, "num_warps": w, "num_stages": s}}}, "penalty": {"programs_per_sm": p}}}``, as
``python -m benchmarks.gpu.sweep`` writes it on the device (``benchmarks/gpu/check.sh``). A device
or entry the table does not name, and a lowering for no GPU (``jax.export`` from a CPU host,
interpret mode), take the defaults: the settings the kernels ran with before any sweep.
"""

import dataclasses
import functools
import json
from importlib import resources
from typing import Any

from fastgp import _backends as backends
from fastgp.kernels.attention import gpu_tiling

DEFAULT_SMS = 132  # an H100's or H200's, for a lowering that names no GPU
DEFAULT_PROGRAMS_PER_SM = 4


@dataclasses.dataclass(frozen=True)
class Launch:
    """A Triton attention kernel's largest tile edge (a power of two), warps and stages; by
    default the kernels' own."""

    block: int = gpu_tiling.MAX_BLOCK
    num_warps: int = gpu_tiling.NUM_WARPS
    num_stages: int = gpu_tiling.NUM_STAGES


@functools.cache
def table() -> dict[str, Any]:
    """The tuned table, {device kind: settings} (see the module)."""
    text = resources.files("fastgp").joinpath("tuned", "gpu.json").read_text()
    return dict(json.loads(text))


def _device() -> Any:
    """The traced device, or None when it is not a GPU."""
    device = backends.traced_device()
    return device if device.platform == "gpu" else None


def _settings(op: str) -> dict[str, Any]:
    device = _device()
    return {} if device is None else dict(table().get(device.device_kind, {}).get(op, {}))


def attention_launch(pass_name: str, head_dim: int) -> Launch:
    """The tuned launch of attention's ``pass_name`` at this (padded) head dim, else the default."""
    found = _settings("attention").get(pass_name, {}).get(str(head_dim))
    return Launch(**found) if found else Launch()


def penalty_programs() -> int:
    """Programs the norm kernel's grid should reach: the traced GPU's multiprocessors (an H100's
    when it names none) times the tuned programs per multiprocessor. A GPU device counts them in
    ``core_count``, an abstract one (``jax.sharding.AbstractDevice``) in ``num_cores``."""
    device = _device()
    sms = getattr(device, "core_count", None) or getattr(device, "num_cores", None) or DEFAULT_SMS
    return int(sms) * int(_settings("penalty").get("programs_per_sm", DEFAULT_PROGRAMS_PER_SM))


__all__ = ["Launch", "attention_launch", "penalty_programs", "table"]
