"""``fastgp.attention``: flash attention with every derivative, so penalties can go through it.

    attention(q, k, v, *, scale=None, mask=None, is_causal=False, backend="auto") -> (B, Tq, H, Dv)

q (B, Tq, H, D), k (B, Tk, H, D), v (B, Tk, H, Dv), as ``jax.nn.dot_product_attention``;
bfloat16, float16 or float32, with softmax statistics and accumulators in float32. ``mask`` is a
key-padding mask: (B, Tk) or (B, 1, 1, Tk) booleans, True for a key to attend to. ``is_causal``
lets query i see keys j <= i. A query with no key to attend to gets zeros.

The forward, its JVP, its VJP and every higher derivative run blockwise over key blocks: no
T_q x T_k array is written to memory (``fastgp._attention.rules``). The keyword arguments that
Flax passes to an ``attention_fn`` are accepted, so ``nnx.MultiHeadAttention(...,
attention_fn=fastgp.attention)`` works; dropout on the attention weights and a bias are refused.
"""

from typing import Any

import jax
import jax.numpy as jnp
from einops import rearrange

from fastgp import _backends as backends
from fastgp._attention import rules
from fastgp._attention.binding import blocks as kernel_blocks
from fastgp._attention.config import Config
from fastgp._typing import Backend
from fastgp.kernels.tiling import round_up

XLA_BLOCK = 512  # queries and keys per step of the blockwise loops: (512, 512) score tiles


def _check_inputs(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.ndim(x) != 4:
            raise ValueError(
                f"fastgp.attention: {name} must be (batch, tokens, heads, head_dim), got shape "
                f"{jnp.shape(x)}"
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"fastgp.attention: {name} must be floating point, got {x.dtype}")
    (b, _, h, d), (bk, tk, hk, dk), (bv, tv, hv, _) = q.shape, k.shape, v.shape
    if not (b == bk == bv and h == hk == hv and tk == tv and d == dk):
        raise ValueError(
            "fastgp.attention: expected q (B, Tq, H, D), k (B, Tk, H, D), v (B, Tk, H, Dv); got "
            f"q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(
            f"fastgp.attention: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"fastgp.attention: empty sequence (q {q.shape}, k {k.shape})")


def key_mask_of(mask: jax.Array | None, batch: int, tk: int) -> jax.Array:
    """(B, Tk) bool from a (B, Tk) or (B, 1, 1, Tk) key-padding mask (all True for None)."""
    if mask is None:
        return jnp.ones((batch, tk), bool)
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise ValueError(f"fastgp.attention: mask must be boolean (True: attend), got {mask.dtype}")
    if mask.ndim == 4 and mask.shape[1] == mask.shape[2] == 1:
        mask = mask[:, 0, 0, :]
    if mask.ndim != 2 or mask.shape[1] != tk or mask.shape[0] not in (1, batch):
        raise ValueError(
            f"fastgp.attention: mask of shape {mask.shape} is not a key-padding mask; expected "
            f"({batch}, {tk}) or ({batch}, 1, 1, {tk}). Per-query masks would need a T_q x T_k "
            "array; use is_causal=True for causal masking"
        )
    return jnp.broadcast_to(mask, (batch, tk))


def _refuse_unsupported(flax_kwargs: dict[str, Any]) -> None:
    """Flax's attention_fn keywords: accept what changes nothing, refuse what would be ignored."""
    known = {
        "bias",
        "broadcast_dropout",
        "dropout_rng",
        "dropout_rate",
        "deterministic",
        "dtype",
        "precision",
        "module",
    }
    unknown = set(flax_kwargs) - known
    if unknown:
        raise TypeError(f"fastgp.attention got unexpected keyword arguments {sorted(unknown)}")
    if flax_kwargs.get("bias") is not None:
        raise ValueError("fastgp.attention: an attention bias is not supported (use mask)")
    rate = flax_kwargs.get("dropout_rate", 0.0)
    if rate and not flax_kwargs.get("deterministic", True):
        raise ValueError(
            f"fastgp.attention: dropout on the attention weights (dropout_rate={rate}) is not "
            "supported; a gradient penalty needs a deterministic critic (deterministic=True)"
        )
    if flax_kwargs.get("module") is not None:
        raise ValueError(
            "fastgp.attention never forms the attention weights, so a module cannot sow them "
            "(sow_weights=False)"
        )


def _blocks(backend: Backend, tq: int, tk: int, d: int, itemsize: int) -> tuple[int, int]:
    """(block_q, block_k): the kernel's tiling, or the XLA loop's keys per step."""
    if backend == "xla":
        return min(XLA_BLOCK, round_up(tq, 8)), min(XLA_BLOCK, round_up(tk, 8))
    return kernel_blocks(backend, tq, tk, d, itemsize)


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float | None = None,
    mask: jax.Array | None = None,
    is_causal: bool = False,
    backend: str = "auto",
    **flax_kwargs: Any,
) -> jax.Array:
    """softmax(scale · q kᵀ, masked) v per head: (B, Tq, H, Dv) in q's dtype (see the module).

    Args:
      q, k, v: (B, Tq, H, D), (B, Tk, H, D), (B, Tk, H, Dv) float arrays.
      scale: the score scale, 1/sqrt(D) by default.
      mask: (B, Tk) or (B, 1, 1, Tk) bool key-padding mask, True to attend.
      is_causal: query i attends to keys j <= i.
      backend: ``"auto"`` (XLA today, or what ``fastgp.attention_backend`` sets), ``"pallas"``
        (Mosaic TPU kernels), ``"interpret"`` or ``"tpu-interpret"`` (the kernels on CPU) or
        ``"xla"`` (the blockwise jnp loops).
      **flax_kwargs: the rest of Flax's ``attention_fn`` keywords (``dtype`` casts q, k, v).
    """
    _refuse_unsupported(flax_kwargs)
    if flax_kwargs.get("dtype") is not None:
        q, k, v = (x.astype(flax_kwargs["dtype"]) for x in (q, k, v))
    _check_inputs(q, k, v)
    resolved = backends.resolve("attention", backend)
    batch, tq, _, d = q.shape
    tk = k.shape[1]
    key_mask = key_mask_of(mask, batch, tk)
    scale = float(d**-0.5 if scale is None else scale)
    block_q, block_k = _blocks(resolved, tq, tk, d, jnp.dtype(q.dtype).itemsize)
    tq_pad, tk_pad = round_up(tq, block_q), round_up(tk, block_k)

    def padded(x: jax.Array, length: int) -> jax.Array:
        x = rearrange(x, "b t h d -> b h t d")
        return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))

    key_mask = jnp.pad(key_mask, ((0, 0), (0, tk_pad - tk)))
    config = Config(scale, bool(is_causal), block_q, block_k, resolved)
    o, _ = rules.attention_with_lse(
        padded(q, tq_pad), padded(k, tk_pad), padded(v, tk_pad), key_mask, config
    )
    return rearrange(o[:, :, :tq], "b h t d -> b t h d")


__all__ = ["attention", "key_mask_of"]
