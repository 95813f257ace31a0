"""The critic zoo (``zoo.critics.ZOO_CPU``): one whole critic step per path, interleaved round
by round.

Group ``zoo:<critic>`` times the step without the penalty (``plain``, the floor), the naive
penalty and fastgp's default, ``second_order="reverse"``, ``remat="nothing"`` and ``remat="dots"``
(``workloads.OPTIONS``); ratios are to ``naive``, also to ``plain``. Every path is compiled once
(``lower().compile()``) and that executable is timed; its program figures
(``zoo.programs.figures``: convolutions by kind, dots, transposes, copies, XLA's flops and
bytes) go to ``extra_info["programs"]``. Before timing, every penalised path's loss and parameter
gradient (Adam's first moment with b1 = 0) must equal the naive path's.

    make bench   (the zoo's groups land in bench.json with the rest; report.py writes
                  benchmarks/results/zoo/zoo_cpu.md from them)
    pytest benchmarks/suites/test_bench_zoo.py --benchmark-only --benchmark-json zoo.json
    python -m benchmarks.suites.report --merge zoo.json   (the zoo alone, merged into bench.json)
"""

import jax
import numpy as np
import pytest

from benchmarks import workloads as W
from benchmarks.zoo import critics as zoo
from benchmarks.zoo import programs as zoo_programs

# Rounds: the machine is shared, so more than the other suites' (a round of six steps takes about
# 1-3 s here; compiling the six programs takes longer than timing them).
ROUNDS = {"resnet32": 24, "dcgan32": 24, "lnconv32": 24, "stylegan2-64": 20, "vit32": 16, "mlp": 30}
GRAD_RTOL = 1e-4  # relative to the largest |gradient entry|; float32 sums in other orders


def check_against_naive(outputs):
    """Loss and parameter gradient of every penalised path equal the naive path's."""
    _, (naive_opt, *_), naive_loss = outputs["naive"]
    naive_grads = jax.tree.leaves(naive_opt.mu)
    scale = max(float(np.max(np.abs(g))) for g in naive_grads)
    for path, (_, (opt, *_), loss) in outputs.items():
        if path == "plain":
            continue
        np.testing.assert_allclose(float(loss), float(naive_loss), rtol=1e-5, err_msg=path)
        for ours, ref in zip(jax.tree.leaves(opt.mu), naive_grads, strict=True):
            error = float(np.max(np.abs(np.asarray(ours) - np.asarray(ref)))) / scale
            assert error <= GRAD_RTOL, f"{path}: parameter gradient differs by {error:.1e}"


@pytest.mark.parametrize("critic", list(zoo.ZOO_CPU))
def test_zoo_step(paired, critic):
    spec = zoo.ZOO_CPU[critic]
    args = W.inputs(spec)
    variants = zoo_programs.VARIANTS
    compiled = {v: zoo_programs.compile_step(spec, v) for v in variants}
    check_against_naive({v: jax.block_until_ready(compiled[v](*args)) for v in variants})
    paths = {v: (lambda c=compiled[v]: jax.block_until_ready(c(*args))) for v in variants}
    paired(
        paths,
        group=f"zoo:{critic}",
        baseline="naive",
        rounds=ROUNDS[critic],
        also_vs="plain",
        batch=spec.batch,
        shape=list(spec.shape),
        kind=spec.kind,
        params=zoo.param_count(spec),
        programs={v: zoo_programs.figures(compiled[v], spec.batch) for v in variants},
    )
