"""The static parameters of one attention call, held once for every pass and backend."""

import dataclasses

from fastgp._typing import Backend


@dataclasses.dataclass(frozen=True)
class Config:
    """Score scale, causal masking, the queries and keys a step handles, and the backend that
    runs the passes (``"xla"`` or a kernel backend; hashable: it is a primitive parameter)."""

    scale: float
    causal: bool
    block_q: int
    block_k: int
    backend: Backend = "xla"


__all__ = ["Config"]
