"""Test set-up: CPU JAX with 8 simulated devices, libtpu usable from parallel workers."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("default", deadline=None, max_examples=25, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")
