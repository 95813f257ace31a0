"""Plain jnp attention, the oracle: every T_q x T_k array materialised, differentiated by JAX.

Layout (B, T, H, D) as ``jax.nn.dot_product_attention``, k and v with K heads, K dividing H (query
head h reads key and value head h // (H / K)); ``key_mask`` (B, Tk) bool (True: a key to attend
to); ``is_causal`` lets query i see keys j <= i. A query row with no valid key gives
zeros (not the uniform average that a large negative bias would give).
"""

import jax
import jax.numpy as jnp


def naive_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float | None = None,
    mask: jax.Array | None = None,
    is_causal: bool = False,
) -> jax.Array:
    """(B, Tq, H, Dv) softmax(scale q kᵀ) v in q's dtype (see the module docstring) of q
    (B, Tq, H, D), k (B, Tk, K, D), v (B, Tk, K, Dv); ``mask`` is the (B, Tk) or (B, 1, 1, Tk)
    key-padding mask, True to attend, as ``fastgp.attention``'s."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, tq, h, d = q.shape
    groups = q.astype(jnp.float32).reshape(b, tq, k.shape[2], h // k.shape[2], d)
    s = scale * jnp.einsum("bqhgd,bkhd->bhgqk", groups, k.astype(jnp.float32))
    s = s.reshape(b, h, tq, k.shape[1])
    valid = jnp.ones(s.shape, bool)
    if mask is not None:
        keys = mask[:, 0, 0, :] if mask.ndim == 4 else mask
        valid = valid & keys[:, None, None, :]
    if is_causal:
        valid = valid & jnp.tril(jnp.ones(s.shape[-2:], bool))
    seen = jnp.any(valid, axis=-1)
    m = jax.lax.stop_gradient(jnp.max(jnp.where(valid, s, -jnp.inf), axis=-1))
    m = jnp.where(seen, m, 0.0)
    e = jnp.where(valid, jnp.exp(jnp.where(valid, s - m[..., None], 0.0)), 0.0)
    total = jnp.sum(e, axis=-1)
    p = e / jnp.where(seen, total, 1.0)[..., None]
    p = p.reshape(b, k.shape[2], h // k.shape[2], tq, k.shape[1])
    o = jnp.einsum("bhgqk,bkhd->bqhgd", p, v.astype(jnp.float32))
    return o.reshape(b, tq, h, v.shape[-1]).astype(q.dtype)


__all__ = ["naive_attention"]
