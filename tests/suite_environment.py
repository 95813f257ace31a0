"""The test processes' environment, set before JAX starts: CPU JAX with 8 simulated devices, the
fastest-compiling XLA flags this JAX knows, one persistent compilation cache for the run, libtpu
usable from parallel workers. The xdist workers inherit it from the controller's environment.

    OWN_CACHE   the cache directory this process made (None where it inherited one)
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
# One persistent compilation cache for the run, shared by its workers: each module starts with
# JAX's in-memory caches cleared (below), and modules and workers compile many equal programs.
OWN_CACHE: str | None = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    OWN_CACHE = tempfile.mkdtemp(prefix="fastgp-test-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# JAX reads the variables above when it is imported, and XLA_FLAGS when its backend starts.
from benchmarks import xla_flags as _xla_flags  # noqa: E402  (imports JAX)

# The suite's programs are small and compiled once each, so XLA:CPU's LLVM optimisations and its
# MLIR fusion emitters cost more than they save; the HLO passes, and so what the programs compute,
# are unchanged. Each flag is probed first (benchmarks.xla_flags): XLA stops the process on a flag
# it does not know, and the supported JAX versions know different ones. The xdist workers inherit
# the result through XLA_FLAGS.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + " ".join(_xla_flags.known(_xla_flags.COMPILE_FAST))
