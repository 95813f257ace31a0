"""One whole critic step (critic loss + penalty, value_and_grad wrt params, Adam update).

Group ``step:<critic>`` times, interleaved round by round, the step without the penalty (``plain``,
the floor), the naive penalty (``fastgp.naive_gradient_penalty``), fastgp's default
(reverse-over-forward, ``backend="auto"``, XLA on CPU) and fastgp with
``second_order="reverse"`` (nested reverse mode).
Ratios are to ``naive``; the last column is the ratio to ``plain``.
"""

import jax
import pytest

from benchmarks import workloads as W

ROUNDS = {"mlp2": 20, "mlp3072": 12, "dcgan32": 12, "dcgan32-nhwc": 12}
PATHS = {"plain": "plain", "naive": "naive", "fastgp": "fastgp", "fastgp reverse": "fastgp-reverse"}


def blocking(fn, args):
    return lambda: jax.block_until_ready(fn(*args))


@pytest.mark.parametrize("critic", list(W.CRITICS))
def test_critic_step(paired, critic):
    spec = W.CRITICS[critic]
    args = W.inputs(spec)
    paths = {name: blocking(jax.jit(W.critic_step(spec, v)), args) for name, v in PATHS.items()}
    paired(
        paths,
        group=f"step:{critic}",
        baseline="naive",
        rounds=ROUNDS[critic],
        batch=spec.batch,
        also_vs="plain",
    )
