"""``fastgp.attention``: flash attention with every derivative, so penalties can go through it.

    attention(q, k, v, *, scale=None, mask=None, is_causal=False, backend="auto",
              sample_axis_name=None, **flax_keywords) -> (B, Tq, H, Dv)

q (B, Tq, H, D), k (B, Tk, K, D), v (B, Tk, K, Dv), as ``jax.nn.dot_product_attention``: K = H,
or K dividing H for grouped-query attention (query head h reads key and value head h // (H / K);
k and v are repeated to H heads before the passes, H / K times their memory, after the
all-to-all where it trades their heads); bfloat16, float16 or float32, with softmax statistics
and accumulators in float32. ``mask`` is a key-padding mask: (B, Tk) or (B, 1, 1, Tk) booleans,
True for a key to attend to. ``is_causal`` lets query i see keys j <= i. A query with no key to
attend to gets zeros.

The forward, its JVP, its VJP and every higher derivative run blockwise over key blocks: no
T_q x T_k array is written to memory (``fastgp._attention.rules``). With the token axis split over
devices (``sample_axis_name`` inside ``shard_map``, explicit axes, or an Auto-sharded
``jax.jit``) each device keeps its queries and the key and value blocks go around a ring, or an
all-to-all trades the token split for a head split, or the keys are gathered
(``fastgp._attention.sequence``, ``fastgp._attention.partitioned``). Flax's
``attention_fn`` keywords are named in the signature, so ``nnx.MultiHeadAttention`` and Linen's
``MultiHeadDotProductAttention`` pass them; dropout on the attention weights and a bias are
refused.
"""

from typing import Any

import jax
import jax.numpy as jnp

from fastgp import _backends as backends
from fastgp._attention import sequence, sharding
from fastgp._attention.config import Scheme
from fastgp._attention.padded import attend, shared_heads
from fastgp._attention.ring import Layout
from fastgp._sharding import mode_of, spec_of
from fastgp._typing import AxisName
from fastgp.distributed import collective_axes


def _check_inputs(q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.ndim(x) != 4:
            raise ValueError(
                f"fastgp.attention: {name} must be (batch, tokens, heads, head_dim), got shape "
                f"{jnp.shape(x)}"
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"fastgp.attention: {name} must be floating point, got {x.dtype}")
    if 0 in (*q.shape[1:], *k.shape[1:], *v.shape[1:]):
        raise ValueError(
            "fastgp.attention: empty tokens, heads or head dims (q "
            f"{q.shape}, k {k.shape}, v {v.shape}); every axis but the batch needs a length >= 1"
        )
    (b, _, h, d), (bk, tk, hk, dk), (bv, tv, hv, _) = q.shape, k.shape, v.shape
    if not (b == bk == bv and tk == tv and d == dk and hk == hv and h % hk == 0):
        raise ValueError(
            "fastgp.attention: expected q (B, Tq, H, D), k (B, Tk, K, D), v (B, Tk, K, Dv) with "
            f"K = H or K dividing H (grouped-query attention); got q {q.shape}, k {k.shape}, "
            f"v {v.shape}"
        )
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(
            f"fastgp.attention: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )


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


def _refuse_unsupported(
    bias: jax.Array | None,
    dropout_rate: float,
    deterministic: bool,
    precision: Any,
    module: Any,
    einsums: tuple[Any, Any],
) -> None:
    """Flax's attention_fn keywords: accept what changes nothing, refuse what would be ignored."""
    if bias is not None:
        raise ValueError("fastgp.attention: an attention bias is not supported (use mask)")
    if dropout_rate and not deterministic:
        raise ValueError(
            f"fastgp.attention: dropout on the attention weights (dropout_rate={dropout_rate}) is "
            "not supported; a gradient penalty needs a deterministic critic (deterministic=True)"
        )
    if module is not None:
        raise ValueError(
            "fastgp.attention never forms the attention weights, so a module cannot sow them "
            "(sow_weights=False)"
        )
    if precision is not None:
        raise ValueError(
            f"fastgp.attention: precision={precision!r} is not supported; the matmuls run in the "
            "inputs' dtype with float32 accumulation (pass dtype=jnp.float32 for float32 inputs)"
        )
    if any(e is not None for e in einsums):
        raise ValueError(
            "fastgp.attention: custom qk_attn_weights_einsum / attn_weights_value_einsum are not "
            "supported; the attention weights are never formed"
        )


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float | None = None,
    mask: jax.Array | None = None,
    is_causal: bool = False,
    backend: str = "auto",
    sample_axis_name: AxisName = None,
    sequence_parallel: Scheme = "auto",
    sequence_layout: Layout = "contiguous",
    bias: jax.Array | None = None,
    dropout_rng: jax.Array | None = None,
    dropout_rate: float = 0.0,
    broadcast_dropout: bool = True,
    deterministic: bool = True,
    dtype: Any = None,
    precision: Any = None,
    module: Any = None,
    force_fp32_for_softmax: bool = False,
    qk_attn_weights_einsum: Any = None,
    attn_weights_value_einsum: Any = None,
) -> jax.Array:
    """softmax(scale · q kᵀ, masked) v per head: (B, Tq, H, Dv) in q's dtype (see the module).

    q, k, v: (B, Tq, H, D), (B, Tk, K, D), (B, Tk, K, Dv) floats, K = H or, grouped-query, K
    dividing H (of each device's heads inside shard_map); ``scale`` 1/sqrt(D) by default;
    ``mask``: (B, Tk) or (B, 1, 1, Tk) bool key padding, True to attend; ``is_causal``: query i
    sees keys j <= i; ``backend``: "auto" (the kernels when traced for a TPU, or an NVIDIA GPU
    with head dims up to 128, where they run per device, else XLA; or what
    ``fastgp.attention_backend`` sets), "pallas" (Mosaic kernels on TPU, Triton kernels on GPU),
    "interpret", "tpu-interpret" or "gpu-interpret" (the kernels on CPU), "xla" (blockwise
    loops); ``sample_axis_name``: inside shard_map, the mesh axes the tokens are split over
    (under explicit axes the arrays' types say so); ``sequence_parallel``: "auto" (the all-to-all
    where it applies; with the tokens on several axes, the all-to-all over the last ones it can
    and the ring over the rest; else the ring), "ring", "all-to-all" (each device's heads a
    multiple of the token shards, else ValueError, in JAX's runtime error under Auto jit) or
    "all-gather" (under Auto ``jax.jit``, XLA's partitioner gathers the tokens);
    ``sequence_layout``: "contiguous" or "zigzag" (see ``fastgp.to_zigzag``). The rest are
    Flax's attention_fn keywords, named so that Linen passes them: ``dtype`` casts q, k, v;
    dropout (unless deterministic), a bias, a module to sow into, a precision and custom einsums
    raise ValueError.
    """
    del dropout_rng, broadcast_dropout, force_fp32_for_softmax  # no effect without dropout
    einsums = (qk_attn_weights_einsum, attn_weights_value_einsum)
    _refuse_unsupported(bias, dropout_rate, deterministic, precision, module, einsums)
    if dtype is not None:
        q, k, v = (x.astype(dtype) for x in (q, k, v))
    _check_inputs(q, k, v)
    batch, _, _, d = q.shape
    options = sequence.Options(
        scale=float(d**-0.5 if scale is None else scale),
        backend=backends.resolve("attention", backend, lambda: _auto_takes_kernels(q, k, v)),
    )
    key_mask = None if mask is None else key_mask_of(mask, batch, k.shape[1])
    split = {"scheme": sequence_parallel, "layout": sequence_layout}
    return _split_or_local(
        q, k, v, key_mask, collective_axes(sample_axis_name), bool(is_causal), split, options
    )


def _split_or_local(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array | None,
    axes: tuple[str, ...],
    causal: bool,
    split: dict[str, Any],
    options: sequence.Options,
) -> jax.Array:
    """The tokens split over ``axes`` (shard_map) or over sharded explicit axes, by ``split``'s
    scheme and layout; else one device's attention."""
    if axes:
        return sequence.in_shard_map(q, k, v, key_mask, axes, causal=causal, **split, **options)
    if mode_of(q, "fastgp.attention") == "explicit" and spec_of(q)[1] is not None:
        k, v = shared_heads(k, v, q.shape[2])  # k and v then split their heads as q does
        return sequence.explicit(q, k, v, key_mask, causal=causal, **split, **options)
    _check_unsplit(split, causal)
    if key_mask is None:
        key_mask = jnp.ones((q.shape[0], k.shape[1]), bool)
    return attend(q, k, v, key_mask, causal=causal, scheme=split["scheme"], **options)


def _check_unsplit(split: dict[str, Any], causal: bool) -> None:
    """The scheme and layout are known; a zigzag layout is refused where the arrays are the whole
    sequence in order (one device, or an Auto-sharded program, whose ring is contiguous)."""
    sequence.check_known(split["scheme"], split["layout"])
    if causal and split["layout"] == "zigzag":
        raise ValueError(
            "fastgp.attention: sequence_layout='zigzag' says how each device holds its tokens "
            "inside shard_map (sample_axis_name) or under explicit axes with the tokens sharded; "
            "here q, k and v are the whole sequence in order, so causal masking would be wrong. "
            "Pass the tokens in order with sequence_layout='contiguous' (an Auto-sharded "
            "program splits them over the ring contiguously), or split them in one of those ways."
        )


# The largest head dim (D and Dv) the Triton kernels were checked with on a GPU.
GPU_VERIFIED_HEAD_DIM = 128


def _auto_takes_kernels(q: jax.Array, k: jax.Array, v: jax.Array) -> bool:
    """Whether ``backend="auto"``, where it chooses the kernels, may run them on these operands:
    each device holds whole samples and heads, and on a GPU the head dims are ones the Triton
    kernels were checked with there (larger ones run XLA's loops)."""
    if backends.platform() == "cuda" and max(q.shape[-1], v.shape[-1]) > GPU_VERIFIED_HEAD_DIM:
        return False
    return sharding.kernels_run_per_device(q, k, v)


__all__ = ["attention", "key_mask_of"]
