"""Attention whose every derivative is blockwise (public face: ``fastgp.attention``).

    api.py        attention(q, k, v, ...): checks, padding, the bhtd layout, the blocks
    reference.py  naive_attention, the oracle every backend is held to
    config.py     the static parameters of one call (scale, causal, blocks, backend)
    xla.py        the XLA path: forward, JVP and VJP as blockwise jnp/lax loops, and JAX's
                  derivatives of them as the second-order passes
    rules.py      six primitives (the forward and five linear passes: tangent, vjp, tangent_jvp,
                  vjp_jvp, second_vjp) and the derivative rules that close them
    sharding.py   each primitive per device under shard_map, explicit and Auto sharding
    sequence.py   the token axis split over devices: the ring, the all-to-all or the all-gather
    ring.py       every pass as ring steps over the devices' key blocks
    permute.py    the ring's hop: ppermute on a channel of its own
    trade.py      the all-to-all's collectives: a token split traded for a head split and back
    partitioned.py  Auto-sharded jax.jit: each pass custom-partitioned, split tokens on the ring
                  or traded for heads
    zigzag.py     the load-balanced token layout of causal sequence parallelism
    binding.py    the primitives on the Pallas kernels of ``fastgp.kernels.attention`` (Mosaic on
                  TPU, Triton on GPU)

Tiling lives beside the kernels, in ``fastgp.kernels.attention.tiling``.
"""
