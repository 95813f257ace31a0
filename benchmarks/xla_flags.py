"""XLA flags this jaxlib knows, found by starting XLA with them in a child process.

    known(flags, python=sys.executable) -> the flags XLA accepts, in their order
    COMPILE_FAST                        -> flags that make XLA:CPU compile small programs faster

XLA's flag parser stops the whole process on an ``XLA_FLAGS`` entry it does not know ("Unknown
flag in XLA_FLAGS"), and XLA adds and drops flags between releases (jaxlib 0.12 dropped
``--xla_cpu_use_fusion_emitters``, which 0.10.2 has). So a flag that one supported JAX lacks is
set only after a child has started XLA's CPU client with it; a flag every supported JAX has
(``--xla_force_host_platform_device_count``, ``--xla_cpu_max_isa``) needs no probe.

XLA reads ``XLA_FLAGS`` when JAX's backend starts, not when JAX is imported, so a caller may
import fastgp first and set the flags this module finds before the first computation.
"""

import functools
import os
import subprocess
import sys
from collections.abc import Sequence

# No LLVM optimisation and the elemental emitters instead of the MLIR fusion emitters: for many
# small programs each compiled once (a test suite), codegen costs more than it saves. The HLO
# passes, and so what a program computes, are the same with or without them.
COMPILE_FAST = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",  # jaxlib <= 0.10 only
)

_START_XLA = "import jax; jax.devices('cpu')"


def known(flags: Sequence[str], python: str = sys.executable) -> tuple[str, ...]:
    """The entries of ``flags`` that the XLA under ``python`` accepts, in their order.

    Each flag is tried in a child interpreter that starts JAX's CPU backend with it alone
    (about one second, the children run at once); the answer is kept per interpreter for the
    life of this process.
    """
    return _known(tuple(flags), python)


@functools.cache
def _known(flags: tuple[str, ...], python: str) -> tuple[str, ...]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    children = [
        subprocess.Popen(
            [python, "-c", _START_XLA],
            env=env | {"XLA_FLAGS": flag},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for flag in flags
    ]
    return tuple(flag for flag, child in zip(flags, children, strict=True) if child.wait() == 0)


__all__ = ["COMPILE_FAST", "known"]
