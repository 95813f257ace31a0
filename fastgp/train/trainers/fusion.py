"""Whether ``Trainer.run`` fuses its iterations into one ``lax.scan`` by default, on a platform.

    network_primitives(generator, critic, config) -> frozenset of primitive names
    default_fused(platform, generator, critic, config) -> bool

Fused everywhere, except on CPU for networks with a primitive of :data:`LOOP_SLOW_ON_CPU`
(convolutions): XLA:CPU lays out the weight-gradient convolutions inside a loop body for a slow
path, so those networks run one compiled iteration per dispatch there
(``fastgp.train.trainers.trainer`` has both ways; docs/trainer.md the measurements).
"""

from typing import Any

import jax
import jax.numpy as jnp

from fastgp.train.config import TrainConfig
from fastgp.train.models.networks import Model

# Primitives XLA:CPU runs several times slower inside a loop body (``lax.scan``, ``lax.cond``)
# than at the top level of a program; a network that holds one runs unfused on CPU by default.
LOOP_SLOW_ON_CPU = frozenset({"conv_general_dilated"})


def network_primitives(generator: Model, critic: Model, config: TrainConfig) -> frozenset[str]:
    """The names of the primitives in ``critic(generator(z))`` under ``config`` (nested calls
    included), traced on abstract values: nothing is initialised or computed. Convolutions
    appear here as ``conv_general_dilated`` (transposed ones too); their gradients are
    convolutions as well."""
    key = jax.random.PRNGKey(0)
    g_params, d_params = jax.eval_shape(generator.init, key), jax.eval_shape(critic.init, key)
    z = jax.ShapeDtypeStruct((2, config.latent_dim), jnp.float32)

    def forward(g_params: Any, d_params: Any, z: jax.Array) -> jax.Array:
        fake = generator.apply(g_params, z, dtype=config.dtype)
        return critic.apply(d_params, fake, dtype=config.dtype)

    names: set[str] = set()
    _collect_primitives(jax.make_jaxpr(forward)(g_params, d_params, z).jaxpr, names)
    return frozenset(names)


def _collect_primitives(jaxpr: Any, names: set[str]) -> None:
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                if hasattr(sub, "eqns"):
                    _collect_primitives(sub, names)


def default_fused(platform: str, generator: Model, critic: Model, config: TrainConfig) -> bool:
    """Whether ``Trainer.run`` fuses its iterations by default on ``platform``: everywhere but on
    CPU when the networks hold a primitive of :data:`LOOP_SLOW_ON_CPU` (the digits conv pair);
    the MLP pairs fuse on CPU too."""
    if platform != "cpu":
        return True
    return not network_primitives(generator, critic, config) & LOOP_SLOW_ON_CPU


__all__ = ["LOOP_SLOW_ON_CPU", "default_fused", "network_primitives"]
