"""benchmarks/attention/sequence_tpu.py's capacity search: the largest global batch that fits,
to a multiple of the data axis.

The compiler is replaced by a model chip (a batch fits when it is at most ``limit``, else
RESOURCE_EXHAUSTED), so the search itself is checked wherever the limit lies."""

from typing import Any

import pytest

from benchmarks.attention import sequence_tpu
from fastgp._measure import compiled as compiled

HBM = compiled.CHIPS[sequence_tpu.GENERATION].hbm_bytes


class Budget:
    def left(self):
        return 1.0


def model_chip(monkeypatch, limit, per_sample):
    """Batches up to ``limit`` fit, each sample ``per_sample`` bytes; returns the batches
    compiled."""
    compiled_batches = []

    def compile_record(records, tokens, shards, batch, kind, budget, scheme="all-gather"):
        found = sequence_tpu.find(records, tokens, shards, batch, kind, scheme)
        if found is not None:
            return found
        compiled_batches.append(batch)
        fits = batch <= limit
        record = dict(
            topology=sequence_tpu.TOPOLOGY,
            tokens=tokens,
            shards=shards,
            batch=batch,
            kind=kind,
            scheme=scheme,
            fits=fits,
            peak=per_sample * batch if fits else None,
            error="" if fits else "RESOURCE_EXHAUSTED: Ran out of memory on HBM",
        )
        records.append(record)
        return record

    monkeypatch.setattr(sequence_tpu, "compile_record", compile_record)
    return compiled_batches


@pytest.mark.parametrize("measured_one_per_shard", [True, False])
@pytest.mark.parametrize("shards", [4, 16])
@pytest.mark.parametrize("limit_in_data", [1, 3, 17, 18, 23, 64])
def test_the_search_finds_the_largest_batch_to_the_data_axis(
    monkeypatch, shards, limit_in_data, measured_one_per_shard
):
    """With the table's record of one sample per data shard on file the search starts from the
    power of two its peak suggests; without, from the data axis."""
    data = 16 // shards
    limit = limit_in_data * data
    made = model_chip(monkeypatch, limit, per_sample=HBM / (limit + 0.5))
    records: list[dict[str, Any]] = []
    if measured_one_per_shard:
        sequence_tpu.compile_record(records, 65536, shards, data, "r1", Budget(), "ring")
        made.clear()
    fit, over = sequence_tpu.largest_batch(records, 65536, shards, "r1", 20, Budget(), "ring")
    assert (fit, over) == (limit, limit + data), made
    assert all(b % data == 0 for b in made) and len(made) == len(set(made))


def test_the_search_stops_at_its_compile_budget(monkeypatch):
    """Three compiles from 32 (one sample per shard measured): 32 and 64 fit, 128 does not; the
    bisection that would find 76 is not started."""
    made = model_chip(monkeypatch, 76, per_sample=HBM / 76.5)
    records: list[dict[str, Any]] = []
    sequence_tpu.compile_record(records, 65536, 4, 4, "r1", Budget(), "ring")
    made.clear()
    assert sequence_tpu.largest_batch(records, 65536, 4, "r1", 3, Budget(), "ring") == (64, 128)
    assert made == [32, 64, 128]
