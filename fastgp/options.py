"""The values each of fastgp's options takes, and what ``"auto"`` runs, for annotating and checking
code that passes them on.

    Kind, KINDS                     a penalty's kind: "wgan-gp", "wgan-lp" or "r1"
    Backend, BACKENDS               the penalty's and attention's implementation ("auto", "pallas",
                                    the interpret modes, "xla")
    SecondOrder, SECOND_ORDER       how the penalty's parameter gradient is taken
    Remat                           the critic's rematerialisation policy, or None
    Scheme, SEQUENCE_SCHEMES        ``fastgp.attention``'s ``sequence_parallel``
    auto_backend(op, platform)      -> the backend ``"auto"`` runs for ``op`` ("penalty" or
                                       "attention") on ``platform`` ("cpu", "tpu", "cuda", "rocm")

The figures behind each ``"auto"`` choice are in docs/performance.md ("What auto runs").
"""

from fastgp._attention.config import SCHEMES as SEQUENCE_SCHEMES
from fastgp._attention.config import Scheme as Scheme
from fastgp._backends import AUTO, BACKENDS, Op
from fastgp._penalty.kinds import KINDS as KINDS
from fastgp._typing import Backend as Backend
from fastgp._typing import Kind as Kind
from fastgp._typing import Remat as Remat
from fastgp._typing import SecondOrder as SecondOrder
from fastgp.penalty import SECOND_ORDER as SECOND_ORDER


def auto_backend(op: Op, platform: str) -> Backend:
    """The backend ``backend="auto"`` runs for ``op`` on ``platform``: XLA unless the measured
    figures chose a kernel there. ValueError for an unknown op."""
    if op not in AUTO:
        raise ValueError(f"fastgp: unknown op {op!r}; expected one of {tuple(AUTO)}")
    return AUTO[op].get(platform, "xla")


__all__ = [
    "BACKENDS",
    "KINDS",
    "SECOND_ORDER",
    "SEQUENCE_SCHEMES",
    "Backend",
    "Kind",
    "Remat",
    "Scheme",
    "SecondOrder",
    "auto_backend",
]
