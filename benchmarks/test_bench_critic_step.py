"""One whole critic step (critic loss + penalty, value_and_grad wrt params, Adam update).

Group ``step:<critic>`` times, interleaved round by round, the step without the penalty (``plain``,
the floor), the naive penalty (``fastgp.reference``) and fastgp (``backend="auto"``, XLA on CPU).
Ratios are to ``naive``; ``plain`` shows what the penalty costs on top of the floor.
"""

import jax
import pytest

import workloads as W

ROUNDS = {"mlp2": 20, "mlp3072": 12, "dcgan32": 12}


def blocking(fn, args):
    return lambda: jax.block_until_ready(fn(*args))


@pytest.mark.parametrize("critic", list(W.CRITICS))
def test_critic_step(paired, critic):
    spec = W.CRITICS[critic]
    args = W.inputs(spec)
    paths = {v: blocking(jax.jit(W.critic_step(spec, v)), args)
             for v in ["plain", "naive", "fastgp"]}
    paired(paths, group=f"step:{critic}", baseline="naive", rounds=ROUNDS[critic],
           batch=spec.batch, also_vs="plain")
