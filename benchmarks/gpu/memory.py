"""A compiled program's memory on the GPU it will run on, and whether it fits there.

program_bytes(compiled) -> arguments + outputs + temporaries - aliased, in bytes
device_bytes()          -> the first device's memory limit (24 GiB where it reports none)
fits(compiled)          -> the program takes at most 90 % of the device's memory
"""

from typing import Any

import jax

HEADROOM = 0.9  # of the device's memory, for the allocator's fragmentation and XLA's workspace


def program_bytes(compiled: Any) -> int:
    memory = compiled.memory_analysis()
    return int(
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
    )


def device_bytes() -> int:
    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("bytes_limit", 0)) or 24 * 2**30


def fits(compiled: Any) -> bool:
    return program_bytes(compiled) <= HEADROOM * device_bytes()
