"""Calibration of the digits metric: its figures on real digits and on known degradations of them.

    calibration_table(seed=0)  -> [{"row": name, "sigma": noise sigma or None, **figures}]
    markdown(rows)             -> the rows as a markdown table
    noise_curve(rows)          -> the NOISE_CURVE of ``fastgp.train.evaluation``
    python -m fastgp.train.digit_calibration [--seed S] [--write README.md docs/trainer.md]

Every row is built from the metric's first half (the digits a run trains on; the held-out half
stays the untouched reference) and scored by ``DigitQuality(seed)``:

    real              the first half: the floor of every figure
    real + noise s    + N(0, s^2) per pixel, clipped to [-1, 1] (the generator's range); one
                      standard-normal draw (seed) scaled by each s in NOISE_SIGMAS
    real blurred      3x3 box blur, background (-1) beyond the border
    real, one class   the first half's 3s, drawn with replacement
    uniform noise     U(-1, 1) per pixel
    real, resampled   the first half drawn with replacement: what a generator that has
                      memorised its training digits exactly scores (i.i.d. draws repeat some
                      digits and miss others, where the floor holds each digit once)

Each row holds ``FRECHET_SETS`` sets of 898, independent draws of its damage, and is scored as a
run's samples are (the C2ST on the first set, the Frechet distance averaged over the sets).
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastgp.train.evaluation import FRECHET_SETS, NOISE_SIGMAS, PIXELS, DigitQuality

RESAMPLED = "real, resampled (a copy of the training half)"
MARKERS = ("<!-- digits-calibration -->", "<!-- /digits-calibration -->")
# (column title, key of the metric's dict); LIKE heads the equivalent-noise columns
LIKE = "\N{ALMOST EQUAL TO} \N{GREEK SMALL LETTER SIGMA}"
COLUMNS = (
    ("C2ST", "c2st_accuracy"),
    ("SVM", "c2st_svm"),
    ("MLP", "c2st_mlp"),
    (LIKE, "c2st_sigma"),
    ("Fréchet", "frechet_distance"),
    ("sd", "frechet_spread"),
    (LIKE, "frechet_sigma"),
    ("confidence", "confidence"),
    (LIKE, "confidence_sigma"),
    ("classes", "classes_covered"),
    ("entropy", "class_entropy"),
)


def degraded(metric: DigitQuality, seed: int = 0) -> dict[str, np.ndarray]:
    """{row name: (FRECHET_SETS * n, 64) float32 digits} for the rows of the table
    (n = ``metric.n_samples``): each set of n is an independent draw of the row's damage to the
    same n real digits (the real row: those digits repeated), as a generator's evaluation
    passes ``metric.sets_wanted`` samples."""
    from fastgp.train.data import digit_labels

    n, real = metric.n_samples, metric.train_images
    count = FRECHET_SETS * n
    rng = np.random.default_rng(seed)
    repeated = np.tile(real[:n], (FRECHET_SETS, 1))
    normal = rng.standard_normal((count, PIXELS))
    rows: dict[str, np.ndarray | None] = {"real": repeated}
    for sigma in NOISE_SIGMAS[1:]:
        rows[f"real + noise {sigma}"] = np.clip(repeated + sigma * normal, -1.0, 1.0)
    rows[RESAMPLED] = None  # drawn last (below): the rows before it keep their random numbers
    padded = np.pad(real[:n].reshape(n, 8, 8), ((0, 0), (1, 1), (1, 1)), constant_values=-1.0)
    box = np.asarray(sum(padded[:, i : i + 8, j : j + 8] for i in range(3) for j in range(3))) / 9.0
    rows["real blurred"] = np.tile(box.reshape(n, PIXELS), (FRECHET_SETS, 1))
    threes = real[digit_labels()[metric.train_index] == 3]
    rows["real, one class (3)"] = threes[rng.integers(0, len(threes), count)]
    rows["uniform noise"] = rng.uniform(-1.0, 1.0, (count, PIXELS))
    rows[RESAMPLED] = resampled(metric, rng, count)
    return {name: np.asarray(x, np.float32) for name, x in rows.items()}


def resampled(metric: DigitQuality, rng: np.random.Generator, count: int) -> np.ndarray:
    """(count, 64) digits drawn with replacement from the whole first half: the samples of a
    generator whose distribution is exactly its training set."""
    real = metric.train_images
    return real[rng.integers(0, len(real), count)]


def calibration_table(
    seed: int = 0, names: Sequence[str] | None = None, metric: DigitQuality | None = None
) -> list[dict[str, Any]]:
    """The metric's dict on each row of :func:`degraded` (``names``: a subset, in table order),
    with "row" (its name) and "sigma" (the noise sigma; 0.0 for real, None for the others)."""
    metric = metric or DigitQuality(seed)
    rows = []
    for name, samples in degraded(metric, seed).items():
        if names is not None and name not in names:
            continue
        sigma = 0.0 if name == "real" else None
        if name.startswith("real + noise "):
            sigma = float(name.removeprefix("real + noise "))
        rows.append({"row": name, "sigma": sigma, **metric(samples)})
    return rows


def noise_curve(rows: list[dict[str, Any]]) -> dict[str, tuple[float, ...]]:
    """{figure: its values on the noise rows, sigma ascending}: ``NOISE_CURVE`` from a table."""
    noise = sorted((r for r in rows if r["sigma"] is not None), key=lambda r: r["sigma"])
    if tuple(r["sigma"] for r in noise) != NOISE_SIGMAS:
        raise ValueError("the noise curve needs the real row and every noise row")
    keys = ("c2st_accuracy", "frechet_distance", "confidence")
    return {key: tuple(r[key] for r in noise) for key in keys}


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table: one line per row, a column per figure of :data:`COLUMNS`."""
    lines = [
        "| row | " + " | ".join(title for title, _ in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for r in rows:
        cells = [
            f"{r[key]:.3f}" if isinstance(r[key], float) else str(r[key]) for _, key in COLUMNS
        ]
        lines.append(f"| {r['row']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_between_markers(path: str, table: str) -> None:
    """Replace the text between the two :data:`MARKERS` lines of ``path`` with ``table``."""
    text = Path(path).read_text(encoding="utf-8")
    start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
    Path(path).write_text(text[:start] + "\n" + table + text[end:], encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="split and noise seed (default 0)")
    parser.add_argument(
        "--write", metavar="PATH", nargs="+", default=[], help="replace the marked table in each"
    )
    args = parser.parse_args(argv)
    rows = calibration_table(args.seed)
    table = markdown(rows)
    print(table)
    print("NOISE_CURVE =", noise_curve(rows))
    for path in args.write:
        write_between_markers(path, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
