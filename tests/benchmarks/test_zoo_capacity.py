"""benchmarks/zoo/tpu.py's capacity search: the largest fitting batch, pinned to its resolution.

The compiler is replaced by a model chip (a batch fits when its peak memory is within HBM), so
the search itself is checked: wherever the limit lies, whatever the prediction's error."""

import pytest

from benchmarks.zoo import tpu as zoo_tpu
from fastgp._measure import compiled as compiled

HBM = compiled.CHIPS["v5e"].hbm_bytes


def model_chip(monkeypatch, limit, fixed, curve=0.0, flat_below=0):
    """A chip on which batches up to ``limit`` fit; peak memory ``fixed + b * batch`` bends by
    ``curve`` (relative) so that the affine prediction from two small batches is off, and stays
    ``fixed + b * flat_below`` below ``flat_below`` (buffers the compiler sizes for a minimum)."""
    per_sample = (HBM - fixed) / limit

    def compile_step(cache, generation, spec, variant, batch):
        found = cache.get(generation, spec.name, variant, batch)
        if found is not None:
            return found
        peak = fixed + per_sample * max(batch, flat_below) * (1 + curve * batch / limit)
        record = dict(
            generation=generation,
            critic=spec.name,
            variant=variant,
            batch=batch,
            fits=batch <= limit,
            peak=int(peak),
        )
        cache.add(record)
        return record

    monkeypatch.setattr(zoo_tpu, "compile_step", compile_step)


@pytest.mark.parametrize(
    ("limit", "fixed", "curve", "flat_below"),
    [
        (1000, 2**30, 0.0, 0),  # the prediction is right
        (1000, 2**30, 0.3, 0),  # it overshoots: memory grows faster than affine
        (1000, 2**30, -0.3, 0),  # it undershoots
        (40, 2**33, 0.0, 0),  # twice the zoo batch does not fit
        (20, 2**33, 0.0, 0),  # the zoo batch itself does not fit
        (123_457, 2**28, 0.1, 0),
        (17_000, 2**26, 0.0, 500),  # the peak is flat from the zoo batch to twice it
    ],
)
def test_the_search_brackets_the_limit_within_its_resolution(
    monkeypatch, tmp_path, limit, fixed, curve, flat_below
):
    model_chip(monkeypatch, limit, fixed, curve, flat_below)
    spec = zoo_tpu.zoo.ZOO_TPU["dcgan32"]._replace(batch=32)
    cache = zoo_tpu.Cache(tmp_path / "compiles.json")
    lo, hi, probes = zoo_tpu.largest_batch(cache, "v5e", spec, "naive", resolution=0.02)
    assert lo <= limit < hi  # lo fits, hi does not
    assert hi - lo <= max(zoo_tpu.MULTIPLE, 0.02 * lo)
    assert lo % zoo_tpu.MULTIPLE == 0 and hi % zoo_tpu.MULTIPLE == 0
    assert len(probes) <= 16


def test_the_bracket_on_record_is_the_search_s(monkeypatch, tmp_path):
    """``capacity --cached`` tabulates what a finished search found, compiling nothing."""
    model_chip(monkeypatch, 1000, 2**30, 0.3)
    spec = zoo_tpu.zoo.ZOO_TPU["dcgan32"]._replace(batch=32)
    cache = zoo_tpu.Cache(tmp_path / "compiles.json")
    assert zoo_tpu.bracket_from_cache(cache, "v5e", spec, "naive") is None
    lo, hi, probes = zoo_tpu.largest_batch(cache, "v5e", spec, "naive", resolution=0.02)
    monkeypatch.setattr(zoo_tpu, "compile_step", None)  # any compile would fail
    on_record = zoo_tpu.bracket_from_cache(
        zoo_tpu.Cache(tmp_path / "compiles.json"), "v5e", spec, "naive"
    )
    assert on_record[:2] == (lo, hi) and sorted(on_record[2]) == sorted(set(probes))
