"""Ring sequence parallelism: each attention pass as n steps over the devices' key blocks.

    Ring(axes, size, layout, chunk)                         a ``Config`` field
    forward(block_impl, config, q, k, v, mask)              -> (o, lse)
    linear(block_impl, config, args, key_args, key_results) -> a linear pass's results

Each of the n devices on the mesh ``axes`` holds a slice of the tokens. Its query-side arrays (q,
o, lse and the tangents and cotangents shaped like them) stay where they are; its key-side arrays
(k, v, the key mask and the tangents shaped like k and v) travel around the ring by ``ppermute``,
one hop per step. At each step a device runs the one-device pass (``block_impl(config)``: the XLA
loops or a kernel) on its queries against the block it holds, while the next block is in flight.

Every pass after the forward reads P from the saved o and lse of the whole sequence, so it is a
sum over key blocks: its query-side results add up over the steps, and its key-side results (g_k,
g_v, ...) are accumulated beside the block they belong to, travel with it and arrive home one hop
after the last step. The forward combines the blocks' (o, lse) by the online softmax. So each pass
computes what it computes on one device, the derivative rules (``fastgp._attention.rules``) are
the one-device rules, and beside its own a device holds two key blocks at a time: the one it works
on and the one in flight. Sums run in float32.

Causal masking, with the block from device ``src`` = i - s (mod n) at step s on device i:

* ``"contiguous"`` (device i holds tokens [i T, (i + 1) T)): at s = 0 the block is causal among
  the device's own tokens; after that it is visible when src < i and masked out when src > i (no
  step is skipped: device n - 1 sees every block, and the others wait for it);
* ``"zigzag"`` (the sequence in 2n chunks of ``chunk`` tokens; device i holds chunks i and
  2n - 1 - i): at s = 0 causal among its own tokens; after that, when src < i every query sees the
  block's first chunk only, and when src > i the device's second chunk sees the whole block. Each
  step after the first is half a block pair on every device: the load is balanced.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax

from fastgp._attention.permute import permute
from fastgp._attention.sharding import varying_alike
from fastgp._sharding import collective_axis

Layout = Literal["contiguous", "zigzag"]
LAYOUTS: tuple[Layout, ...] = ("contiguous", "zigzag")
F32 = jnp.float32
FORWARD_KEY_ARGS = frozenset({1, 2, 3})  # the forward's k, v and key mask, of (q, k, v, mask)


@dataclasses.dataclass(frozen=True)
class Ring:
    """The mesh ``axes`` the tokens are split over, their ``size`` (devices), the ``layout`` of
    the tokens, and for ``"zigzag"`` the padded length of one chunk (half the local tokens)."""

    axes: tuple[str, ...]
    size: int
    layout: Layout = "contiguous"
    chunk: int = 0


BlockImpl = Callable[[Any], Callable[..., Sequence[jax.Array]]]


def _axis(ring: Ring) -> Any:
    return collective_axis(ring.axes)


def _token_axis(x: jax.Array) -> int:
    """The token axis: 2 of a bhtd array or of lse (B, H, T), 1 of the key mask (B, T)."""
    return 2 if x.ndim >= 3 else 1


def _slice(x: jax.Array, start: int, stop: int) -> jax.Array:
    return lax.slice_in_dim(x, start, stop, axis=_token_axis(x))


def _pad(x: jax.Array, before: int, after: int) -> jax.Array:
    pads = [(0, 0)] * x.ndim
    pads[_token_axis(x)] = (before, after)
    return jnp.pad(x, pads)


def _send(xs: Sequence[jax.Array], ring: Ring) -> list[jax.Array]:
    """Every array one hop along the ring: device i's to device i + 1 (mod n), each on a channel
    of its own (``fastgp._attention.permute``)."""
    perm = [(j, (j + 1) % ring.size) for j in range(ring.size)]
    return [permute(x, _axis(ring), perm) for x in xs]


def _hide(mask: jax.Array, visible: Any) -> jax.Array:
    """The key mask with every key hidden unless ``visible`` (a traced bool)."""
    return jnp.logical_and(mask, visible).astype(mask.dtype)


class _Step:
    """One ring step's call of the one-device pass on (query-side, key-side) arrays, by layout.

    ``args`` are the pass's arguments in order, ``key_args`` the positions of the key-side ones
    (``mask_at`` that of the key mask), ``key_results`` those of the key-side results."""

    def __init__(
        self,
        block_impl: BlockImpl,
        config: Any,
        key_args: frozenset[int],
        key_results: frozenset[int],
        mask_at: int,
    ) -> None:
        self.block_impl, self.config = block_impl, config
        self.key_args, self.key_results, self.mask_at = key_args, key_results, mask_at

    def _run(self, args: Sequence[jax.Array], causal: bool) -> list[jax.Array]:
        config = dataclasses.replace(self.config, ring=None, causal=causal, q_offset=0)
        return [
            r.astype(F32) if jnp.issubdtype(r.dtype, jnp.floating) else r
            for r in self.block_impl(config)(*args)
        ]

    def visible_or_hidden(self, args: Sequence[jax.Array], visible: Any) -> list[jax.Array]:
        """A contiguous layout's later step: the whole block, its keys hidden unless visible."""
        args = list(args)
        args[self.mask_at] = _hide(args[self.mask_at], visible)
        return self._run(args, False)

    def first_chunk_or_last_queries(
        self, args: Sequence[jax.Array], first_chunk: Any
    ) -> list[jax.Array]:
        """A zigzag layout's later step: every query against the block's first chunk, or the
        device's second chunk of queries against the whole block."""
        chunk = self.config.ring.chunk

        def keys_first_chunk(*args: jax.Array) -> list[jax.Array]:
            cut = [_slice(x, 0, chunk) if i in self.key_args else x for i, x in enumerate(args)]
            out = self._run(cut, False)
            return [_pad(r, 0, chunk) if i in self.key_results else r for i, r in enumerate(out)]

        def last_queries(*args: jax.Array) -> list[jax.Array]:
            cut = [
                x if i in self.key_args else _slice(x, chunk, 2 * chunk) for i, x in enumerate(args)
            ]
            out = self._run(cut, False)
            return [r if i in self.key_results else _pad(r, chunk, 0) for i, r in enumerate(out)]

        return lax.cond(first_chunk, keys_first_chunk, last_queries, *args)

    def at(self, args: Sequence[jax.Array], step: Any, index: Any) -> list[jax.Array]:
        """Step ``step`` (traced) on device ``index``, holding the block of device index - step:
        without causal masking one call of the pass, whatever the step; with it, step 0 (the
        device's own block) causal among its own tokens, a later step by the layout."""
        if not self.config.causal:
            return self._run(args, False)
        return lax.cond(step == 0, self._own, functools.partial(self._later, step, index), *args)

    def _own(self, *args: jax.Array) -> list[jax.Array]:
        return self._run(args, True)

    def _later(self, step: Any, index: Any, *args: jax.Array) -> list[jax.Array]:
        earlier = step <= index  # the block's source precedes this device, without wrapping
        if self.config.ring.layout == "zigzag":
            return self.first_chunk_or_last_queries(args, earlier)
        return self.visible_or_hidden(args, earlier)


def _rows_seeing_keys(config: Any, mask: jax.Array, step: Any, index: Any, tq: int) -> jax.Array:
    """(B, Tq) bool: the local queries with a visible key in the block held at ``step``
    (traced; 0 is the device's own block)."""
    ring = config.ring
    any_key = jnp.any(mask.astype(bool), axis=1, keepdims=True)
    if not config.causal:
        return jnp.broadcast_to(any_key, (mask.shape[0], tq))
    own = (jnp.cumsum(mask.astype(jnp.int32), axis=1) > 0)[:, :tq]
    earlier = step <= index
    if ring.layout == "zigzag":
        first = jnp.any(mask[:, : ring.chunk].astype(bool), axis=1, keepdims=True)
        rows = jnp.arange(tq) >= ring.chunk
        later = jnp.where(earlier, first, any_key & rows[None])
    else:
        later = jnp.broadcast_to(any_key & earlier, (mask.shape[0], tq))
    return jnp.where(step == 0, own, later)


def _varying_like(witness: jax.Array, xs: Any) -> Any:
    """``xs`` (a pytree of arrays) varying over the manual mesh axes ``witness`` and its own
    leaves vary over, as the ring's hops make its carry: a loop's carry keeps one type."""
    leaves, tree = jax.tree.flatten(xs)
    return jax.tree.unflatten(tree, varying_alike([witness, *leaves])[1:])


def _circle(ring: Ring, own: list[jax.Array], state: Any, visit: Callable[..., Any]) -> Any:
    """Steps 0 to n - 1 from ``state`` (``own`` the device's block, both varying over the
    ring's axes as the hops make them): each passes the block it holds on to the next device
    while ``visit(step, block, state) -> state`` works on it, at n = 2 in turn, beyond in one
    loop (so that, beside its own, a device holds two blocks at a time whatever n is)."""

    # Every step inside the loop, the own block's and the last's (whose hop is spent): with one
    # call site of the pass XLA keeps no buffers of a peeled step (its score tiles, its inputs'
    # copies into block order, its zero sums) alive across the loop. A while_loop, not
    # fori_loop's scan, whose unrolled steps XLA inlines slowly inside a custom partitioning
    # (Auto jax.jit)
    if ring.size == 2:  # two steps, no loop
        return visit(1, _send(own, ring), visit(0, own, state))

    def step(carry: Any) -> Any:
        i, held, state = carry
        return i + 1, _send(held, ring), visit(i, held, state)

    def cond(carry: Any) -> Any:
        return carry[0] < ring.size

    _, _, state = lax.while_loop(cond, step, (jnp.int32(0), own, state))
    return state


def forward(
    block_impl: BlockImpl,
    config: Any,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """(o in q's dtype, lse float32) of the whole sequence for the local queries: each step's
    (o, lse) combined by the online softmax (a row with no visible key anywhere: o 0, lse 0)."""
    step_fn = _Step(block_impl, config, FORWARD_KEY_ARGS, frozenset(), 3)
    index = lax.axis_index(_axis(config.ring))

    def visit(step: Any, keys: list[jax.Array], state: Any) -> Any:
        o_acc, lse_acc = state
        o, lse = step_fn.at([q, *keys], step, index)
        seen = _rows_seeing_keys(config, keys[2], step, index, q.shape[2])[:, None, :]
        lse = jnp.where(seen, lse, -jnp.inf)
        new = jnp.logaddexp(lse_acc, lse)
        finite = jnp.isfinite(new)
        rescale = lambda x: jnp.exp(jnp.where(finite, x - new, 0.0))[..., None]
        o_acc = jnp.where(finite[..., None], o_acc * rescale(lse_acc) + o * rescale(lse), 0.0)
        return o_acc, new

    start = (
        jnp.zeros((*q.shape[:3], v.shape[3]), F32),
        jnp.full(q.shape[:3], -jnp.inf, F32),
    )
    own, start = _varying_like(q, ([k, v, mask], start))
    o_acc, lse_acc = _circle(config.ring, own, start, visit)
    return o_acc.astype(q.dtype), jnp.where(jnp.isfinite(lse_acc), lse_acc, 0.0)


def linear(
    block_impl: BlockImpl,
    config: Any,
    args: Sequence[jax.Array],
    key_args: frozenset[int],
    key_results: frozenset[int],
    out_dtypes: Sequence[Any],
) -> tuple[jax.Array, ...]:
    """A pass that is a sum over key blocks (see the module) over the ring: ``args`` its
    arguments, ``key_args`` / ``key_results`` the positions of the key-side ones (the key mask at
    position 5), ``out_dtypes`` its results' dtypes."""
    ring = config.ring
    step_fn = _Step(block_impl, config, key_args, key_results, 5)
    index = lax.axis_index(_axis(ring))
    travelling = [i for i in range(len(args)) if i in key_args]

    def visit(step: Any, keys: list[jax.Array], state: Any) -> Any:
        held = dict(zip(travelling, keys, strict=True))
        out = step_fn.at([held.get(i, x) for i, x in enumerate(args)], step, index)
        query_sums, key_sums = state
        on_queries = [r for i, r in enumerate(out) if i not in key_results]
        on_keys = [r for i, r in enumerate(out) if i in key_results]
        # the held block's sums move on with it; the last step's hop takes them home
        return _add(query_sums, on_queries), _send(_add(key_sums, on_keys), ring)

    keys = [args[i] for i in travelling]
    sums = jax.eval_shape(lambda *a: step_fn.at(list(a), 0, 0), *args)
    zeros = [jnp.zeros(r.shape, r.dtype) for r in sums]
    start = (
        [z for i, z in enumerate(zeros) if i not in key_results],
        [z for i, z in enumerate(zeros) if i in key_results],
    )
    keys, start = _varying_like(args[0], (keys, start))
    query_sums, key_sums = _circle(ring, keys, start, visit)
    by_query, by_key = iter(query_sums), iter(key_sums)
    results = [next(by_key) if i in key_results else next(by_query) for i in range(len(out_dtypes))]
    return tuple(r.astype(dtype) for r, dtype in zip(results, out_dtypes, strict=True))


def _add(a: Sequence[jax.Array], b: Sequence[jax.Array]) -> list[jax.Array]:
    return [x + y for x, y in zip(a, b, strict=True)]


__all__ = ["FORWARD_KEY_ARGS", "LAYOUTS", "Layout", "Ring", "forward", "linear"]
