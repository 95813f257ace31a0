"""Benchmark set-up: CPU JAX, warm jitted functions, explicit rounds so the suite's run time is
fixed.

Each benchmark belongs to a ``benchmark.group`` holding every path compared in it; the path that the
others are compared with carries ``extra_info["baseline"] = True`` (see ``report.py``).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import time

import jax
import numpy as np
import pytest

TARGET_ROUND_S = 0.02  # tiny functions repeat inside a round until a round takes about this long


def _calibrate(call, limit_s=TARGET_ROUND_S):
    start = time.perf_counter()
    call()
    elapsed = time.perf_counter() - start
    return max(1, min(1000, int(limit_s / max(elapsed, 1e-7))))


@pytest.fixture
def bench(benchmark):
    """``bench(fn, *args, group=, path=, baseline=False, rounds=)``: time a jitted ``fn`` warm.

    Compiles and runs once (not timed), then ``rounds`` timed rounds of ``iterations`` calls each,
    every call blocked until ready.
    """

    def run(fn, *args, group, path, baseline=False, rounds=10, **info):
        call = lambda: jax.block_until_ready(fn(*args))
        call()  # compile + first run
        iterations = _calibrate(call)
        benchmark.group = group
        benchmark.extra_info.update(
            path=path, baseline=baseline, loadavg_1m=os.getloadavg()[0], **info
        )
        return benchmark.pedantic(call, rounds=rounds, iterations=iterations, warmup_rounds=1)

    return run


@pytest.fixture
def paired(benchmark):
    """``paired(paths, group=, baseline=, rounds=)``: time several paths interleaved.

    ``paths`` maps a path name to a zero-argument callable that blocks until its result is ready;
    ``calls`` (an int or "auto") repeats each callable that many times per sample.
    Every path is warmed (compiled and run twice), then each round calls every path once, in an
    order that rotates from round to round, so load from other processes and slow drifts hit all
    paths alike. The pytest-benchmark statistics are those of a whole round; the per-path samples,
    medians, IQRs, ratios of medians to ``baseline`` and medians of per-round ratios go to
    ``extra_info`` (rendered by ``report.py``).
    """

    def run(paths, *, group, baseline, rounds=10, calls=1, **info):
        names = list(paths)
        for name in names:
            paths[name]()
            paths[name]()
        if calls == "auto":  # repeat tiny calls so that one sample takes about TARGET_ROUND_S
            calls = _calibrate(paths[baseline], TARGET_ROUND_S / 2)
        if calls > 1:
            single = dict(paths)
            paths = {n: (lambda f=f: [f() for _ in range(calls)]) for n, f in single.items()}
            info["steps_per_call"] = calls
        samples = {name: [] for name in names}
        state = {"round": 0}

        def one_round():
            r = state["round"]
            state["round"] += 1
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                paths[name]()
                samples[name].append(time.perf_counter() - start)

        load_before = os.getloadavg()[0]
        benchmark.group = group
        benchmark.pedantic(one_round, rounds=rounds, iterations=1)
        base = np.asarray(samples[baseline])
        benchmark.extra_info.update(
            path="paired",
            baseline_path=baseline,
            loadavg_1m=[load_before, os.getloadavg()[0]],
            samples_s=samples,
            median_s={n: float(np.median(s)) for n, s in samples.items()},
            iqr_s={
                n: [float(np.percentile(s, 25)), float(np.percentile(s, 75))]
                for n, s in samples.items()
            },
            ratio_of_medians={n: float(np.median(s) / np.median(base)) for n, s in samples.items()},
            paired_ratio={n: float(np.median(np.asarray(s) / base)) for n, s in samples.items()},
            **info,
        )
        return samples

    return run
