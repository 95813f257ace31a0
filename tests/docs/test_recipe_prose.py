"""docs/trainer.md's sentence on where the MNIST recipes stand holds on the recorded runs: each
critic's final Fréchet distance between the calibration rows it names, on both scorers, and all
classes."""

import json
import pathlib

RESULTS = pathlib.Path(__file__).parents[2] / "benchmarks" / "results"
# critic -> the noise rows its samples sit between, on both scorers (docs/trainer.md)
BETWEEN = {"conv": (0.2, 0.4), "vit": (0.2, 0.8)}


def _load(name):
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _noise_rows(rows, key):
    return {
        float(r["row"].split()[-1]): r[key] for r in rows if r["row"].startswith("real + noise")
    }


def test_the_recipes_stand_where_trainer_md_says():
    runs = {r["critic"]: r for r in _load("exactness/recipe_runs.json")["runs"]}
    own = _noise_rows(_load("mnist/calibration.json")["rows"], "frechet_distance")
    outside = _noise_rows(_load("mnist/outside_calibration.json")["calibration"], "frechet")
    assert own[0.1] < min(r["frechet_distance"] for r in runs.values())
    for critic, (low, high) in BETWEEN.items():
        run = runs[critic]
        assert own[low] < run["frechet_distance"] < own[high], critic
        assert outside[low] < run["outside_frechet"] < outside[high], critic
        assert run["classes_covered"] == run["outside_classes"] == 10
    vit = runs["vit"]
    assert abs(vit["frechet_distance"] - own[0.4]) < abs(vit["frechet_distance"] - own[0.2])
    assert abs(vit["outside_frechet"] - outside[0.4]) < abs(vit["outside_frechet"] - outside[0.8])
