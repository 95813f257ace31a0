"""fastgp.attention as Flax's attention_fn, in Linen and in NNX: the keywords each passes reach
it (Linen passes only those the signature names), the refusals fire, and the output equals
Flax's own attention where fastgp accepts the call."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx

import fastgp

B, T, FEATURES, HEADS = 2, 12, 16, 2


def tokens():
    return jax.random.normal(jax.random.PRNGKey(0), (B, T, FEATURES))


def linen_attention(attention_fn, **kwargs):
    module = linen.MultiHeadDotProductAttention(
        num_heads=HEADS, qkv_features=FEATURES, attention_fn=attention_fn, **kwargs
    )
    params = module.init(jax.random.PRNGKey(1), tokens(), deterministic=True)
    return module, params


def test_linen_output_equals_flax_attention_when_deterministic():
    ours, params = linen_attention(fastgp.attention, dropout_rate=0.5)
    theirs, _ = linen_attention(linen.dot_product_attention, dropout_rate=0.5)
    got = ours.apply(params, tokens(), deterministic=True)
    want = theirs.apply(params, tokens(), deterministic=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_linen_dropout_on_the_attention_weights_is_refused():
    module, params = linen_attention(fastgp.attention, dropout_rate=0.5)
    with pytest.raises(ValueError, match="dropout"):
        module.apply(params, tokens(), deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)})


def test_linen_dtype_casts_the_inputs():
    module, params = linen_attention(fastgp.attention, dtype=jnp.bfloat16)
    assert module.apply(params, tokens(), deterministic=True).dtype == jnp.bfloat16


def test_linen_passes_every_keyword_fastgp_names():
    """Linen filters its attention keywords by the attention_fn's signature: a spy with
    fastgp.attention's signature receives them all, so the refusals can fire."""
    seen = {}
    signature = inspect.signature(fastgp.attention)

    def spy(q, k, v, **kwargs):
        seen.update(kwargs)
        return linen.dot_product_attention(q, k, v)

    spy.__signature__ = signature  # type: ignore[attr-defined]
    module, params = linen_attention(spy, dropout_rate=0.1)
    module.apply(params, tokens(), deterministic=True)
    assert {"dropout_rate", "deterministic", "dtype", "precision", "mask"} <= set(seen)
    assert seen["dropout_rate"] == 0.1 and seen["deterministic"] is True


def nnx_attention(**kwargs):
    return nnx.MultiHeadAttention(
        num_heads=HEADS,
        in_features=FEATURES,
        attention_fn=fastgp.attention,
        decode=False,
        rngs=nnx.Rngs(0),
        **kwargs,
    )


def test_nnx_dropout_refused_deterministic_accepted():
    module = nnx_attention(dropout_rate=0.5)
    with pytest.raises(ValueError, match="dropout"):
        module(tokens(), deterministic=False, rngs=nnx.Rngs(dropout=1))
    assert module(tokens(), deterministic=True).shape == (B, T, FEATURES)


def test_nnx_dtype_and_a_bias_and_a_precision():
    assert nnx_attention(dtype=jnp.bfloat16)(tokens(), deterministic=True).dtype == jnp.bfloat16
    q = jnp.ones((B, T, HEADS, 8))
    with pytest.raises(ValueError, match="bias"):
        fastgp.attention(q, q, q, bias=jnp.zeros((B, HEADS, T, T)))
    with pytest.raises(ValueError, match="precision"):
        fastgp.attention(q, q, q, precision=jax.lax.Precision.HIGHEST)
