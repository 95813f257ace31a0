"""Auto-sharded ``jax.jit`` over several devices: each attention pass partitioned by fastgp.

    partitioned(impl_of, config, key_args, key_results, x64)
        -> the pass as a ``custom_partitioning`` function

Left to itself, XLA's partitioner splits the blockwise loops over batch and heads but gathers a
sharded token axis onto every device. Each pass (the XLA backend's; ``fastgp._attention.rules``
lowers it through here in such a program) is instead one custom call whose partition this module
chooses from its operands' shardings:

* batch and heads stay split as q's are;
* when q's token axis is split over n devices whose count divides the tokens and each device's
  heads, and the scheme is "auto" or "all-to-all", the pass takes its operands with the heads
  split over those devices too and every token whole (the key mask gathered), runs the
  one-device pass on every token of its heads, and trades its results back to the token split
  (all-to-alls), as the all-to-all scheme does in ``shard_map``
  (``fastgp._attention.sequence``). XLA's partitioner makes the operands' trade, once for each
  array however many passes read it (docs/performance.md counts them);
* otherwise, when q's token axis is split over mesh axes into whole blocks on each device (for
  causal masking, with queries and keys on one grid), every token axis stays split over them and
  the pass runs as ring steps over those axes (``fastgp._attention.ring``), as in ``shard_map``;
* every other axis is whole on each device (the partitioner gathers what is split otherwise).

``impl_of(config)`` is the pass on one device's arrays, or as ring steps when ``config.ring`` is
set; ``key_args`` and ``key_results`` the positions of its key-side arguments and results.
"""

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp._attention.config import Config, heads_do_not_split, heads_split
from fastgp._attention.permute import own_channels
from fastgp._attention.ring import Ring
from fastgp._attention.trade import to_tokens
from fastgp._sharding import axes_of, full_spec

Impl = Callable[..., Sequence[jax.Array]]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How each operand is split: q's batch and head entries, and the token entry (None: whole)."""

    batch: Any
    heads: Any
    tokens: Any

    def on_heads(self) -> "_Plan":
        """The all-to-all's split of a pass's operands: the heads over q's head axes and then
        its token axes, every token whole."""
        heads = (*axes_of(self.heads), *axes_of(self.tokens))
        return _Plan(self.batch, heads if len(heads) > 1 else heads[0], None)

    def spec(self, ndim: int) -> P:
        """The spec of a (B, H, T, D) array, of lse (B, H, T), or of the key mask (B, T)."""
        if ndim == 2:
            return P(self.batch, self.tokens)
        return P(self.batch, self.heads, self.tokens, *([None] * (ndim - 3)))


def _on_ring(config: Config, tokens: Any, mesh: Any, tq: int, tk: int) -> Config | None:
    """The pass's config as ring steps over the mesh axes of q's token entry, with blocks that
    tile each device's tokens (a divisor of the blocks, a multiple of 8); None where the tokens
    do not split so (or, causal, queries and keys would not share one grid)."""
    n = _devices(tokens, mesh)
    if n < 2 or tq % n or tk % n or config.q_offset:
        return None
    block_q, block_k = math.gcd(config.block_q, tq // n), math.gcd(config.block_k, tk // n)
    if block_q % 8 or block_k % 8 or (config.causal and (tq != tk or block_q != block_k)):
        return None
    return dataclasses.replace(
        config, block_q=block_q, block_k=block_k, ring=Ring(axes_of(tokens), n)
    )


def _on_heads(config: Config, local_heads: int, n: int, tq: int, tk: int) -> bool:
    """Whether the pass trades its token split for a head split (the all-to-all): a scheme that
    takes it, q's tokens split over n devices that divide the tokens and each device's heads."""
    if config.scheme not in ("auto", "all-to-all") or config.q_offset:
        return False
    return n > 1 and heads_split(local_heads, n) and tq % n == 0 and tk % n == 0


def _devices(entry: Any, mesh: Any) -> int:
    """The devices a spec entry splits an axis over (1: none)."""
    return math.prod(mesh.shape[a] for a in axes_of(entry))


def _results_to_tokens(body: Impl, axes: tuple[str, ...]) -> Impl:
    """``body`` on every token of this device's share of the heads (its operands arrive so), each
    result's head split traded back for the token split over ``axes``."""

    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(to_tokens(r, axes, tokens_at=2, heads_at=1) for r in body(*args))

    return run


def _plan(config: Config, mesh: Any, operands: Sequence[Any]) -> tuple[_Plan, Config, bool]:
    """The split of a pass's operands (q, k first), the config its body runs with, and whether
    the body trades tokens for heads."""
    spec = full_spec(getattr(operands[0].sharding, "spec", ()), 4)
    if spec[2] is None:
        return _Plan(spec[0], spec[1], None), config, False
    (_, heads, tq, _), tk = operands[0].shape, operands[1].shape[2]
    local_heads, shards = heads // _devices(spec[1], mesh), _devices(spec[2], mesh)
    if config.scheme == "all-to-all" and shards > 1 and not heads_split(local_heads, shards):
        raise heads_do_not_split(local_heads, shards)  # as in shard_map: asked, not substituted
    if _on_heads(config, local_heads, shards, tq, tk):
        return _Plan(spec[0], spec[1], spec[2]), config, True
    on_ring = _on_ring(config, spec[2], mesh, tq, tk)
    if on_ring is None:
        return _Plan(spec[0], spec[1], None), config, False
    return _Plan(spec[0], spec[1], spec[2]), on_ring, False


def _rule(key_args: frozenset[int], key_results: frozenset[int]) -> Callable[..., str]:
    """Shardy's rule: batch and heads shared by every operand and result, the token axis one
    factor for the queries' side and one for the keys' (the same one when their lengths agree),
    each feature axis a factor of its own."""

    def rule(mesh: Any, operands: Sequence[Any], results: Sequence[Any]) -> str:
        del mesh
        keys = "i" if operands[0].shape[2] == operands[1].shape[2] else "j"
        features = iter(range(len(operands) + len(results)))

        def dims(shape: Sequence[int], key_side: bool) -> str:
            token = keys if key_side else "i"
            if len(shape) == 2:
                return f"b {token}"
            return " ".join(["b", "h", token, *(f"f{next(features)}" for _ in shape[3:])])

        ins = [dims(t.shape, i in key_args) for i, t in enumerate(operands)]
        outs = [dims(t.shape, i in key_results) for i, t in enumerate(results)]
        return f"{', '.join(ins)} -> {', '.join(outs)}"

    return rule


def partitioned(
    impl_of: Callable[[Config], Impl],
    config: Config,
    key_args: frozenset[int],
    key_results: frozenset[int],
    x64: bool,
) -> Callable[..., tuple[jax.Array, ...]]:
    """The pass ``impl_of(config)`` as one custom call partitioned by :func:`_plan`; ``x64``:
    whether the program is lowered with 64-bit types enabled."""

    @custom_partitioning
    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(impl_of(config)(*args))

    def shardings(mesh: Any, operands: Sequence[Any], results: Sequence[Any]) -> Any:
        plan, body_config, on_heads = _plan(config, mesh, operands)

        def place(plan: _Plan, shapes: Sequence[Any]) -> tuple[NamedSharding, ...]:
            return tuple(NamedSharding(mesh, plan.spec(len(s.shape))) for s in shapes)

        body = impl_of(body_config)
        if on_heads:
            body = _results_to_tokens(body, axes_of(plan.tokens))
            return body, place(plan.on_heads(), operands), place(plan, results)
        return body, place(plan, operands), place(plan, results)

    def infer(mesh: Any, operands: Sequence[Any], results: Sequence[Any]) -> Any:
        return shardings(mesh, operands, results)[2]

    def partition(mesh: Any, operands: Sequence[Any], results: Sequence[Any]) -> Any:
        body, operand_shardings, result_shardings = shardings(mesh, operands, results)
        # XLA calls this on a compile thread, which does not see a thread-local jax.enable_x64
        # of the lowering's; JAX traces ``lower`` right after this returns, with the body's
        # operand types as the lowering saw them only if 64-bit types are on until then
        types = jax.enable_x64(True) if x64 else contextlib.nullcontext()
        types.__enter__()

        def lower(*args: jax.Array) -> tuple[jax.Array, ...]:
            try:
                with own_channels():  # lowered into a module of its own
                    return tuple(body(*args))
            finally:
                types.__exit__(None, None, None)

        return mesh, lower, result_shardings, operand_shardings

    run.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=_rule(key_args, key_results),
    )
    return run


__all__ = ["partitioned"]
