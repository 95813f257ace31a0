"""One device's attention: the bhtd layout, padding to whole blocks, and the primitives' call.

    attend(q, k, v, key_mask, *, scale, causal, backend, q_offset=0, ring=None, scheme="auto")
        -> (B, Tq, H, Dv)

q (B, Tq, H, D), k (B, Tk, K, D), v (B, Tk, K, Dv) with K dividing H (grouped-query: query head h
reads key and value head h // (H / K); ``shared_heads`` repeats them to H heads before the
passes) and the (B, Tk) bool key mask, checked by the caller; ``backend`` is resolved ("xla" or
a kernel backend). ``q_offset`` is the first query's position among the keys (a sequence shard's
start; causal masking only).
"""

import math
from dataclasses import replace

import jax
import jax.numpy as jnp
from einops import rearrange

from fastgp._attention import rules
from fastgp._attention.binding import blocks as kernel_blocks
from fastgp._attention.config import Config, Scheme
from fastgp._attention.ring import Ring
from fastgp._typing import Backend
from fastgp.kernels.tiling import round_up

XLA_BLOCK = 512  # queries and keys per step of the blockwise loops: (512, 512) score tiles


def _blocks(backend: Backend, tq: int, tk: int, d: int, itemsize: int) -> tuple[int, int]:
    """(block_q, block_k): the kernel's tiling, or the XLA loop's keys per step."""
    if backend == "xla":
        return min(XLA_BLOCK, round_up(tq, 8)), min(XLA_BLOCK, round_up(tk, 8))
    return kernel_blocks(backend, tq, tk, d, itemsize)


def _padded(x: jax.Array, length: int) -> jax.Array:
    """(B, T, H, D) -> (B, H, length, D), zeros after T."""
    x = rearrange(x, "b t h d -> b h t d")
    return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))


def shared_heads(k: jax.Array, v: jax.Array, heads: int) -> tuple[jax.Array, jax.Array]:
    """Grouped-query k and v (B, Tk, K, ·) with each head repeated H / K times, so that query
    head h reads key and value head h // (H / K), as ``jax.nn.dot_product_attention``'s; their
    derivatives sum over each group."""
    group = heads // k.shape[2]
    if group == 1:
        return k, v

    # (B, T, K, 1, D) -> (B, T, K, G, D) -> (B, T, K G, D): under explicit axes a sharded K
    # stays sharded, each device's key heads beside the query heads that read them
    def repeated(x: jax.Array) -> jax.Array:
        b, t, kv_heads, d = x.shape
        return jnp.broadcast_to(x[:, :, :, None], (b, t, kv_heads, group, d)).reshape(
            b, t, heads, d
        )

    return repeated(k), repeated(v)


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    scale: float,
    causal: bool,
    backend: Backend,
    q_offset: int = 0,
    ring: Ring | None = None,
    scheme: Scheme = "auto",
) -> jax.Array:
    """(B, Tq, H, Dv) in q's dtype: the attention of these arrays on this device (see module),
    or with ``ring`` of the whole sequence split over its mesh axes (q, k, v and the mask this
    device's slice; with the "zigzag" layout its two chunks, each padded to whole blocks).
    ``scheme``: how an Auto-sharded program attends split tokens (``Config``)."""
    k, v = shared_heads(k, v, q.shape[2])
    tq, d, tk = q.shape[1], q.shape[3], k.shape[1]
    itemsize = jnp.dtype(q.dtype).itemsize
    if ring is not None and ring.layout == "zigzag":
        chunk = tq // 2
        block_q, block_k = _blocks(backend, chunk, chunk, d, itemsize)
        padded = round_up(chunk, math.lcm(block_q, block_k))
        config = Config(scale, causal, block_q, block_k, backend, 0, replace(ring, chunk=padded))
        q, k, v = (_chunks_padded(x, chunk, padded) for x in (q, k, v))
        mask = jnp.concatenate(
            [_pad_tokens(key_mask[:, :chunk], padded), _pad_tokens(key_mask[:, chunk:], padded)],
            axis=1,
        )
        o, _ = rules.attention_with_lse(q, k, v, mask, config)
        o = jnp.concatenate([o[:, :, :chunk], o[:, :, padded : padded + chunk]], axis=2)
        return rearrange(o, "b h t d -> b t h d")
    block_q, block_k = _blocks(backend, tq, tk, d, itemsize)
    if ring is not None and causal:  # queries and keys on one grid: the first step is causal
        tq_pad = tk_pad = round_up(tq, math.lcm(block_q, block_k))
    else:
        tq_pad, tk_pad = round_up(tq, block_q), round_up(tk, block_k)
    key_mask = jnp.pad(key_mask, ((0, 0), (0, tk_pad - tk)))
    config = Config(scale, causal, block_q, block_k, backend, q_offset, ring, scheme)
    o, _ = rules.attention_with_lse(
        _padded(q, tq_pad), _padded(k, tk_pad), _padded(v, tk_pad), key_mask, config
    )
    return rearrange(o[:, :, :tq], "b h t d -> b t h d")


def _pad_tokens(mask: jax.Array, length: int) -> jax.Array:
    """(B, T) key mask -> (B, length), False after T."""
    return jnp.pad(mask, ((0, 0), (0, length - mask.shape[1])))


def _chunks_padded(x: jax.Array, chunk: int, length: int) -> jax.Array:
    """(B, 2 chunk, H, D) -> (B, H, 2 length, D): each half padded with zeros to ``length``."""
    return jnp.concatenate([_padded(x[:, :chunk], length), _padded(x[:, chunk:], length)], axis=2)


__all__ = ["XLA_BLOCK", "attend", "shared_heads"]
