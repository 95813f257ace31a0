"""Wall-clock timing of several zero-argument calls, interleaved round by round in one run.

    interleaved_times(calls, rounds=20, warmup=2) -> {name: [rounds per-call seconds]}

Machines are shared and noisy, so paths are only ever compared as ratios within one run, and
each round calls every path once in an order that rotates from round to round: load from other
processes and slow drifts then hit every path alike.
"""

import time
from collections.abc import Callable, Mapping
from typing import Any


def interleaved_times(
    calls: Mapping[str, Callable[[], Any]], *, rounds: int = 20, warmup: int = 2
) -> dict[str, list[float]]:
    """Per-call seconds, {name: [rounds floats]}, each round calling every path once.

    ``calls`` must block until their results are ready (``jax.block_until_ready``). Every call
    is first run ``warmup`` times untimed (the first compiles)."""
    if rounds < 1 or warmup < 1:
        raise ValueError(
            f"need rounds >= 1 and warmup >= 1 (the first call compiles), got "
            f"rounds={rounds}, warmup={warmup}"
        )
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


__all__ = ["interleaved_times"]
