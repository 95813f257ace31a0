"""The bound of every quantity ``fastgp check`` compares, from that quantity's float32 error scale.

    bounds = Bounds(naive, devices)               # records, as the check walks the naive steps:
    bounds.critic_step(before, step, grads, after)    # each critic step's scales
    bounds.generator_step(before, grads, after)       # the generator step's, ending an iteration
    bounds.critic, .generator, .run, .updates     # S of each compared quantity, step by step
    scaled_difference(ours, ref, scale)           # the largest |ours - ref| / S
    EPSILON                                       # the bound: |ours - ref| <= EPSILON * S

The sharded trainer and the naive one compute the same quantities in float32 (unit roundoff
u = 2^-24) in different orders. A compared quantity q is a batch mean of per-sample terms t_b (a
score gap, a loss term, a penalty term, a per-sample gradient), and the two computations of it
differ in two ways, each with its scale (``fastgp.train.run.check_scales`` computes them at the
naive state of every step):

1. Reduction. The terms are summed in another order (per core, then over cores by ``psum``,
   against one sum over the global batch, in blocks of the vector width). A sum of B terms
   rounds along at most B - 1 additions in any order; with rounding errors independent and of
   mean zero its error stays below lambda sqrt(B) u sum_b |t_b| with probability at least
   1 - 2B exp(-lambda^2 / 2) (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019, Thm. 3.1). Its
   scale is R = mean_b m_b, m_b the MAGNITUDE of term b: what it adds up, every operation
   counting its operands' sizes: |a| + |b| for a +- b, |f'(x)| m(x) through a function f, and
   the chain rule's products in absolute value for a gradient. Per quantity:

   wasserstein      |D(real_b)| + |D(fake_b)|: the gap is a difference of two means that nearly
                    cancel, and a bound relative to the gap itself says nothing of its rounding
   critic_loss      the loss term's |l| + |dl/dr| |r| + |dl/df| |f|, plus the penalty's
   penalty          weight (|phi(n)| + |phi'(n)| n) of the input-gradient norm n (phi' vanishes
                    at WGAN-GP's target, n = 1); the approximate kind's lam (delta^2 + 2 |delta|
                    (|D(x + sigma eps)| + |D(x)|)), delta = D(x + sigma eps) - D(x) cancelling all
                    but about sigma of each score
   generator_loss   the generator term's, as the critic loss's
   critic_grads,    per entry, the per-sample gradient's chain in absolute value: |dl/dr|
   generator_grads  |dD(real)/dtheta| + |dl/df| |dD(fake)/dtheta| (plus the second derivatives
                    times the scores, their rounding), weight (|phi'| + |phi''| n) |dn/dtheta|
   norm_stats       n itself (a sum of D squares, D the sample's size, over at most B samples)

2. Evaluation. One sample's term is the same arithmetic on both paths, rounded differently (a
   matrix-vector product for one sample per core against a matrix product, the penalty kernel
   against nested ``jax.grad``, another vector width). A float32 dot product of length K is the
   exact one of operands perturbed by relative errors of at most K u, sqrt(K) u in the
   probabilistic bound (backward stability), so to first order a sample's rounding moves its
   term as every parameter moved by a relative sqrt(K) u of random sign would, K the networks'
   longest fan-in (``check_scales.longest_contraction``). Its scale is E = sqrt(sum_b e_b^2) / B,
   e_b = |dt_b/dtheta . (theta * s)| the move of term b when every parameter of every network
   evaluation moves by its own size times a random sign s (separate evaluations round
   independently, so each gets its own signs; so do the samples, hence the root sum of squares).
   E sees cancellation inside the network that R cannot: the critic's input-gradient at a fake
   sample, which every generator gradient carries, is such a sum.

The bound is |q_sharded - q_naive| <= EPSILON * S, S = sqrt(B) R + sqrt(K) E (:func:`error_scale`;
the norms' depth is D + B), EPSILON = 2 lambda u: two computations, each within lambda sqrt(n) u,
lambda = 6 (exceeded with probability below 2n exp(-18) = 3e-8 n). Gradients are compared per
array, the largest difference against the largest scale of its entries; values per core.
Well-conditioned quantities get a bound tighter than any relative one that fits all of them,
cancelling ones one that holds. A gradient scaled by 1.0001 is 1e-4 |g| = 1678 u |g| off, against
12 u S with S a few |g| (sqrt(B) R about sqrt(B) |g| where the per-sample gradients agree in
sign, sqrt(K) E about sqrt(K / B) |g|, more where the network cancels): over the grid of meshes
of tests/train/test_check_bounds.py its gradients come out 3.8 to 21 times their bounds, the correct
trainer's differences below 0.12 of theirs.

3. Drift, for ``Trainer.run``: it chains an iteration's steps, so after the first its parameters
   differ from the naive ones by the earlier steps' update differences (:class:`AdamDrift`).
   Adam's step m_hat / (sqrt(v_hat) + eps) follows a gradient difference to first order, and never
   moves by more than twice its largest possible step (a sign the rounding decides); each path
   also rounds the parameter itself (u |theta| a step). A value then moves by at most
   sum_e |dq/dtheta_e| delta_theta_e (:func:`drift_of`, first order), added to its step's bound;
   the run's parameter updates are bounded entry by entry by delta_theta after its last step.
   The drift's own effect on later gradients (lr H delta_theta) is second order, left out.
"""

import math
from typing import Any, Literal

import jax
import numpy as np
import optax

from fastgp.train.config import TrainConfig
from fastgp.train.objective.penalties import lazy_adam
from fastgp.train.run.check_scales import Scale, StepScales
from fastgp.train.trainers import state as train_state
from fastgp.train.trainers.naive_trainer import NaiveTrainer

UNIT_ROUNDOFF = 2.0**-24  # float32's u
LAMBDA = 6.0  # the probabilistic bound's constant (module docstring)
EPSILON = 2 * LAMBDA * UNIT_ROUNDOFF  # two computations, each within LAMBDA sqrt(n) u
ADAM_EPS = 1e-8  # optax.adam's default, which fastgp.train.trainers.state.optimizers keeps
VALUES = ("wasserstein", "critic_loss", "penalty")  # of a critic step


def error_scale(scale: Scale, depth: int, k: int) -> Any:
    """S = sqrt(depth) R + sqrt(K) E, leaf by leaf (float64)."""
    return jax.tree.map(
        lambda r, e: math.sqrt(depth) * np.asarray(r, np.float64) + math.sqrt(k) * np.asarray(e),
        scale.reduction,
        scale.evaluation,
    )


def scaled_difference(ours: Any, ref: Any, scale: Any, *, per_entry: bool = False) -> float:
    """The largest |a - b| / S over the arrays of two pytrees and their scales: per array its
    largest difference against its largest scale, or ``per_entry`` entry against entry. ``ours``
    may carry a trailing device axis that ``ref`` and ``scale`` lack (every core is compared).
    NaN in both counts as equal; any other difference where S is 0 is infinite."""
    ours_leaves, ref_leaves = jax.tree.leaves(ours), jax.tree.leaves(ref)
    scales = jax.tree.leaves(scale)
    if not len(ours_leaves) == len(ref_leaves) == len(scales):
        raise ValueError(
            f"pytrees differ: {len(ours_leaves)}, {len(ref_leaves)} and {len(scales)} leaves"
        )
    worst = 0.0
    for a, b, s in zip(ours_leaves, ref_leaves, scales, strict=True):
        a, b, s = (np.asarray(x, np.float64) for x in (a, b, s))
        if a.ndim == b.ndim + 1:  # per core: the reference (and its scale) for every core
            b, s = b[..., None], s[..., None] if s.ndim == b.ndim else s
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
        diff = np.where(np.isnan(diff), np.inf, diff)
        if not per_entry:
            diff, s = np.max(diff, initial=0.0), np.max(s, initial=0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(diff == 0, 0.0, diff / s)
        worst = max(worst, float(np.max(ratio, initial=0.0)))
    return worst


class AdamDrift:
    """delta_theta: how far ``Trainer.run``'s parameters of one network can be from the naive
    trainer's after each step of one generator iteration, entry by entry (module docstring, 3).

    ``step(opt_state, grads, grad_bound, params)`` takes the naive state's optimiser state before
    the step, the naive gradients, the bound on each array's gradient difference (EPSILON times
    the largest S of its entries) and the parameters after the step. Adam's moments m and v carry
    the gradient differences to later steps, with their own bounds."""

    def __init__(self, config: TrainConfig, network: Literal["critic", "generator"]):
        lr, betas, total = config.lr_g, config.betas, config.total_steps
        if network == "critic":  # as fastgp.train.trainers.state.optimizers builds the critic's
            lr, total = config.lr_d, None if total is None else total * config.n_critic
            if config.lazy_adam:
                lr, betas = lazy_adam(lr, betas, config.gp_every)
        self.schedule = train_state.lr_schedule(lr, total, config.decay_fraction)
        self.b1, self.b2 = (float(b) for b in betas)
        self.theta: Any = None  # delta_theta after the steps so far
        self._moments: list[tuple[Any, Any]] | None = None  # per leaf: (delta_m, delta_v)

    def step(self, opt_state: Any, grads: Any, grad_bound: Any, params: Any) -> Any:
        """delta_theta after this step."""
        (adam,) = [
            s
            for s in jax.tree.leaves(
                opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
            )
            if isinstance(s, optax.ScaleByAdamState)
        ]
        count = int(adam.count)
        lr = float(self.schedule(count) if callable(self.schedule) else self.schedule)
        leaves, treedef = jax.tree.flatten(grads)
        moments = self._moments or [(0.0, 0.0)] * len(leaves)
        theta = [0.0] * len(leaves) if self.theta is None else jax.tree.leaves(self.theta)
        columns = (jax.tree.leaves(adam.mu), jax.tree.leaves(adam.nu), leaves)
        steps, self._moments = [], []
        for m, v, g, bound, (dm, dv) in zip(
            *columns, jax.tree.leaves(grad_bound), moments, strict=True
        ):
            du, dm, dv = self._adam(count + 1, m, v, g, float(bound), dm, dv)
            steps.append(lr * du)
            self._moments.append((dm, dv))
        # Each path rounds the parameter after its update: u |theta| each.
        rounding = [
            2 * UNIT_ROUNDOFF * np.abs(np.asarray(p, np.float64)) for p in jax.tree.leaves(params)
        ]
        moved = [t + s + r for t, s, r in zip(theta, steps, rounding, strict=True)]
        self.theta = jax.tree.unflatten(treedef, moved)
        return self.theta

    def _adam(
        self, t: int, m: Any, v: Any, g: Any, bound: float, dm: Any, dv: Any
    ) -> tuple[Any, ...]:
        """(bound on the change of m_hat / (sqrt(v_hat) + eps), delta_m, delta_v) of Adam's step
        ``t`` from moments (m, v) for a gradient g known to ``bound``: first order, capped at twice
        the largest step, sqrt(c2) / c1 (1 - b1) / sqrt(1 - b2) sqrt(sum_{i<t} (b1^2 / b2)^i)
        (Cauchy-Schwarz over the moments' sums of the t gradients so far; c_j = 1 - b_j^t)."""
        b1, b2 = self.b1, self.b2
        c1, c2 = 1 - b1**t, 1 - b2**t
        largest = math.sqrt(c2) / c1 * (1 - b1) / math.sqrt(1 - b2)
        largest *= math.sqrt(sum((b1 * b1 / b2) ** i for i in range(t)))
        m, v, g = (np.asarray(x, np.float64) for x in (m, v, g))
        m1, v1 = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        dm1 = b1 * dm + (1 - b1) * bound
        dv1 = b2 * dv + (1 - b2) * (2 * np.abs(g) * bound + bound * bound)
        root = np.sqrt(v1 / c2)
        with np.errstate(divide="ignore", invalid="ignore"):
            change = dm1 / c1 / (root + ADAM_EPS)
            change = change + np.abs(m1) / c1 / (root + ADAM_EPS) ** 2 * dv1 / (2 * c2 * root)
        change = np.where(np.isfinite(change), np.minimum(change, 2 * largest), 2 * largest)
        return change, dm1, dv1


def drift_of(gradient: Any, theta: Any) -> float:
    """The first-order move of a value with parameter gradient ``gradient`` under a drift
    bounded by ``theta`` (None: none yet): sum_e |dq/dtheta_e| delta_theta_e."""
    if theta is None:
        return 0.0
    pairs = zip(jax.tree.leaves(gradient), jax.tree.leaves(theta), strict=True)
    return float(sum(np.sum(np.abs(np.asarray(g, np.float64)) * t) for g, t in pairs))


class Bounds:
    """Every compared quantity's error scale S, step by step, as the check walks the naive
    trainer's steps: ``critic`` (per critic step: VALUES, "critic_grads" and per core
    "norm_stats"), ``generator`` (per generator step: "generator_loss", "generator_grads"),
    ``run`` (per iteration: the run's values, each step's S plus its drift over EPSILON) and
    ``updates`` (per iteration: (generator, critic) delta_theta over EPSILON, per entry)."""

    def __init__(self, naive: NaiveTrainer, devices: int) -> None:
        self.scales, self.config, self.devices = StepScales(naive), naive.config, devices
        self.critic: list[dict[str, Any]] = []
        self.generator: list[dict[str, Any]] = []
        self.run: list[dict[str, Any]] = []
        self.updates: list[tuple[Any, Any]] = []
        self._run_steps: list[dict[str, float]] = []
        self._drift = AdamDrift(self.config, "critic")

    def critic_step(self, before: Any, step: int, grads: Any, after: Any) -> None:
        """Critic step ``step`` from naive state ``before`` (its gradients, the state after)."""
        scales, batch, k = self.scales.critic(before, step), self.config.batch_size, self.scales.k
        record = {name: error_scale(scales[name], batch, k) for name in (*VALUES, "critic_grads")}
        record["norm_stats"] = self._norm_stats(*scales["norms"])
        self.critic.append(record)
        self._run_steps.append(
            {
                q: record[q] + drift_of(scales["drift"][q], self._drift.theta) / EPSILON
                for q in VALUES
            }
        )
        self._drift.step(before.d_opt, grads, _largest(record["critic_grads"]), after.d_params)

    def generator_step(self, before: Any, grads: Any, after: Any) -> None:
        """The generator step that ends the iteration: its scales, then the run's."""
        scales, batch, k = self.scales.generator(before), self.config.batch_size, self.scales.k
        record = {
            q: error_scale(scales[q], batch, k) for q in ("generator_loss", "generator_grads")
        }
        self.generator.append(record)
        generator_drift = AdamDrift(self.config, "generator")
        generator_drift.step(
            before.g_opt, grads, _largest(record["generator_grads"]), after.g_params
        )
        critic_drift = drift_of(scales["drift"]["generator_loss"], self._drift.theta)
        run = {q: np.stack([s[q] for s in self._run_steps])[None] for q in VALUES}
        self.run.append(
            {
                **run,
                "generator_loss": np.atleast_1d(record["generator_loss"] + critic_drift / EPSILON),
            }
        )
        self.updates.append(
            jax.tree.map(lambda t: t / EPSILON, (generator_drift.theta, self._drift.theta))
        )
        self._run_steps, self._drift = [], AdamDrift(self.config, "critic")

    def _norm_stats(self, norms: Any, probes: Any) -> dict[str, np.ndarray]:
        """Per core: S of its norms' mean, min and max, each a sum of D squares averaged over at
        most B samples: from the largest norm of its slice (the naive (B * P,) layout) and the
        probe's root mean square over the batch (one sample's draw alone may come out small)."""
        depth = self.scales.sample_size + self.config.batch_size
        largest = np.max(np.reshape(norms, (self.devices, -1)), -1)
        typical = np.sqrt(np.mean(np.square(probes)))
        scale = math.sqrt(depth) * largest + math.sqrt(self.scales.k) * typical
        return {"norm_mean": scale, "norm_min": scale, "norm_max": scale}


def _largest(scale: Any) -> Any:
    """EPSILON times each array's largest S: the bound on each of its entries' differences."""
    return jax.tree.map(lambda s: EPSILON * float(np.max(s, initial=0.0)), scale)


__all__ = [
    "EPSILON",
    "LAMBDA",
    "UNIT_ROUNDOFF",
    "AdamDrift",
    "Bounds",
    "drift_of",
    "error_scale",
    "scaled_difference",
]
