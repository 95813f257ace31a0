"""Quality along a run, scored after it from copies of its checkpoints.

    Snapshots(checkpoints, to).follow_until(proc)    copy each checkpoint as it appears
    frechet_curve(run_dir, snapshots, s_per_step)    -> [{"step", "seconds", "frechet_distance"}]

The trainer keeps its newest three checkpoints; polling every half second copies each before a
newer one evicts it. The curve's figure is the MNIST metric's Fréchet distance (the classifier's
features) over two sets of 1,000 generator samples, cheaper than the whole metric and the same
quantity as its ``frechet_distance``.
"""

import json
import pathlib
import shutil
import subprocess
import time
from typing import Any

import jax
import numpy as np

from fastgp.train.config import TrainConfig
from fastgp.train.data.quality import quality_metric
from fastgp.train.recipes.defaults import build_problem
from fastgp.train.run.checkpoints import Checkpoints
from fastgp.train.trainers.averaging import sampling_params
from fastgp.train.trainers.state import init_state

CURVE_SETS = 2


class Snapshots:
    """Copies of a run's step checkpoints, taken as they are committed."""

    def __init__(self, checkpoints: pathlib.Path, to: pathlib.Path) -> None:
        self.checkpoints, self.to = checkpoints, to
        to.mkdir(parents=True, exist_ok=True)

    def _copy_new(self) -> None:
        if not self.checkpoints.is_dir():
            return
        for step_dir in self.checkpoints.iterdir():
            digest = step_dir / "fastgp-digest.json"  # written last: the checkpoint is whole
            target = self.to / step_dir.name
            if step_dir.name.isdigit() and digest.exists() and not target.exists():
                try:
                    shutil.copytree(step_dir, target)
                except (FileNotFoundError, shutil.Error):  # evicted while copying
                    shutil.rmtree(target, ignore_errors=True)

    def follow_until(self, proc: subprocess.Popen) -> None:
        """Copy checkpoints until ``proc`` ends."""
        while proc.poll() is None:
            self._copy_new()
            time.sleep(0.5)
        self._copy_new()


def frechet_curve(
    run_dir: pathlib.Path, snapshots: pathlib.Path, seconds_per_step: float
) -> list[dict[str, Any]]:
    """The Fréchet distance of the generator at each snapshot, at step x ``seconds_per_step``."""
    run = json.loads((run_dir / "run.json").read_text())
    config = TrainConfig(**{**run["config"], "betas": tuple(run["config"]["betas"])})
    problem = build_problem("mnist", config)
    template = init_state(config, problem.generator, problem.critic)
    metric = quality_metric("mnist")
    store = Checkpoints(snapshots)
    sample = jax.jit(problem.generator.apply)
    z = jax.random.normal(
        jax.random.PRNGKey(10_000), (CURVE_SETS * metric.n_samples, config.latent_dim)
    )
    points = []
    for step in store.steps():
        params = sampling_params(store.state(step, template), config.g_average)
        flat = np.asarray(sample(params, z), np.float32).reshape(z.shape[0], -1)
        points.append(
            {
                "step": step,
                "seconds": step * seconds_per_step,
                "frechet_distance": float(np.mean(metric.frechet_sets(flat))),
            }
        )
    store.close()
    return points
