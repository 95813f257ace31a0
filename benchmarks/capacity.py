"""The largest batch whose program fits, found by compiling: the search behind the capacity
columns of the attention tables (TPU compile-only, sequence-parallel TPU and GPU).

    search(fits, start, *, multiple=1, cap=None, bisect=True) -> Capacity(fit, over, settled)

``fits(batch)`` compiles (or looks up) the program at ``batch`` and answers True (it fits), False
(out of memory) or None (not decided: a compile budget or deadline spent, or a compile error
other than memory). A None ends the search where it stands.
"""

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Capacity:
    """``fit``: the largest batch seen to fit (0: not even ``multiple`` does; None: none seen
    before the search stopped); ``over``: the smallest seen out of memory (None: none);
    ``settled``: the search ended by its own rule, not on an undecided probe."""

    fit: int | None
    over: int | None
    settled: bool


def search(
    fits: Callable[[int], bool | None],
    start: int,
    *,
    multiple: int = 1,
    cap: int | None = None,
    bisect: bool = True,
) -> Capacity:
    """Doubling from ``start`` while the batch fits (not past ``cap``), halving while it does not
    (not below ``multiple``); then, with ``bisect``, between the largest batch that fits and the
    smallest that does not, to a multiple of ``multiple``. Without ``bisect`` the answer is a
    power of two times ``start``, or of ``start`` halved."""
    if start < multiple or start % multiple:
        raise ValueError(f"search: start {start} is not a positive multiple of {multiple}")
    fit: int | None = None
    batch = start
    answer = fits(batch)
    while answer:
        fit = batch
        if cap is not None and 2 * batch > cap:
            return Capacity(fit, None, True)
        batch *= 2
        answer = fits(batch)
    if answer is None:
        return Capacity(fit, None, False)
    over = batch
    while fit is None:
        if batch <= multiple:
            return Capacity(0, over, True)
        batch = max(multiple, batch // 2 // multiple * multiple)
        answer = fits(batch)
        if answer is None:
            return Capacity(None, over, False)
        fit, over = (batch, over) if answer else (None, batch)
    while bisect and over - fit > multiple:
        batch = fit + (over - fit) // (2 * multiple) * multiple
        answer = fits(batch)
        if answer is None:
            return Capacity(fit, over, False)
        fit, over = (batch, over) if answer else (fit, batch)
    return Capacity(fit, over, True)
