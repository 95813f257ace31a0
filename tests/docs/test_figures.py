"""The figures README.md and docs/*.md quote from benchmarks/results/ equal those files.

Each quoted block sits between ``<!-- results:NAME -->`` marks and is rendered from the results
files by ``benchmarks/published.py`` (``python -m benchmarks.published --write`` rewrites them);
here every marked block must equal a fresh rendering, so a results file re-measured without the
pages (or a page edited by hand) fails. The digits calibration table has its own marks and test
(tests/train/test_digit_quality.py).
"""

import json
import shutil

import pytest

from benchmarks import published

# The headline figures each page must quote from the results (not only may).
REQUIRED = {
    "README.md": {
        *("zoo-headline", "zoo-summary", "zoo-pallas", "trainer-runs"),
        "exact-over-approximate",
    },
    "recipes.md": {"attention-jvp-memory"},
    "performance.md": {
        *("approximate-r1-long-tpu", "approximate-r1-long-cpu", "attention-auto"),
        "attention-second-order",
        *("approximate-r1-transformer-training", "exact-over-approximate"),
        "zoo-cpu",
        "zoo-summary",
        "zoo-capacity",
        "zoo-bytes-v5e",
        "zoo-bytes-v6e",
        "zoo-pallas",
    },
    "trainer.md": {"toy-runs", "train-time", "digits-runs"},
}
PAGES = {page.name: page for page in published.PAGES}


@pytest.fixture(scope="module")
def results():
    return published.Results()


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_the_headline_figures_are_quoted_from_the_results(name):
    assert REQUIRED[name] <= {block for block, _ in published.quoted(PAGES[name])}


def test_every_block_is_quoted_somewhere_and_has_its_sources():
    quoted = {block for page in published.PAGES for block, _ in published.quoted(page)}
    assert quoted == set(published.BLOCKS)
    for block in published.BLOCKS.values():
        assert block.sources and all((published.RESULTS / s).exists() for s in block.sources)


@pytest.mark.parametrize("page", published.PAGES, ids=lambda page: page.name)
def test_quoted_figures_equal_the_results_files(page, results):
    for name, text in published.quoted(page):
        assert text == published.render(name, results), (
            f"{page.name}: the figures of block {name!r} differ from "
            f"{', '.join(published.BLOCKS[name].sources)}; run "
            "`python -m benchmarks.published --write`"
        )


def test_a_changed_results_file_changes_the_quoted_figures(tmp_path):
    """The blocks are read from the files, not stored: a re-measured run shows on the page."""
    for source in ("training/train_time.json", "training/trainer_runs.json"):
        (tmp_path / source).parent.mkdir(exist_ok=True)
        shutil.copy(published.RESULTS / source, tmp_path / source)
    before = published.render("trainer-runs", published.Results(tmp_path))
    times = json.loads((tmp_path / "training/train_time.json").read_text())
    for run in times["runs"]:
        run["train_s"] += 100.0
    (tmp_path / "training/train_time.json").write_text(json.dumps(times))
    after = published.render("trainer-runs", published.Results(tmp_path))
    assert before != after
    assert dict(published.quoted(PAGES["README.md"]))["trainer-runs"] == before
