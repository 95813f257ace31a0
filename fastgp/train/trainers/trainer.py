"""The data-parallel WGAN-GP trainer: every step under ``jax.shard_map`` over a 1-D "data" mesh.

    trainer = Trainer(config, generator, critic, sample_real, mesh=None, fused=None)
    trainer.fused                                           # how ``run`` goes (default_fused)
    state = trainer.init()                                  # replicated TrainState
    state = trainer.replicate(restored_state)               # e.g. after loading a checkpoint
    state, metrics = trainer.run(state, iterations)         # ``iterations`` generator iterations
    state, metrics = trainer.iteration(state)               # one, compiled without a loop
    samples = trainer.sample(state, key, n)                 # (n, ...) float32 generator output
    state, metrics = trainer.critic_step(state, real, step) # one sharded critic step (B, ...)
    metrics, grads = trainer.critic_gradients(state, step)  # critic step ``step``, no update
    loss, grads = trainer.generator_gradients(state)        # the generator step, no update

One generator iteration is ``n_critic`` critic steps then one generator step. Parameters and
optimiser state are replicated (``P()``), batches are sharded over "data" (``P("data")``). Semantics
are those of one device with the GLOBAL batch: real data, generator noise and interpolation alpha
are drawn for the global batch from the keys of ``fastgp.train.trainers.state`` and each core uses
its slice; losses are global means; parameter gradients are ``jax.grad`` taken inside ``shard_map``
(``check_vma=True``) of the psum'd global-mean loss, which makes them the single-device gradients
with no hand-written scaling; they are taken with respect to the raveled parameters cast once to
per-core values, so each step all-reduces one vector (``_packed_value_and_grad``).
``fastgp.train.run.check`` verifies all of that against ``fastgp.train.trainers.naive_trainer``.

``run`` goes one of two ways, the same steps and random numbers (``fused``; None:
``fusion.default_fused``). Fused: ``run(state, I)`` is one compiled ``lax.scan`` over the I
iterations, each a ``lax.scan`` over the critic steps: one dispatch, a program that does not grow
with I or n_critic. Unfused: ``run`` calls ``iteration``, ONE generator iteration compiled with
its critic steps written out (no loop in the program), I times. The default is fused, except on
CPU for networks with a primitive of ``fusion.LOOP_SLOW_ON_CPU`` (convolutions): XLA:CPU lays out
the weight-gradient convolutions inside a loop body for a slow path (many times slower per
iteration in the scan than written out; docs/trainer.md has the measurements), and a dispatch
per iteration costs little there. The MLP pairs run fused on CPU too: their scan
compiles faster and costs less CPU time per iteration than the written-out iteration
(``benchmarks/train_time.py``); ``fastgp.train.trainers.fusion`` holds that choice. Written out, a
``gp_every`` that divides ``n_critic`` decides the lazy penalty of each critic step at trace
time (no ``lax.cond``). ``run.lower`` lowers the fused program either way.

``metrics`` from ``run`` (I = iterations, C = n_critic, N = devices; gathered from every core):
    critic_loss, penalty, wasserstein          (I, C, N) float32  global values, as seen by core n
    norm_mean, norm_min, norm_max              (I, C, N) float32  core n's input-gradient norms
    nonfinite                                  (I, C, N) int32    core n's non-finite norms
    gp_applied                                 (I, C)    bool     penalty computed on this step
    generator_loss                             (I, N)    float32
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# Private on purpose: the sharded trainer calls fastgp's kernels inside its own shard_map, so it
# needs the check that a backend runs on manual axes and the CPU interpret modes' blocking call.
from fastgp._backends import blocking, check_backend_for_manual_axes
from fastgp.diagnostics import per_device
from fastgp.distributed import global_batch_slice, global_mean
from fastgp.train.config import TrainConfig
from fastgp.train.models.networks import Model
from fastgp.train.objective.losses import critic_terms, generator_terms, uses_real_in_generator
from fastgp.train.objective.penalties import placed_penalty
from fastgp.train.trainers import core_stats
from fastgp.train.trainers.fusion import default_fused
from fastgp.train.trainers.state import (
    TrainState,
    critic_keys,
    generator_key,
    gp_schedule,
    init_state,
    optimizers,
)

AXIS = "data"


def make_mesh(devices: Sequence[Any] | None = None) -> Mesh:
    """A 1-D mesh named "data" over ``devices`` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    return jax.make_mesh((len(devices),), (AXIS,), devices=devices)


def _shard(x: Any, sharding: NamedSharding) -> Any:
    """Lay out a jit-level array as ``sharding`` (reshard on explicit meshes, a constraint else)."""
    if all(t == AxisType.Explicit for t in sharding.mesh.axis_types):
        return jax.reshard(x, sharding)
    return lax.with_sharding_constraint(x, sharding)


class Trainer:
    """Sharded WGAN-GP training of ``generator`` and ``critic`` (a
    ``fastgp.train.models.networks.Model`` pair).

    ``sample_real(key, n)`` returns ``n`` real samples (n, ...) float32 and must be jittable (see
    ``fastgp.train.trainers.state.index_sampler`` for an in-memory dataset). ``mesh`` is a 1-D mesh
    with axis "data" (default :func:`make_mesh`). With an interpret backend ``run``, ``critic_step``
    and ``gradients`` wait for their results before returning (``fastgp._backends``).
    """

    def __init__(
        self,
        config: TrainConfig,
        generator: Model,
        critic: Model,
        sample_real: Callable[[jax.Array, int], jax.Array],
        *,
        mesh: Mesh | AbstractMesh | None = None,
        fused: bool | None = None,
    ) -> None:
        if config.second_order == "auto":
            raise ValueError(
                "second_order='auto' is resolved before training: "
                "fastgp.train.run.penalty_tuning.choose_second_order(config, problem, local_batch) "
                "returns the config with the faster exact second order"
            )
        mesh = make_mesh() if mesh is None else mesh
        if tuple(mesh.axis_names) != (AXIS,):
            raise ValueError(
                f"the mesh must have exactly one axis named {AXIS!r}, got axes "
                f"{tuple(mesh.axis_names)}"
            )
        devices = mesh.shape[AXIS]
        if config.batch_size % devices:
            raise ValueError(
                f"global batch_size {config.batch_size} is not divisible by the "
                f"{devices} devices of the mesh; use a multiple of {devices}"
            )
        self.config = config
        self.generator, self.critic, self.sample_real = generator, critic, sample_real
        self.mesh = mesh
        self.devices = devices
        self.local_batch = config.batch_size // devices
        check_backend_for_manual_axes(config.backend, (AXIS,))
        self.backend = config.backend
        self._opt_g, self._opt_d = optimizers(config)
        self._replicated = NamedSharding(mesh, P())
        self._batched = NamedSharding(mesh, P(None, AXIS))
        devices_of = getattr(mesh, "devices", None)  # an AbstractMesh has none
        platform = jax.default_backend() if devices_of is None else devices_of.flat[0].platform
        self.fused = (
            default_fused(platform, generator, critic, config) if fused is None else bool(fused)
        )
        self.iteration = blocking(jax.jit(self._unfused_iteration), self.backend)
        self.run = _Run(self, blocking(jax.jit(self._run, static_argnums=1), self.backend))
        self.critic_step = blocking(
            jax.jit(self._sharded(self._gathered_critic_step, (P(), P(AXIS), P()))), self.backend
        )
        self.critic_gradients = blocking(jax.jit(self._critic_gradients), self.backend)
        self.generator_gradients = blocking(jax.jit(self._generator_gradients), self.backend)
        self.sample = jax.jit(self._sample, static_argnums=2)

    # --- public (plus the jitted run, critic_step, gradients and sample set in __init__) -------

    def init(self) -> TrainState:
        """The initial state (``fastgp.train.trainers.state.init_state``), replicated on the
        mesh."""
        return self.replicate(init_state(self.config, self.generator, self.critic))

    def replicate(self, state: TrainState) -> TrainState:
        """Place a state (e.g. restored from a checkpoint) replicated on this trainer's mesh."""
        return jax.device_put(state, self._replicated)

    def _run(self, state: TrainState, iterations: int) -> tuple[TrainState, dict[str, Any]]:
        """``iterations`` generator iterations fused in one ``lax.scan``; (state, metrics)."""
        iteration = self._sharded(self._iteration, (P(), P(None, AXIS)))

        def body(state: TrainState, _: Any) -> tuple[TrainState, dict[str, Any]]:
            return iteration(state, _shard(self._real_batches(state), self._batched))

        return lax.scan(body, state, None, length=iterations)

    def _unfused_iteration(self, state: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """One generator iteration, its critic steps written out (no loop); (state, metrics)."""
        iteration = self._sharded(
            functools.partial(self._iteration, written_out=True), (P(), P(None, AXIS))
        )
        return iteration(state, _shard(self._real_batches(state), self._batched))

    def _critic_gradients(self, state: TrainState, step: Any) -> tuple[dict[str, Any], Any]:
        """(gathered metrics, gradients) of critic step ``step`` of iteration ``state.iteration``
        at ``state``'s parameters: what that step computes, without its update."""
        real = _shard(self._real_batch(state, step), NamedSharding(self.mesh, P(AXIS)))
        return self._sharded(self._local_critic_gradients, (P(), P(AXIS), P()))(state, real, step)

    def _generator_gradients(self, state: TrainState) -> tuple[jax.Array, Any]:
        """(loss, gradients) of the generator step of iteration ``state.iteration`` at
        ``state``'s parameters: what that step computes, without its update."""
        real = self._real_batch(state, self.config.n_critic)  # used by the relativistic loss only
        real = _shard(real, NamedSharding(self.mesh, P(AXIS)))
        return self._sharded(self._local_generator_gradients, (P(), P(AXIS)))(state, real)

    # --- jit level -----------------------------------------------------------------------------

    def _sample(self, state: TrainState, key: jax.Array, n: int) -> jax.Array:
        """(n, ...) float32 generator samples for noise drawn from ``key``."""
        z = jax.random.normal(key, (n, self.config.latent_dim), jnp.float32)
        return self.generator.apply(state.g_params, z, dtype=self.config.dtype).astype(jnp.float32)

    def _sharded(self, fn: Callable[..., Any], in_specs: Any) -> Callable[..., Any]:
        return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=P(), check_vma=True)

    def _real_batches(self, state: TrainState) -> jax.Array:
        """(n_critic, B, ...) real data of this iteration's critic steps, GLOBAL batch, and one
        more batch, the generator step's, when the loss pairs fakes with reals (its key is that
        of a critic step index ``n_critic``, the generator's).

        One vmapped draw over the steps' keys (the same bits as one draw per key), so the
        program does not grow with ``n_critic``."""
        draws = self.config.n_critic + uses_real_in_generator(self.config.loss)
        steps = jnp.arange(draws, dtype=jnp.int32)
        keys = jax.vmap(lambda step: critic_keys(state.key, state.iteration, step)[0])(steps)
        draw = jax.vmap(lambda key: self.sample_real(key, self.config.batch_size))
        return draw(keys).astype(jnp.float32)

    def _real_batch(self, state: TrainState, index: Any) -> jax.Array:
        """The (B, ...) GLOBAL real batch of step ``index`` of this iteration (``n_critic``: the
        generator step's), the same bits as that row of ``_real_batches``."""
        key = critic_keys(state.key, state.iteration, index)[0]
        return self.sample_real(key, self.config.batch_size).astype(jnp.float32)

    # --- inside shard_map ----------------------------------------------------------------------

    def _local_normal(self, key: jax.Array) -> jax.Array:
        """This core's slice of (B, latent_dim) float32 noise drawn for the GLOBAL batch."""
        z = jax.random.normal(key, (self.config.batch_size, self.config.latent_dim), jnp.float32)
        return global_batch_slice(z, self.local_batch, AXIS)

    def _scores(self, d_params: Any, x: jax.Array) -> jax.Array:
        out = self.critic.apply(d_params, x, dtype=self.config.dtype)
        return out.astype(jnp.float32).reshape(x.shape[0])

    def _fake(self, g_params: Any, key: jax.Array) -> jax.Array:
        """This core's (B_local, ...) float32 generator samples."""
        out = self.generator.apply(g_params, self._local_normal(key), dtype=self.config.dtype)
        return out.astype(jnp.float32)

    def _critic_loss(
        self,
        d_params: Any,
        g_params: Any,
        real: jax.Array,
        keys: tuple[jax.Array, ...],
        weight: Any,
        apply_gp: bool,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """(loss + penalty, aux): the GAN loss's critic terms averaged over the global batch;
        the score gap is mean D(real) - mean D(fake) (the Wasserstein estimate)."""
        _, k_noise, k_penalty = keys
        fake = self._fake(g_params, k_noise)
        critic = functools.partial(self._scores, d_params)
        real_scores, fake_scores = critic(real), critic(fake)
        # One global mean of the differences (real and fake shards are the same size): one
        # scalar all-reduced for the gap, which is minus the Wasserstein loss.
        gap = global_mean(real_scores - fake_scores, AXIS)
        if self.config.loss == "wasserstein":
            loss = -gap
        else:
            loss = global_mean(critic_terms(self.config.loss, real_scores, fake_scores), AXIS)
        penalty, stats = jnp.float32(0.0), core_stats.skipped_norm_stats(AXIS)
        if apply_gp:
            penalty, norms = placed_penalty(
                self.config, critic, real, fake, k_penalty, weight, self.backend, AXIS
            )
            if norms is not None:  # the approximate kind takes no input-gradient
                stats = core_stats.local_norm_stats(norms)
        total = loss + penalty
        return total, {"critic_loss": total, "penalty": penalty, "wasserstein": gap, **stats}

    def _critic_grads(
        self, state: TrainState, real: jax.Array, step: Any, apply_gp: Any, weight: Any
    ) -> Any:
        """((loss, local aux), grads) of critic step ``step`` of ``state.iteration`` (lazy GP:
        a ``lax.cond`` unless ``apply_gp`` is a Python bool)."""
        keys = critic_keys(state.key, state.iteration, step)

        def branch(on: bool) -> Callable[[], Any]:
            return lambda: _packed_value_and_grad(
                self._critic_loss,
                state.d_params,
                state.g_params,
                real,
                keys,
                weight,
                on,
                has_aux=True,
            )

        if isinstance(apply_gp, bool):  # known at trace time: no lax.cond
            return branch(apply_gp)()
        return lax.cond(apply_gp, branch(True), branch(False))

    def _schedule(self, state: TrainState, step: Any) -> tuple[Any, float]:
        cfg = self.config
        if isinstance(step, int) and cfg.n_critic % cfg.gp_every == 0:
            # (iteration * n_critic + step) % gp_every == step % gp_every: known at trace time
            return gp_schedule(cfg, step)
        return gp_schedule(cfg, state.iteration * cfg.n_critic + step)

    def _critic_step(
        self, state: TrainState, real: jax.Array, step: Any
    ) -> tuple[TrainState, dict[str, jax.Array], jax.Array]:
        """One critic update on this core's (B_local, ...) real batch; (state, this core's metrics,
        penalty applied?). The update's only collective is the gradient all-reduce, which XLA
        merges with the global means of the loss; metrics are gathered by the caller."""
        apply_gp, weight = self._schedule(state, step)
        (_, aux), grads = self._critic_grads(state, real, step, apply_gp, weight)
        updates, d_opt = self._opt_d.update(grads, state.d_opt, state.d_params)
        d_params = optax.apply_updates(state.d_params, updates)
        return state._replace(d_params=d_params, d_opt=d_opt), aux, jnp.asarray(apply_gp)

    def _gathered_critic_step(
        self, state: TrainState, real: jax.Array, step: Any
    ) -> tuple[TrainState, dict[str, Any]]:
        """``_critic_step`` with its metrics gathered from every core; (state, metrics)."""
        state, aux, gp_applied = self._critic_step(state, real, step)
        return state, {**per_device(aux, AXIS), "gp_applied": gp_applied}

    def _generator_loss(
        self, g_params: Any, d_params: Any, key: jax.Array, real: jax.Array | None
    ) -> jax.Array:
        """The loss's generator terms (-D(G(z)) for the Wasserstein loss) over the global
        batch; ``real``: this core's real batch, for a loss that pairs fakes with reals."""
        fake_scores = self._scores(d_params, self._fake(g_params, key))
        real_scores = None if real is None else self._scores(d_params, real)
        return global_mean(generator_terms(self.config.loss, fake_scores, real_scores), AXIS)

    def _generator_step(
        self, state: TrainState, real: jax.Array | None
    ) -> tuple[TrainState, dict[str, Any]]:
        key = generator_key(state.key, state.iteration, self.config.n_critic)
        loss, grads = _packed_value_and_grad(
            self._generator_loss, state.g_params, state.d_params, key, real
        )
        updates, g_opt = self._opt_g.update(grads, state.g_opt, state.g_params)
        g_params = optax.apply_updates(state.g_params, updates)
        state = state._replace(iteration=state.iteration + 1, g_params=g_params, g_opt=g_opt)
        return state, {"generator_loss": loss}

    def _iteration(
        self, state: TrainState, real: jax.Array, written_out: bool = False
    ) -> tuple[TrainState, dict[str, Any]]:
        """One generator iteration on this core's real batches (``_real_batches``' slices): the
        critic steps in a ``lax.scan``, or ``written_out`` one after another.

        Collectives: one all-reduce per critic and generator step (gradients and global means),
        then ONE for the metrics of the whole iteration, gathered at its end."""

        def critic_step(state: TrainState, xs: Any) -> tuple[TrainState, Any]:
            state, aux, gp_applied = self._critic_step(state, *xs)
            return state, (aux, gp_applied)

        if not written_out:
            steps = jnp.arange(self.config.n_critic, dtype=jnp.int32)
            critic_real = real[: self.config.n_critic]
            state, (critic_aux, gp_applied) = lax.scan(critic_step, state, (critic_real, steps))
        else:
            per_step = []
            for step in range(self.config.n_critic):
                state, out = critic_step(state, (real[step], step))
                per_step.append(out)
            critic_aux, gp_applied = _stack(per_step)
        state, generator_aux = self._generator_step(state, self._generator_real(real))
        metrics = per_device({**critic_aux, **generator_aux}, AXIS)
        return state, {**metrics, "gp_applied": gp_applied}

    def _local_critic_gradients(
        self, state: TrainState, real: jax.Array, step: Any
    ) -> tuple[dict[str, Any], Any]:
        apply_gp, weight = self._schedule(state, step)
        (_, aux), grads = self._critic_grads(state, real, step, apply_gp, weight)
        return {**per_device(aux, AXIS), "gp_applied": jnp.asarray(apply_gp)}, grads

    def _local_generator_gradients(
        self, state: TrainState, real: jax.Array
    ) -> tuple[jax.Array, Any]:
        key = generator_key(state.key, state.iteration, self.config.n_critic)
        paired = real if uses_real_in_generator(self.config.loss) else None
        return _packed_value_and_grad(
            self._generator_loss, state.g_params, state.d_params, key, paired
        )

    def _generator_real(self, real: jax.Array) -> jax.Array | None:
        """The generator step's real batch among ``_real_batches``' (None if it draws none)."""
        return real[-1] if uses_real_in_generator(self.config.loss) else None


def _packed_value_and_grad(
    loss_fn: Callable[..., Any], params: Any, *args: Any, has_aux: bool = False
) -> tuple[Any, Any]:
    """``jax.value_and_grad(loss_fn, has_aux=has_aux)(params, *args)`` inside ``shard_map`` for
    replicated ``params``, the gradient all-reduced as ONE raveled float32 vector.

    Left implicit, the invariant-to-varying cast sits at every use of every weight array, and
    its transpose all-reduces each use's cotangent: one operand per weight and use. Here the
    raveled parameters are cast once, so the one all-reduce is the cast's transpose. Same sums:
    raveling is a concatenation. Why it matters: XLA:CPU's gloo collectives make one transfer
    per operand, and on any platform fewer, larger all-reduces are what collective latency
    wants."""
    flat, unravel = ravel_pytree(params)

    def loss_of_flat(f: jax.Array) -> Any:
        return loss_fn(unravel(lax.pcast(f, AXIS, to="varying")), *args)

    value, grads = jax.value_and_grad(loss_of_flat, has_aux=has_aux)(flat)
    return value, unravel(grads)


def _stack(trees: Sequence[Any]) -> Any:
    """Equal-structure pytrees of arrays stacked leaf by leaf on a new leading axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


class _Run:
    """``Trainer.run(state, iterations)``: the fused program, or the compiled iteration called
    ``iterations`` times (``Trainer.fused``). ``lower(state, iterations)`` lowers the fused
    program (the one TPU and GPU run, and CPU for networks without convolutions) whichever way
    this trainer runs."""

    def __init__(self, trainer: Trainer, fused_run: Any) -> None:
        self._trainer, self._fused_run = trainer, fused_run
        self.lower = fused_run.lower

    def __call__(self, state: TrainState, iterations: int) -> tuple[TrainState, dict[str, Any]]:
        trainer = self._trainer
        if trainer.fused or iterations < 1:
            return self._fused_run(state, iterations)
        steps = []
        for _ in range(iterations):
            state, metrics = trainer.iteration(state)
            if trainer.devices > 1:
                # XLA:CPU runs the devices' shares of queued programs on one small thread pool:
                # with a later iteration already dispatched, an all-reduce can wait forever for
                # participants stuck behind it (until XLA's rendezvous aborts). One program at a
                # time keeps every collective's participants runnable.
                jax.block_until_ready(state)
            steps.append(metrics)
        return state, _stack(steps)  # (I, ...), as the fused scan stacks them


__all__ = ["AXIS", "Trainer", "make_mesh"]
