"""How far the approximation's gradient is from exact R1's along the declared study's trained
critics (docs/study.md, "Analysis and report"): the sigma sweep of ``benchmarks.exactness.sigma``
read along the ``exact`` and ``approx-0.01`` runs of the ``vit`` testbed.

    JAX_PLATFORMS=cpu python -m benchmarks.exactness.sigma runs/declared/vit-exact-* \\
        runs/declared/vit-approx-0.01-* --sigmas 0.01 0.1 --draws 1 --along declared_cosine_vit
    -> benchmarks/results/exactness/declared_cosine_vit.json, which ``table`` summarises:

    table(result) -> markdown lines: per critic's arm, checkpoint step and sigma, the one-draw
                     gradient cosine and value ratio over the seeds (mean, smallest, largest)

The trainer keeps a run's newest three checkpoints, so the sweep sees the critics at the three
evaluations the primary metric averages (6/8, 7/8 and 8/8 of the steps), not at every evaluation.
"""

from typing import Any

import numpy as np

from benchmarks.tables import markdown_table


def arm_of_folder(folder: str) -> str:
    """``vit-approx-0.01-3`` -> ``approx-0.01``: the arm of a declared run's folder."""
    return folder.split("-", 1)[1].rsplit("-", 1)[0]


def _spread(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ({min(values):.2f} to {max(values):.2f})"


def table(result: dict[str, Any]) -> list[str]:
    """Per (critic's arm, step, sigma): the seeds, the one-draw cosine between the parameter
    gradients of approximate and exact R1, and the one-draw value ratio approximate / exact."""
    groups: dict[tuple[str, int, float], list[dict[str, Any]]] = {}
    for row in result["rows"]:
        key = (arm_of_folder(row["folder"]), row["step"], row["sigma"])
        groups.setdefault(key, []).append(row)
    head = ["critic trained by", "step", "sigma", "seeds", "gradient cosine, 1 draw"]
    head += ["value ratio, 1 draw"]
    lines = [
        [
            arm,
            step,
            f"{sigma:g}",
            len(rows),
            _spread([r["cosine_one_draw"] for r in rows]),
            _spread([r["ratio_one_draw"] for r in rows]),
        ]
        for (arm, step, sigma), rows in sorted(groups.items())
    ]
    return markdown_table(head, lines)


__all__ = ["arm_of_folder", "table"]
