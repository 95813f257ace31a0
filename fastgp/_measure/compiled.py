"""Figures of a program compiled ahead of time for a TPU generation, from any host.

    tpu_device(generation)          -> a device of a small topology of that generation
    tpu_devices(topology)           -> every compile-only device of a topology ("v5p:2x2x2")
    lower_for(device, fn, *args)    -> the lowered program of ``jax.jit(fn)`` on that device
    compile_for(device, fn, *args)  -> the compiled program of ``jax.jit(fn)`` on that device
    figures(compiled)               -> dict: flops, bytes, copies, async copies, memory, kernels,
                                       loops
    count_copies(hlo_text)          -> {"copy": n, "copy-start": m} outside fused computations
    transfers(hlo_text)             -> each collective-permute and what runs while it is in flight
    is_out_of_memory(error)         -> whether a compile failed for want of HBM
    roofline_s(figures, generation) -> max(flops / peak flops, bytes / HBM bandwidth), seconds

The devices come from libtpu's compile-only client (``jax.experimental.topologies``; needs
``jax[tpu]``, no TPU): the real XLA:TPU and Mosaic compilers run on the host, so a program that
does not fit a chip's HBM fails to compile with ``RESOURCE_EXHAUSTED``.

``flops`` and ``bytes`` are XLA's cost analysis ("flops", "bytes accessed": every top-level op's
operands and results; a Mosaic call counts what its ``pl.CostEstimate`` declares). ``copies``
counts ``copy`` instructions that run as ops of their own (relayouts, and moves between memory
spaces), not the ``copy`` roots of fusions, which are part of a fused loop; ``async_copies``
counts ``copy-start``, the asynchronous prefetches that memory-space assignment schedules.
``argument``, ``output``, ``alias``, ``temp`` and ``peak`` are the memory analysis' sizes in bytes
(``peak``: the most HBM live at once). ``kernel``: the program contains a Mosaic custom call;
``kernels``: how many; ``loops``: its XLA ``while`` loops (a blockwise loop XLA runs op by op, not
a kernel's grid).
"""

import functools
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

TOPOLOGIES = {
    "v4": "v4:2x2x1",
    "v5e": "v5e:2x2",
    "v5p": "v5p:2x2x1",
    "v6e": "v6e:2x2",
    "7x": "TPU7x:2x2x1",
}


class Chip(NamedTuple):
    """Published per-chip figures: dense bf16 peak (FLOP/s), HBM bandwidth (B/s), HBM (bytes)."""

    peak_flops: float
    hbm_bandwidth: float
    hbm_bytes: int


GIB = 2**30
CHIPS = {  # Google Cloud's TPU system-architecture pages
    "v4": Chip(275e12, 1228e9, 32 * GIB),
    "v5e": Chip(197e12, 819e9, 16 * GIB),
    "v5p": Chip(459e12, 2765e9, 95 * GIB),
    "v6e": Chip(918e12, 1640e9, 32 * GIB),
    "7x": Chip(2307e12, 7380e9, 192 * GIB),
}

_COMPUTATION = re.compile(r"^(?:ENTRY )?(%[\w.\-]+) .*\{\s*$")
_CALLED = re.compile(r"calls=(%[\w.\-]+)")
_COPY = re.compile(r" (copy|copy-start)\(%")
# the opcode after its result shape; a long tuple shape holds "/*index=5*/" comments
_WHILE = re.compile(r"[)\]}] while\(")


def _check_generation(generation: str) -> None:
    if generation not in TOPOLOGIES:
        raise ValueError(
            f"unknown TPU generation {generation!r}; expected one of {tuple(TOPOLOGIES)}"
        )


@functools.cache
def tpu_devices(topology: str) -> tuple[Any, ...]:
    """The compile-only devices of ``topology`` (e.g. "v5e:2x2"); needs libtpu (jax[tpu])."""
    from jax.experimental import topologies

    return tuple(topologies.get_topology_desc(topology, "tpu").devices)


def tpu_device(generation: str) -> Any:
    """One compile-only device of ``generation`` (a key of ``TOPOLOGIES``)."""
    _check_generation(generation)
    return tpu_devices(TOPOLOGIES[generation])[0]


def lower_for(device: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``jit(fn)`` lowered for ``args`` (arrays or ShapeDtypeStructs) on ``device``, traced with
    ``device`` as the default device, so that the kernels tile for its generation."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    with jax.default_device(device):
        return jax.jit(fn, in_shardings=sharding).lower(*args)


def compile_for(device: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``lower_for(device, fn, *args)``, compiled."""
    return lower_for(device, fn, *args).compile()


def count_copies(hlo_text: str) -> dict[str, int]:
    """``copy`` and ``copy-start`` instructions outside the computations that fusions call."""
    fused = set(_CALLED.findall(hlo_text))
    counts, current = {"copy": 0, "copy-start": 0}, None
    for line in hlo_text.splitlines():
        match = _COMPUTATION.match(line)
        if match:
            current = match.group(1)
        elif current not in fused and (copy := _COPY.search(line)):
            counts[copy.group(1)] += 1
    return counts


class Transfer(NamedTuple):
    """One asynchronous collective-permute of a scheduled program: the computation it is in, and
    the Mosaic kernels and fusions scheduled between its start and its done."""

    computation: str
    kernels: int
    fusions: int


def transfers(hlo_text: str) -> list[Transfer]:
    """Every ``collective-permute-start`` of a compiled (scheduled) program, in program order,
    with what runs while it is in flight: the instructions between it and its ``-done``."""
    found: list[Transfer] = []
    current, body = "", list[str]()

    def scan() -> None:
        for i, line in enumerate(body):
            if " collective-permute-start(" not in line:
                continue
            name = line.split(" = ")[0].removeprefix("ROOT ")
            done = next(
                j
                for j in range(i + 1, len(body))
                if " collective-permute-done(" in body[j] and f"{name})" in body[j]
            )
            between = body[i + 1 : done]
            kernels = sum('custom_call_target="tpu_custom_call"' in b for b in between)
            fusions = sum(" fusion(" in b for b in between)
            found.append(Transfer(current, kernels, fusions))

    for line in hlo_text.splitlines():
        match = _COMPUTATION.match(line)
        if match:
            scan()
            current, body = match.group(1), []
        else:
            body.append(line.strip())
    scan()
    return found


def figures(compiled: Any) -> dict[str, Any]:
    """The cost and memory analyses of a compiled program, and its copies (see the module)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, list):
        cost = cost[0]
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    copies = count_copies(text)
    return dict(
        flops=float(cost["flops"]),
        bytes=float(cost["bytes accessed"]),
        copies=copies["copy"],
        async_copies=copies["copy-start"],
        kernel="tpu_custom_call" in text,
        kernels=text.count('custom_call_target="tpu_custom_call"'),
        loops=len(_WHILE.findall(text)),
        argument=int(memory.argument_size_in_bytes),
        output=int(memory.output_size_in_bytes),
        alias=int(memory.alias_size_in_bytes),
        temp=int(memory.temp_size_in_bytes),
        peak=int(getattr(memory, "peak_memory_in_bytes", 0)),
    )


def is_out_of_memory(error: BaseException) -> bool:
    """Whether a compile failed because the program does not fit the chip's memory."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text and ("HBM" in text or "memory" in text)


def roofline_s(program: dict[str, Any], generation: str) -> float:
    """A lower bound on the program's time on one chip: the larger of its flops at the chip's
    bf16 peak and its bytes at the chip's HBM bandwidth (``program``: :func:`figures`)."""
    _check_generation(generation)
    chip = CHIPS[generation]
    return max(program["flops"] / chip.peak_flops, program["bytes"] / chip.hbm_bandwidth)


__all__ = [
    "CHIPS",
    "TOPOLOGIES",
    "Chip",
    "Transfer",
    "compile_for",
    "count_copies",
    "figures",
    "is_out_of_memory",
    "roofline_s",
    "tpu_device",
    "tpu_devices",
    "transfers",
]
