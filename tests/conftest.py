"""Test set-up: the environment (``suite_environment``), hypothesis's profile, shared fixtures."""

import os
import shutil
from pathlib import Path

import suite_environment  # before JAX is imported: it sets JAX's environment

# isort: split
import jax
import pytest
from hypothesis import HealthCheck, settings
from jax.experimental.compilation_cache import compilation_cache

pytest_plugins = ["crash_reports"]

settings.register_profile(
    "default",
    deadline=None,
    max_examples=25,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("default")


@pytest.fixture(scope="session")
def run_tmp_path(tmp_path_factory) -> Path:
    """This run's temporary directory, shared by its pytest-xdist workers (a worker's own lies
    in it), for outputs made once per run; make them under a file lock."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@pytest.fixture(scope="session")
def child_env(run_tmp_path) -> dict[str, str]:
    """The environment of the ``fastgp`` command-line runs a test starts: CPU JAX with its own
    device count (this process's 8 do not leak) and one compilation cache for the test run, so
    that runs building the same programs compile them once."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(run_tmp_path / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    env["XLA_FLAGS"] = " ".join(
        flag for flag in os.environ["XLA_FLAGS"].split() if "device_count" not in flag
    )
    return env


@pytest.fixture(autouse=True)
def fresh_tpu_interpret_state():
    """TPU interpret mode keeps global simulated-memory state sized for the first mesh it ran on;
    a later run on a larger mesh in the same process waits forever on a stale barrier (JAX 0.10.2).
    Nothing runs between tests, so resetting here is safe."""
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()
    yield


@pytest.fixture(autouse=True, scope="module")
def fresh_compilation_caches():
    """Each test module starts with JAX's caches of traced and compiled programs empty: every
    compiled XLA:CPU program holds memory mappings of its own, and a worker that kept them all
    would reach Linux's limit per process (vm.max_map_count), where a compile's mmap fails and XLA
    segfaults (docs/development.md)."""
    jax.clear_caches()
    yield


@pytest.fixture(autouse=True)
def no_compilation_cache_for_tpu_compiles(request):
    """The compile-only TPU client can neither load a cached executable (JAX warns, "PjRtCompiler
    must be constructed with a Client", and compiles again) nor needs one stored: the ``aot``
    tests compile without the run's persistent cache."""
    if request.node.get_closest_marker("aot") is None:
        yield
        return
    # JAX decides once a process whether the cache is used: reset that decision both ways
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()


# Whole-trainer and command-line runs (subprocesses, many compiled steps): `make test` runs them,
# `make check` (the fast subset) skips them with the `aot` compilations.
END_TO_END_MODULES = {
    "test_cli.py",
    "test_collectives.py",
    "test_digit_quality.py",
    "test_run_faults.py",
    "test_trainer.py",
    "test_trainer_batches.py",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in END_TO_END_MODULES:
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config):
    if suite_environment.OWN_CACHE is not None:  # the process that made it (xdist's controller)
        shutil.rmtree(suite_environment.OWN_CACHE, ignore_errors=True)
