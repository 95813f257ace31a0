"""``benchmarks.xla_flags.known``: only flags this XLA accepts are ever set (an unknown one stops
the process), found by starting XLA with each in a child."""

import os
import subprocess
import sys

from benchmarks import xla_flags as _xla_flags


def test_known_keeps_the_flags_this_xla_accepts_and_drops_the_others():
    flags = ["--xla_cpu_max_isa=AVX2", "--xla_no_such_flag_anywhere=1", "--xla_cpu_ftz=false"]
    assert _xla_flags.known(flags) == ("--xla_cpu_max_isa=AVX2", "--xla_cpu_ftz=false")


def test_every_flag_known_is_one_xla_starts_with_together():
    """What the test processes run with: the compile-speed flags this XLA has, all at once."""
    flags = " ".join(_xla_flags.known(_xla_flags.COMPILE_FAST))
    assert "--xla_backend_optimization_level=0" in flags  # in every supported XLA
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    child = subprocess.run([sys.executable, "-c", _xla_flags._START_XLA], env=env)
    assert child.returncode == 0


def test_an_unknown_flag_would_stop_the_process():
    """The reason for the probe: XLA exits on a flag it does not know, as 0.12 does on
    --xla_cpu_use_fusion_emitters."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_no_such_flag_anywhere=1"}
    child = subprocess.run(
        [sys.executable, "-c", _xla_flags._START_XLA], env=env, capture_output=True, text=True
    )
    assert child.returncode != 0 and "Unknown flag in XLA_FLAGS" in child.stderr
