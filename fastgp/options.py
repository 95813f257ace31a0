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
from fastgp._backends import BACKENDS as BACKENDS
from fastgp._backends import auto_backend as auto_backend
from fastgp._penalty.kinds import KINDS as KINDS
from fastgp._typing import Backend as Backend
from fastgp._typing import Kind as Kind
from fastgp._typing import Remat as Remat
from fastgp._typing import SecondOrder as SecondOrder
from fastgp.penalty import SECOND_ORDER as SECOND_ORDER

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
