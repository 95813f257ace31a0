"""Lazy regularisation and rematerialisation inside the penalty.

Every group times its paths interleaved round by round (see ``conftest.paired``):

``lazy:<critic>``   16 critic steps dispatched from Python (per-step time = call / 16): plain,
                    penalty every step, every 4 and every 16 steps (weight x k; the penalised or
                    plain jitted step chosen in Python, see ``workloads.run_steps`` for why not
                    ``lax.cond`` on CPU).
``remat:<critic>``  one critic step: naive, fastgp, fastgp with the critic under
                    ``jax.checkpoint`` (``remat="nothing"`` / ``"dots"``).
"""

import jax
import pytest

from benchmarks import workloads as W

ROUNDS = {"mlp2": 15, "mlp3072": 8, "dcgan32": 8, "dcgan32-nhwc": 8}
LAZY_STEPS = 16
LAZY_ROUNDS = {"mlp2": 8, "mlp3072": 8, "dcgan32": 4, "dcgan32-nhwc": 4}


def blocking(fn, args):
    return lambda: jax.block_until_ready(fn(*args))


@pytest.mark.parametrize("critic", list(W.CRITICS))
def test_lazy(paired, critic):
    spec = W.CRITICS[critic]
    args = W.inputs(spec)
    plain = jax.jit(W.critic_step(spec, "plain"))
    paths = {"plain": blocking(W.run_steps([plain], [0] * LAZY_STEPS), args)}
    for every in (1, 4, 16):
        paths[f"gp every {every}"] = blocking(W.lazy_steps(spec, every, LAZY_STEPS), args)
    paired(
        paths,
        group=f"lazy:{critic}",
        baseline="plain",
        rounds=LAZY_ROUNDS[critic],
        steps_per_call=LAZY_STEPS,
    )


@pytest.mark.parametrize("critic", list(W.CRITICS))
def test_remat(paired, critic):
    spec = W.CRITICS[critic]
    args = W.inputs(spec)
    paths = {
        v: blocking(jax.jit(W.critic_step(spec, v)), args)
        for v in ["naive", "fastgp", "fastgp-remat", "fastgp-dots"]
    }
    paired(paths, group=f"remat:{critic}", baseline="naive", rounds=ROUNDS[critic])
