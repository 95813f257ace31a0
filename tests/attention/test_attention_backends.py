"""Every backend of fastgp.attention equals the oracle: one case set over the op's backends.

The backends are the op's own list, ``fastgp._backends.OP_BACKENDS["attention"]``, less
``"pallas"``, which needs a TPU or a GPU (tests/attention/test_attention_kernels.py compiles the
TPU kernels for TPU generations, tests/attention/test_attention_gpu_kernels.py lowers the Triton
kernels for CUDA). Each case
compiles the value and every derivative the penalty and nested autodiff take (JVP, VJP, both
Hessian-vector products, reverse-over-forward) as one program and compares them with
``fastgp.naive_attention``'s, on the cases that reach every masking path.
"""

import pytest
from test_attention import BACKEND_CASES, RTOL, case_id, derivatives, inputs, pair, rel_err

from fastgp._backends import OP_BACKENDS

# TPU interpret mode under jax.jit: lowering the attention primitives fails with a KeyError on
# the kernels' OrderedIOEffect (the primitives do not declare the effect of their io callbacks).
# Eagerly it runs; strict, so that a fix shows here.
NOT_UNDER_JIT = pytest.mark.xfail(
    raises=KeyError, strict=True, reason="tpu-interpret attention does not lower under jax.jit"
)
BACKENDS = [
    pytest.param(b, marks=NOT_UNDER_JIT) if b == "tpu-interpret" else b
    for b in OP_BACKENDS["attention"]
    if b != "pallas"
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", BACKEND_CASES, ids=case_id)
def test_every_derivative_matches_nested_autodiff(case, backend):
    b, tq, tk, h, d, causal, padding = case
    args, mask, tangents = inputs(b, tq, tk, h, d, padding=padding)
    ours, naive = pair(mask, causal, backend)
    got, want = derivatives(ours, args, tangents), derivatives(naive, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name
