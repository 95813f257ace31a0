"""Figures read from a program compiled ahead of time for a TPU (libtpu's compile-only client).

    tpu_device(generation)          -> a device of a small topology of that generation
    tpu_devices(topology)           -> every compile-only device of a topology ("v5p:2x2x2")
    compile_for(device, fn, *args)  -> the compiled program of ``jax.jit(fn)`` on that device
    figures(compiled)               -> dict: flops, bytes, copies, async copies, memory, kernel
    count_copies(hlo_text)          -> {"copy": n, "copy-start": m} outside fused computations

``flops`` and ``bytes`` are XLA's cost analysis ("flops", "bytes accessed": every top-level op's
operands and results; a Mosaic call counts what its ``pl.CostEstimate`` declares). ``copies``
counts ``copy`` instructions that run as ops of their own (relayouts, and moves between memory
spaces), not the ``copy`` roots of fusions, which are part of a fused loop; ``async_copies``
counts ``copy-start``, the asynchronous prefetches that memory-space assignment schedules.
``argument``, ``output``, ``alias`` and ``temp`` are the memory analysis' sizes in bytes.
``kernel``: the program contains a Mosaic (Pallas TPU) custom call.
"""

import functools
import re

import jax
from jax.experimental import topologies

TOPOLOGIES = {
    "v4": "v4:2x2x1",
    "v5e": "v5e:2x2",
    "v5p": "v5p:2x2x1",
    "v6e": "v6e:2x2",
    "7x": "TPU7x:2x2x1",
}

_COMPUTATION = re.compile(r"^(?:ENTRY )?(%[\w.\-]+) .*\{\s*$")
_CALLED = re.compile(r"calls=(%[\w.\-]+)")
_COPY = re.compile(r" (copy|copy-start)\(%")


@functools.cache
def tpu_devices(topology: str) -> tuple:
    return tuple(topologies.get_topology_desc(topology, "tpu").devices)


def tpu_device(generation: str):
    return tpu_devices(TOPOLOGIES[generation])[0]


def compile_for(device, fn, *args):
    """``jit(fn)`` lowered for ``args`` (arrays or ShapeDtypeStructs) on ``device``, compiled."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.jit(fn, in_shardings=sharding).lower(*args).compile()


def count_copies(hlo_text: str) -> dict:
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


def figures(compiled) -> dict:
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
        argument=int(memory.argument_size_in_bytes),
        output=int(memory.output_size_in_bytes),
        alias=int(memory.alias_size_in_bytes),
        temp=int(memory.temp_size_in_bytes),
    )
