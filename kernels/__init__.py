"""Pallas kernels, grouped by op (installed as ``fastgp.kernels``).

    penalty/     per-sample float32 sums of squares of a gradient leaf
      tpu.py       row_sumsq (B, D) and lane_sumsq (..., S, B): Mosaic, grid (P, K)
      gpu.py       row_sumsq: Triton, grid (B, spans of a row)
      mosaic_gpu.py  row_sumsq: Mosaic GPU, the same grid (JAX 0.11 and later, Hopper and newer)
      spans.py     Split, splits: the GPU kernels' spans
      tiling.py    Blocks, row_blocks, lane_blocks per TPU generation
    attention/   flash attention whose derivatives to second order are kernels ("bhtd" layout)
      forward.py      flash_forward: o and the log-sum-exp
      tangent.py      flash_tangent: the JVP at the saved o, lse
      vjp.py          flash_vjp: g_q (query-major) and g_k, g_v (key-major), the tangent's transpose
      tangent_jvp.py  flash_tangent_jvp: the tangent's derivative in (q, k, v, o, lse)
      vjp_jvp.py      flash_vjp_jvp: the VJP's derivative in (q, k, v, o, lse)
      second_vjp.py   flash_second_vjp: the VJP of the tangent (and of the VJP) in them
      layout.py       the grid layout, block specs, row helpers and cost counts all share
      tiling.py    Blocks, blocks per TPU generation
      gpu.py          the six passes as Triton kernels
      gpu_tiling.py   gpu_blocks and those kernels' default launch (no Triton import)
    tiling.py    register geometry and chip figures every family's tiling reads
    types.py     Ref and Interpret

Kernels only: no dispatch policy, no validation beyond what a kernel needs, and blocks always come
from the caller. Relative imports only: this package imports nothing from ``fastgp``. The ops that
call these kernels live in ``fastgp`` (``fastgp.penalty``, ``fastgp.attention``).
"""
