"""fastgp's benchmarks, grouped by study; each study's results lie in results/<study>/.

    workloads.py      the critics, critic steps and penalty variants the studies share
    tables.py         the markdown tables of the reports
    published.py      the figures README.md and docs/*.md quote, rendered from results/
    suites/           the pytest-benchmark suites (`make bench`) and their report, bench.md
    zoo/              the critic zoo: its critics, their CPU programs, TPU compiles and capacity
    attention/        long-sequence ViT critic steps with flash attention, compiled for TPU
    approximate_r1/   approximate_r1 against exact R1: bias, gradients, TPU cost, training
    exactness/        what exactness buys: exact against approximate R1 trained on MNIST
    tpu/              critic steps compiled for TPU chips and meshes, and the trainer's collectives
    training/         the trainer: run times, the weight against the batch, toy tuning, multihost
    gpu/              the GPU kernels' check and bandwidth on a CUDA device

Modules import each other as ``benchmarks.<study>.<module>`` with the repository root on the
path; scripts run from the root as modules, e.g. ``python -m benchmarks.tpu.compile``.
"""

import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
