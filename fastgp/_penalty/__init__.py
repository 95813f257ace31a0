"""The gradient penalty op (public face: ``fastgp.penalty``).

    api.py           gradient_penalty, penalty_from_grads, grad_norms, interpolate, ...
    reference.py     the naive jnp penalty, the oracle every backend is held to
    kinds.py         the penalty kinds: p(n) and dp/dn on the per-sample norms
    xla.py           the XLA path: per-sample sums of squares in plain jnp
    rowops.py        per-sample norms and penalties with their exact jnp JVP (derivative rules)
    second_order.py  the reverse-over-forward custom_vjp (VJP of a JVP of the critic)
    sharding.py      the kernels per device under shard_map, explicit and Auto sharding
    binding.py       which kernel reads which leaf, per backend and platform
    validation.py    every bad input gets an error naming it

Tiling lives beside the kernels, in ``fastgp.kernels.penalty.tiling``.
"""
