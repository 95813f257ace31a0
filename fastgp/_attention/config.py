"""The static parameters of one attention call, held once for every pass and backend."""

import dataclasses
from typing import Literal

from fastgp._attention.ring import Ring
from fastgp._typing import Backend

Scheme = Literal["auto", "ring", "all-to-all", "all-gather"]
SCHEMES: tuple[Scheme, ...] = ("auto", "ring", "all-to-all", "all-gather")


def heads_split(heads: int, shards: int) -> bool:
    """Whether an all-to-all can trade a token split over ``shards`` devices for a head split:
    ``heads`` (each device's) a multiple of ``shards``."""
    return heads % shards == 0


def heads_do_not_split(heads: int, shards: int) -> ValueError:
    """The refusal of ``sequence_parallel="all-to-all"`` where ``heads`` (each device's) are not
    a multiple of the ``shards`` devices that split the tokens: the same in every mode."""
    return ValueError(
        f"fastgp.attention(sequence_parallel='all-to-all'): the all-to-all splits each "
        f"device's heads over the {shards} devices that split the tokens, but q has "
        f"{heads} heads on each device, not a multiple of {shards}. Pass "
        f"sequence_parallel='ring' (any head count), or split the tokens over fewer devices."
    )


@dataclasses.dataclass(frozen=True)
class Config:
    """Score scale, causal masking, the queries and keys a step handles, the backend that runs
    the passes (``"xla"`` or a kernel backend), and the first query's position among the keys
    (``q_offset``: a sequence shard's start, for causal masking), ``ring``: the mesh axes the
    tokens are split over when every pass runs as ring steps (``fastgp._attention.ring``), and
    ``scheme``: how an Auto-sharded program attends split tokens
    (``fastgp._attention.partitioned``): gathered by XLA's partitioner ("all-gather"), on the ring
    ("ring"), or with the all-to-all where the heads allow and the ring otherwise ("auto",
    "all-to-all").
    Hashable: a primitive parameter."""

    scale: float
    causal: bool
    block_q: int
    block_k: int
    backend: Backend = "xla"
    q_offset: int = 0
    ring: Ring | None = None
    scheme: Scheme = "auto"


__all__ = ["SCHEMES", "Config", "Scheme", "heads_do_not_split", "heads_split"]
