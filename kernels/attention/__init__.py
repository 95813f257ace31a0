"""Pallas TPU kernels for attention whose derivatives to second order are kernels.

Layout "bhtd": q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv); ``key_mask`` (B, Tk) int32,
1 = key valid. With valid_ij = key_mask[b, j] and (not causal or j <= i) (top-left aligned, as
``jax.nn.dot_product_attention``), S_ij = scale q_i.k_j and, for a row with a valid key,
L_i = log sum_{valid j} exp(S_ij), P_ij = valid_ij exp(S_ij - L_i); a row with no valid key has
L_i = 0, P_i. = 0 and O_i = 0 (no NaN, no inf).

    flash_forward(q, k, v, key_mask)                      -> o, lse
    flash_tangent(q, k, v, o, lse, key_mask, dq, dk, dv)  -> do, dlse      (the JVP)
    flash_vjp(q, k, v, o, lse, key_mask, g_o, g_lse)      -> g_q, g_k, g_v (its transpose)
    flash_tangent_jvp(q, k, v, o, lse, key_mask, dq, dk, dv, q_dot, k_dot, v_dot, o_dot, lse_dot)
                                                          -> (do, dlse) along the primal direction
    flash_vjp_jvp(q, k, v, o, lse, key_mask, g_o, g_lse, q_dot, k_dot, v_dot, o_dot, lse_dot)
                                                          -> (g_q, g_k, g_v) along it
    flash_second_vjp(q, k, v, o, lse, key_mask, dq, dk, dv, g_o, g_lse)
                                                          -> the gradient in (q, k, v, o, lse)
                                                             of <(g_o, g_lse), tangent(dq, dk, dv)>

The tangent, with P from the saved lse: Sdot_ij = scale (dq_i.k_j + q_i.dk_j),
mu_i = sum_j P_ij Sdot_ij, do_i = sum_j P_ij (Sdot_ij v_j + dv_j) - mu_i o_i, dlse_i = mu_i.
The VJP is its exact transpose (o is a saved value in both): delta_i = g_o_i.o_i,
dS_ij = P_ij (g_o_i.v_j - delta_i + g_lse_i), g_q = scale dS k, g_k = scale dS^T q, g_v = P^T g_o.
So transpose(vjp) = tangent: the pair closes under transposition. The three second-order
kernels are the derivatives of that pairing in (q, k, v, o, lse) (their own module docstrings
give the formulas; docs/kernels.md derives them): each transposes into another, so with the
first-order pair they close under transposition too.

Kernels are policy-free: the caller pads Tq and Tk to multiples of ``block_q`` and ``block_k``
(``tiling.blocks``) and marks padded keys invalid; padded rows of k and v must be
finite (zeros). Statistics and accumulators are float32 whatever the input dtype; matmuls run on
the MXU with float32 results, their operands in the inputs' dtype (P cast to v's dtype, as in
flash attention). Nothing Tq x Tk leaves VMEM.

Grids. Query-major kernels (forward, tangent, g_q): (B, H, Tq/bq, Tk/bk), the key blocks last
("arbitrary") with f32 VMEM scratch for the row statistics and the accumulator, written at the
last key block. Key-major kernel (g_k, g_v): (B, H, Tk/bk, Tq/bq), the query blocks last; it
computes the transposed score tile S^T (bk, bq) = k q^T, so the per-query statistics (lse,
delta - g_lse) broadcast along the sublanes straight from their lane-dense rows and every matmul
is an ordinary NN or NT one. Causal: a block strictly above the diagonal is skipped (``pl.when``)
and its index map repeats the last (query-major) or first (key-major) block that is used, so the
pipeline fetches nothing for it. Masks are ``broadcasted_iota`` comparisons and ``jnp.where``.

Row statistics in HBM are lane-dense rows: lse, dlse and delta - g_lse as (B, H, 1, Tq) blocks
(1, bq), the key mask as (B, 1, Tk) blocks (1, bk), which satisfy Mosaic's (8, 128) rule (the
second-minor block dim equals the array's 1). In VMEM the query-major kernels hold them as
(bq, 128) lane-broadcast columns, converted once per query block by a (128, bq) transpose.

Cost estimates (``pl.CostEstimate``), from the loop counts: with V = visited (query, key) block
pairs per (b, h) (nq * nk, or the blocks on or below the diagonal when causal) and
E = B * H * V * bq * bk the score elements computed,
    forward  flops 2 E (D + Dv),        transcendentals E + B H V bq (exp; rescale),
    tangent  flops 2 E (3 D + 2 Dv),    transcendentals E,
    g_q      flops 2 E (2 D + Dv),      transcendentals E,
    g_k, g_v flops 2 E (2 D + 2 Dv),    transcendentals E,
    tangent_jvp             2 E (7 D + 3 Dv),
    vjp_jvp, second_vjp     2 E (5 D + 2 Dv) query-major + 2 E (5 D + 3 Dv) key-major,
each second-order kernel one exp per score; bytes: the operands read once per block of the
grid's outer (resident) side, plus the streamed side once per visited block pair (B H V block
bytes), plus the outputs (``layout.tiled_call`` counts them from the operands' kinds).
"""

from .forward import flash_forward
from .second_vjp import flash_second_vjp
from .tangent import flash_tangent
from .tangent_jvp import flash_tangent_jvp
from .tiling import Blocks, blocks
from .vjp import flash_vjp
from .vjp_jvp import flash_vjp_jvp

__all__ = [
    "Blocks",
    "blocks",
    "flash_forward",
    "flash_second_vjp",
    "flash_tangent",
    "flash_tangent_jvp",
    "flash_vjp",
    "flash_vjp_jvp",
]
