"""Attention whose every derivative is blockwise (public face: ``fastgp.attention``).

    api.py        attention(q, k, v, ...): checks, padding, the bhtd layout, the blocks
    reference.py  naive_attention, the oracle every backend is held to
    config.py     the static parameters of one call (scale, causal, blocks, backend)
    xla.py        the XLA path: forward, JVP and VJP as blockwise jnp/lax loops
    rules.py      three primitives (forward, tangent, vjp) and the derivative rules that close them
    sharding.py   each primitive per device under shard_map, explicit and Auto sharding
    binding.py    the primitives on the Pallas kernels of ``fastgp.kernels.attention``

Tiling lives beside the kernels, in ``fastgp.kernels.attention.tiling``.
"""
