"""benchmarks.attention.step_time: the arms compute one loss, and the table reads the results."""

import functools

import jax
import numpy as np
import pytest

from benchmarks.attention import step_time


def test_the_critic_equals_itself_through_each_attention():
    """The three arms' critics agree on a small image (16 tokens), scores and input gradients."""
    specs = {name: step_time.spec(16, fn) for name, fn in step_time.ATTENTIONS.items()}
    params = specs["fastgp"].model.init(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 16, 3))
    outs = {}
    for name, spec in specs.items():
        score = functools.partial(spec.model.apply, params)
        outs[name] = (score(x), jax.grad(lambda x, s=score: s(x).sum())(x))
    for name in step_time.OTHERS:
        for got, want in zip(outs["fastgp"], outs[name], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_tokens_that_tile_no_square_image_are_refused():
    with pytest.raises(ValueError, match="squares"):
        step_time.measure(300, rounds=1)


def test_arms_that_disagree_are_refused():
    step_time.check_agree({"fastgp": 1.0, "jax": 1.00001, "flax": 0.99999})
    with pytest.raises(AssertionError, match="different losses"):
        step_time.check_agree({"fastgp": 1.0, "jax": 1.0, "flax": 1.01})


def test_the_table_gives_each_arm_and_fastgp_s_ratios():
    row = {"tokens": 1024, "fastgp": 3.0, "jax": 4.0, "flax": 2.5}
    row |= {"over_jax": 0.75, "over_flax": 1.2}
    lines = step_time.table({"rows": [row]})
    assert lines[2] == "| 1,024 | 3,000 | 4,000 | 2,500 | 0.75x | 1.20x |"
    assert "fastgp over Flax's" in lines[0]
