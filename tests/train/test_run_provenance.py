"""The code a run records in run.json: the commit of the checkout that tracks fastgp and whether
its tracked files were changed, "unknown" outside one; each against git run here."""

import os
import subprocess
from pathlib import Path

import pytest

from fastgp.train.run import outputs

ROOT = Path(__file__).resolve().parents[2]


def git(cwd, *args):
    """git's stdout in ``cwd``; the test's commits need an author of their own."""
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository holding a package directory ``pkg`` (not yet tracked)."""
    git(tmp_path, "init", "-q")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "README").write_text("a\n")
    git(tmp_path, "add", "README")
    git(tmp_path, "commit", "-q", "-m", "readme")
    return tmp_path


def test_this_checkout_is_recorded_with_its_commit_and_state():
    if not (ROOT / ".git").exists():
        pytest.skip("fastgp is not a git checkout here")
    head = git(ROOT, "rev-parse", "HEAD")
    changed = git(ROOT, "status", "--porcelain", "--untracked-files=no")
    assert outputs.source_commit() == {"commit": head, "dirty": bool(changed)}
    assert len(head) == 40


def test_a_package_its_repository_does_not_track_is_unknown(repo):
    """A package inside some other repository (a virtualenv in a project) has no commit."""
    assert outputs.source_commit(repo / "pkg") == {"commit": "unknown", "dirty": None}


def test_a_tracked_package_has_its_commit_and_is_dirty_once_changed(repo):
    git(repo, "add", "pkg")
    git(repo, "commit", "-q", "-m", "pkg")
    head = git(repo, "rev-parse", "HEAD")
    assert outputs.source_commit(repo / "pkg") == {"commit": head, "dirty": False}
    (repo / "untracked.txt").write_text("not part of the code\n")
    assert outputs.source_commit(repo / "pkg")["dirty"] is False
    (repo / "README").write_text("b\n")
    assert outputs.source_commit(repo / "pkg") == {"commit": head, "dirty": True}


def test_outside_a_checkout_or_without_git_it_is_unknown(tmp_path, monkeypatch):
    (tmp_path / "__init__.py").write_text("")
    assert outputs.source_commit(tmp_path) == {"commit": "unknown", "dirty": None}
    monkeypatch.setenv("PATH", os.fspath(tmp_path / "nowhere"))
    assert outputs.source_commit(ROOT / "fastgp") == {"commit": "unknown", "dirty": None}
