"""On a CUDA device only: fastgp.attention's Triton kernels run natively and match naive attention.

Float32 under ``jax.default_matmul_precision("highest")`` (without it a GPU multiplies float32 in
TF32, the kernels and XLA alike), every derivative the penalty and nested autodiff take; and the
WGAN-GP penalty through a transformer critic in float32 against the float64 truth, both second
orders, beside the naive penalty in float32 (``FLOAT32_TOL``, from the CPU runs).
"""

import jax
import pytest
from test_attention import BACKEND_CASES, RTOL, case_id, derivatives, inputs, pair, rel_err
from test_attention_penalty import (
    FLOAT32_TOL,
    assert_near_truth,
    compiled_value_grad_hvp,
    data,
    naive,
    ours,
    penalty_fn,
)

import fastgp

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU")


@pytest.mark.parametrize("case", BACKEND_CASES, ids=case_id)
def test_every_derivative_on_the_device_matches_nested_autodiff(case):
    b, tq, tk, h, d, causal, padding = case
    args, mask, tangents = inputs(b, tq, tk, h, d, padding=padding)
    ours_fn, naive_fn = pair(mask, causal, "pallas")
    with jax.default_matmul_precision("highest"):
        got, want = derivatives(ours_fn, args, tangents), derivatives(naive_fn, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name


@pytest.mark.parametrize("second_order", ["reverse-over-forward", "reverse"])
def test_penalty_through_attention_on_the_device_equals_naive(second_order):
    params, x, direction = data()
    with jax.default_matmul_precision("highest"):
        got = compiled_value_grad_hvp(
            penalty_fn(ours("pallas"), fastgp.gradient_penalty, second_order=second_order),
            params,
            x,
            direction,
        )
        naive_got = compiled_value_grad_hvp(
            penalty_fn(naive(), fastgp.naive_gradient_penalty), params, x, direction
        )
    assert_near_truth(got, "wgan-gp", tol=FLOAT32_TOL)
    assert_near_truth(naive_got, "wgan-gp", tol=FLOAT32_TOL)
