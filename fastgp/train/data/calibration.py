"""Calibration of the image metrics (8x8 digits, 28x28 MNIST): their figures on real images and
on known degradations of them.

    calibration_table(seed=0, names=None, metric=None, dataset="digits")
                               -> [{"row": name, "sigma": noise sigma or None, **figures}]
    markdown(rows)             -> the rows as a markdown table
    render(path)               -> the markdown table of a written calibration (json)
    noise_curve(rows, spec)    -> the spec's noise curve (``fastgp.train.data.quality``)
    python -m fastgp.train.data.calibration [--dataset mnist] [--seed S]
        [--json benchmarks/results/mnist/calibration.json] [--write README.md docs/trainer.md]

Every row is built from the metric's first half (the images a run trains on; the held-out half
stays the untouched reference) and scored by the dataset's ``ImageQuality(spec, seed)``:

    real              the first half's whole sets of n images (898 digits, once; 2 x 1000
                      MNIST digits, each set 4 times): the floor of every figure
    real + noise s    + N(0, s^2) per pixel, clipped to [-1, 1] (the generator's range); one
                      standard-normal draw (seed) scaled by each s of the spec's sigmas
    real blurred      3x3 box blur, background (-1) beyond the border
    real, one class   the first half's 3s, drawn with replacement
    real, one class missing
                      the first half's other nine classes, drawn with replacement
    uniform noise     U(-1, 1) per pixel
    real, resampled   the first half drawn with replacement: what a generator that has
                      memorised its training images exactly scores (i.i.d. draws repeat some
                      images and miss others, where the floor holds each image once)

``--json`` writes the table, its noise curve and the metric's time per row (and the markdown of
:func:`render` beside it, ``.md``); ``--write`` replaces a page's table between the lines of
:func:`markers` (``<!-- digits-calibration -->`` ... for the digits, ``<!-- mnist-calibration -->``
... for MNIST).

Each row holds ``FRECHET_SETS`` sets of n (``n_samples``: 898 digits, 1000 MNIST digits),
independent draws of its damage, and is scored as a run's samples are (the C2ST on the first set,
the Frechet distance averaged over the sets).
"""

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastgp.train.data.quality import (
    FRECHET_SETS,
    SPECS,
    ImageQuality,
    QualitySpec,
    quality_metric,
)

RESAMPLED = "real, resampled (a copy of the training half)"
ONE_CLASS, MISSING = "real, one class (3)", "real, one class missing (3)"
MARKERS = ("<!-- digits-calibration -->", "<!-- /digits-calibration -->")  # markers("digits")
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


def _blurred(images: np.ndarray, image: tuple[int, int, int]) -> np.ndarray:
    """(n, pixels) images 3x3 box-blurred, background (-1) beyond the border."""
    n, (h, w, c) = len(images), image
    padded = np.pad(
        images.reshape(n, h, w, c), ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-1.0
    )
    box = sum(padded[:, i : i + h, j : j + w] for i in range(3) for j in range(3))
    return (np.asarray(box) / 9.0).reshape(n, -1)


def degraded(metric: ImageQuality, seed: int = 0) -> dict[str, np.ndarray]:
    """{row name: (FRECHET_SETS * n, pixels) float32 images} for the rows of the table
    (n = ``metric.n_samples``): each set of n is an independent draw of the row's damage to a
    set of the floor's real images (the real row: those sets repeated), as a generator's
    evaluation passes ``metric.sets_wanted`` samples."""
    spec, real, count = metric.spec, metric.train_images, metric.sets_wanted
    rng = np.random.default_rng(seed)
    repeated = np.resize(metric.real, (count, real.shape[1]))  # the floor's sets, cycled
    normal = rng.standard_normal((count, real.shape[1]))
    rows: dict[str, np.ndarray | None] = {"real": repeated}
    for sigma in spec.sigmas[1:]:
        rows[f"real + noise {sigma}"] = np.clip(repeated + sigma * normal, -1.0, 1.0)
    # RESAMPLED and MISSING are drawn last (below): the rows before them keep their random numbers
    rows[RESAMPLED] = None
    rows["real blurred"] = _blurred(repeated, spec.image)
    labels = spec.labels()[metric.train_index]
    threes = real[labels == 3]
    rows[ONE_CLASS] = threes[rng.integers(0, len(threes), count)]
    rows[MISSING] = None
    rows["uniform noise"] = rng.uniform(-1.0, 1.0, (count, real.shape[1]))
    rows[RESAMPLED] = resampled(metric, rng, count)
    others = real[labels != 3]
    rows[MISSING] = others[rng.integers(0, len(others), count)]
    return {name: np.asarray(x, np.float32) for name, x in rows.items()}


def resampled(metric: ImageQuality, rng: np.random.Generator, count: int) -> np.ndarray:
    """(count, pixels) images drawn with replacement from the whole first half: the samples of a
    generator whose distribution is exactly its training set."""
    real = metric.train_images
    return real[rng.integers(0, len(real), count)]


def calibration_table(
    seed: int = 0,
    names: Sequence[str] | None = None,
    metric: ImageQuality | None = None,
    dataset: str = "digits",
) -> list[dict[str, Any]]:
    """The metric's dict on each row of :func:`degraded` (``names``: a subset, in table order),
    with "row" (its name), "sigma" (the noise sigma; 0.0 for real, None for the others) and
    "seconds" (the metric's time on the row). ``metric`` defaults to ``dataset``'s."""
    metric = metric or quality_metric(dataset, seed)
    rows = []
    for name, samples in degraded(metric, seed).items():
        if names is not None and name not in names:
            continue
        sigma = 0.0 if name == "real" else None
        if name.startswith("real + noise "):
            sigma = float(name.removeprefix("real + noise "))
        start = time.perf_counter()
        figures = metric(samples)
        seconds = round(time.perf_counter() - start, 2)
        rows.append({"row": name, "sigma": sigma, **figures, "seconds": seconds})
    return rows


def noise_curve(
    rows: list[dict[str, Any]], spec: QualitySpec = SPECS["digits"]
) -> dict[str, tuple[float, ...]]:
    """{figure: its values on the noise rows, sigma ascending}: ``spec.curve`` from a table."""
    noise = sorted((r for r in rows if r["sigma"] is not None), key=lambda r: r["sigma"])
    if tuple(r["sigma"] for r in noise) != spec.sigmas:
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


def markers(dataset: str = "digits") -> tuple[str, str]:
    """The two lines between which a page holds ``dataset``'s table (:data:`MARKERS` for the
    digits)."""
    return (f"<!-- {dataset}-calibration -->", f"<!-- /{dataset}-calibration -->")


def write_between_markers(path: str, table: str, dataset: str = "digits") -> None:
    """Replace the text between the two :func:`markers` lines of ``path`` with ``table``."""
    text = Path(path).read_text(encoding="utf-8")
    first, last = markers(dataset)
    start, end = text.index(first) + len(first), text.index(last)
    Path(path).write_text(text[:start] + "\n" + table + text[end:], encoding="utf-8")


def render(path: str | Path) -> str:
    """The markdown table of a calibration that ``--json`` wrote to ``path``, with its dataset,
    seed and the metric's time per row."""
    result = json.loads(Path(path).read_text(encoding="utf-8"))
    seconds = [r["seconds"] for r in result["rows"]]
    return (
        f"Calibration of the {result['dataset']} metric (split and noise seed "
        f"{result['seed']}; {result['n_samples']} samples per set, {result['sets']} "
        f"sets per row; the metric takes {min(seconds):.1f}-{max(seconds):.1f} s a row on "
        f"{result['machine']}), by `{result['command']}`:\n\n" + markdown(result["rows"])
    )


def write_json(path: str | Path, rows: list[dict[str, Any]], metric: ImageQuality) -> None:
    """The table, its noise curve and how it was made, as JSON at ``path`` (folders made)."""
    import platform

    spec = metric.spec
    result = {
        "dataset": spec.name,
        "seed": metric.seed,
        "n_samples": metric.n_samples,
        "sets": FRECHET_SETS,
        "sigmas": list(spec.sigmas),
        "noise_curve": noise_curve(rows, spec),
        "machine": f"{os.cpu_count()} {platform.machine()} cores, one BLAS thread",
        "command": f"python -m fastgp.train.data.calibration --dataset {spec.name} "
        f"--seed {metric.seed} --json {path}",
        "rows": rows,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=tuple(SPECS), default="digits")
    parser.add_argument("--seed", type=int, default=0, help="split and noise seed (default 0)")
    parser.add_argument(
        "--json", metavar="PATH", help="write the table as JSON there, and its markdown beside"
    )
    parser.add_argument(
        "--write", metavar="PATH", nargs="+", default=[], help="replace the marked table in each"
    )
    args = parser.parse_args(argv)
    metric = quality_metric(args.dataset, args.seed)
    rows = calibration_table(args.seed, metric=metric)
    table = markdown(rows)
    print(table)
    print("noise curve =", noise_curve(rows, metric.spec))
    if args.json:
        write_json(args.json, rows, metric)
        Path(args.json).with_suffix(".md").write_text(render(args.json), encoding="utf-8")
    for path in args.write:
        write_between_markers(path, table, args.dataset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
