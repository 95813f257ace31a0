"""benchmarks/capacity.py's search against a model program that fits up to ``limit`` samples,
wherever the limit lies relative to the start, the multiple and the cap."""

import itertools

import pytest

from benchmarks import capacity


def model(limit, undecided_after=None):
    """fits(batch) for a program that fits up to ``limit``; None from probe number
    ``undecided_after`` on. Returns (fits, the batches probed)."""
    probed = []

    def fits(batch):
        probed.append(batch)
        if undecided_after is not None and len(probed) > undecided_after:
            return None
        return batch <= limit

    return fits, probed


@pytest.mark.parametrize(("multiple", "start"), [(1, 1), (1, 8), (4, 4), (4, 32), (3, 12), (1, 6)])
def test_bisection_finds_the_largest_multiple_that_fits(multiple, start):
    for limit in range(0, 200):
        fits, probed = model(limit)
        found = capacity.search(fits, start, multiple=multiple)
        largest = limit // multiple * multiple
        assert found == capacity.Capacity(largest, largest + multiple, True), (limit, probed)
        assert all(b % multiple == 0 and b > 0 for b in probed), probed
        assert len(probed) == len(set(probed)), probed  # no batch compiled twice


@pytest.mark.parametrize("start", [1, 4, 8, 12])
def test_without_bisection_the_answer_is_on_the_doubling_or_halving_chain(start):
    chain = sorted({start * 2**k for k in range(10)} | {start >> k for k in range(4)} - {0})
    for limit, cap in itertools.product(range(0, 300), (None, 64)):
        fits, probed = model(limit)
        found = capacity.search(fits, start, cap=cap, bisect=False)
        within = [b for b in chain if 0 < b <= limit and (cap is None or b <= cap)]
        expected = max(within) if within else 0
        assert found.fit == expected and found.settled, (limit, cap, probed)
        doubled_to_cap = expected >= start and cap is not None and 2 * expected > cap
        over = None if doubled_to_cap else min(b for b in chain if b > expected)
        assert found.over == over, (limit, cap, found, probed)
        assert cap is None or max(probed) <= max(cap, start)


def test_an_undecided_probe_ends_the_search_where_it_stands():
    """A budget spent (None) after each number of probes: nothing is probed after it, and what
    was decided before it is returned, unsettled."""
    complete = model(50)
    capacity.search(complete[0], 8)
    for n in range(len(complete[1])):
        fits, probed = model(50, undecided_after=n)
        found = capacity.search(fits, 8)
        assert probed == complete[1][: n + 1] and not found.settled
        decided = probed[:n]
        fitting = [b for b in decided if b <= 50]
        over = [b for b in decided if b > 50]
        assert found.fit == (max(fitting) if fitting else None), (n, found)
        assert found.over == (min(over) if over else None), (n, found)


def test_a_start_off_the_multiple_is_refused():
    with pytest.raises(ValueError, match="start 6 is not a positive multiple of 4"):
        capacity.search(lambda b: True, 6, multiple=4)
