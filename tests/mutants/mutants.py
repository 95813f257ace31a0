"""The mutants that ``tests/mutants/run.py`` plants, one at a time, in a scratch copy of the
repository, each with the tests expected to kill it.

A mutant replaces one exact snippet of one file; the snippet must occur exactly once, so that a
refactor which moves or rewrites the code makes the harness report an error instead of silently
testing an unchanged file. ``targets`` are pytest arguments: node ids, paths, and a ``-k``
expression where one keeps the run short. Keep them narrow: the whole list runs in minutes.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # the exact snippet, found exactly once in ``file``
    new: str  # what replaces it
    targets: tuple[str, ...]  # pytest arguments: node ids, paths, "-k", "expression"
    description: str  # one line, for the report
    timeout: float = 420.0  # seconds for the mutant's pytest run


SHARDED = (
    "tests/penalty/test_sharded_penalty.py::test_global_penalty_and_gradients_equal_single_device"
)
LAYOUTS = "tests/penalty/test_layouts.py::test_layout_equals_one_device"

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="dropped-psum",
        file="fastgp/distributed.py",
        old=(
            "    total = global_sum(jnp.sum(values, dtype=dtype), axis_name)\n"
            "    return total / global_count(values.shape[0], axis_name).astype(dtype)\n"
        ),
        new=(
            "    total = jnp.sum(values, dtype=dtype)\n"
            "    return total / jnp.asarray(values.shape[0], dtype)\n"
        ),
        targets=(
            f"{SHARDED}[r1-3-xla]",
            f"{SHARDED}[wgan-gp-4-tpu-interpret]",
            f"{LAYOUTS}[FSDP-shard_map]",
        ),
        description="global_mean is this shard's mean: no psum of the sums, the local count",
    ),
    Mutant(
        name="doubled-psum",
        file="fastgp/distributed.py",
        old="    return lax.psum(value, axes) if axes else value\n",
        new="    return lax.psum(lax.psum(value, axes), axes) if axes else value\n",
        targets=(
            f"{SHARDED}[r1-3-xla]",
            f"{SHARDED}[wgan-gp-4-tpu-interpret]",
            f"{LAYOUTS}[batch x sequence-shard_map]",
        ),
        description="global_sum applies its psum twice",
    ),
    Mutant(
        name="dropped-jvp-mu",
        file="fastgp/_attention/xla.py",
        old="    do = acc - mu[..., None] * o.astype(F32)\n",
        new="    do = acc\n",
        targets=(
            (
                "tests/attention/test_attention.py::test_every_derivative_matches_nested_autodiff"
                "[b1-tq64-tk64-h1-d64-cTrue-mFalse]"
            ),
        ),
        description="the XLA tangent pass drops the -mu o term of do = P(Sdot v + dv) - mu o",
    ),
    Mutant(
        name="dropped-jvp-p-sdot-v",
        file="kernels/attention/tangent.py",
        old="        r.acc[...] += accumulate(ps, r.v[...]) + accumulate(p, r.dv[...])\n",
        new="        r.acc[...] += accumulate(p, r.dv[...])\n",
        targets=(
            (
                "tests/attention/test_attention_kernels.py::"
                "test_tangent_matches_jvp_of_naive_attention"
                "[b1h2-q48k40-d32v32-causal-bq48bk40-none-interpret]"
            ),
        ),
        description="the tangent kernel drops the P Sdot v term of do = P(Sdot v + dv) - mu o",
    ),
    Mutant(
        name="causal-offset",
        file="kernels/attention/layout.py",
        old="lax.div(jnp.maximum(j * self.bk - self.q_offset, 0), self.bq)",
        new="lax.div(j * self.bk, self.bq)",
        targets=(
            "tests/attention/test_attention_kernels.py::test_vjp_matches_vjp_of_naive_attention",
            "tests/attention/test_attention_gpu_kernels.py::test_first_order_passes_match_naive_attention",
            "-k",
            "at24 or at64",
        ),
        description="the key-major causal skip (first_q) ignores the queries' offset",
    ),
    Mutant(
        name="lse-bf16",
        file="fastgp/_attention/xla.py",
        old="    lse = jnp.where(seen, m + jnp.log(safe), 0.0)\n",
        new=(
            "    lse = jnp.where(seen, m + jnp.log(safe), 0.0)\n"
            "    lse = lse.astype(jnp.bfloat16).astype(F32)\n"
        ),
        targets=(
            "tests/attention/test_attention.py::test_bf16_equals_float32_on_the_same_values[xla]",
        ),
        description="the XLA forward's log-sum-exp statistic rounded to bfloat16 and back",
    ),
    Mutant(
        name="vmap-mask-order",
        file="fastgp/_attention/rules.py",
        old="            folded.append(a.reshape((size * a.shape[1], *a.shape[2:])))\n",
        new=(
            "            if a.dtype == jnp.bool_ and d is not None:\n"
            "                a = jnp.swapaxes(a, 0, 1).reshape(a.shape)\n"
            "            folded.append(a.reshape((size * a.shape[1], *a.shape[2:])))\n"
        ),
        targets=(
            "tests/attention/test_attention.py::test_vmap_of_per_sample_masks_over_a_batch_equals_a_loop",
        ),
        description="the vmap rule folds a mapped key mask (E, B, Tk) in (B, E) order",
    ),
    Mutant(
        name="forgotten-batch-axis",
        file="fastgp/distributed.py",
        old="    if not unnamed:\n",
        new="    if not unnamed or sample_axis_name is not None:\n",
        targets=(
            (
                "tests/penalty/test_sample_axes.py::"
                "test_a_forgotten_batch_axis_is_refused_when_the_sample_axis_is_named"
            ),
        ),
        description="require_axis_name lets any axis through once a sample axis is named",
    ),
    Mutant(
        name="zero-norm-nan",
        file="fastgp/_penalty/rowops.py",
        old="    return jnp.where(positive, 1.0 / jnp.where(positive, norm, 1.0), 0.0)\n",
        new="    return 1.0 / norm\n",
        targets=(
            "tests/penalty/test_penalty.py",
            "-k",
            "zero_input_gradient or one_zero_sample",
        ),
        description="the norm's derivative g / n with no guard for n = 0 (safe_inverse is 1 / n)",
    ),
    Mutant(
        name="trainer-grads-scaled",
        file="fastgp/train/trainers/trainer.py",
        old="    return value, unravel(grads)\n",
        new="    return value, unravel(1.0001 * grads)\n",
        targets=("tests/train/test_trainer.py::test_sharded_equals_naive[2-xla-wgan-lp-reexec]",),
        description="the trainer's all-reduced gradients scaled by 1.0001",
    ),
    Mutant(
        name="wrong-placement",
        file="fastgp/train/objective/penalties.py",
        old='    return ("real", "fake") if placement == "real+fake" else (placement,)\n',
        new='    return ("real",) if placement == "real+fake" else (placement,)\n',
        targets=("tests/train/test_losses.py::test_r3gan_relativistic_loss_with_r1_plus_r2",),
        description='placement "real+fake" takes the penalty at the real points only',
    ),
    Mutant(
        name="negative-weight",
        file="fastgp/_penalty/validation.py",
        old="    if value < 0:\n",
        new="    if False:\n",
        targets=("tests/penalty/test_errors.py", "-k", "negative_weight"),
        description="check_weight accepts a negative weight",
    ),
)
