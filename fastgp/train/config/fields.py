"""``TrainConfig``: each field of a run declared once, with its type, default, flag and help.

    TrainConfig(**fields)      frozen; checked on construction (``checks.check``)
    Flag                       a field's ``fastgp train`` flag: name, help, value parser, choices
    flag_of(field)             -> the Flag of a ``dataclasses.Field``, or None (no flag)
    FLAGS                      field name -> its flag's name (for errors that name the flag)

The parser builds ``fastgp train``'s recipe flags from these declarations, each defaulting to
None, the recipe's value, which its help lists (``fastgp.train.cli.parser``); ``fastgp check``
takes those of ``run_check``'s keywords. A new field is one declaration here (and its test).
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import fastgp.train.config.values as values
from fastgp.options import BACKENDS, Backend, Kind, SecondOrder
from fastgp.train.config.checks import check
from fastgp.train.config.choices import (
    CONFIG_SECOND_ORDER,
    CRITICS,
    PRECISIONS,
    TRAIN_KINDS,
    ConfigSecondOrder,
    CriticName,
    Precision,
    TrainKind,
)
from fastgp.train.objective.losses import LOSSES, Loss
from fastgp.train.objective.penalties import (
    APPROXIMATE_SCALES,
    PLACEMENTS,
    WEIGHT_SCHEDULES,
    ApproximateScale,
    Placement,
    WeightSchedule,
    default_placement,
)


class Flag(NamedTuple):
    """How ``fastgp train`` sets a field: ``name`` (``--lr`` sets both learning rates), ``help``,
    the value parser ``parse`` or the ``choices``, ``switch`` for a flag that takes no value (it
    sets True), and ``recipe_default``: whether the help lists each recipe's value (False where
    the help says what the default is)."""

    name: str
    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    switch: bool = False
    recipe_default: bool = True


def _flag(name: str, text: str, **how: Any) -> dict[str, Flag]:
    """A field's metadata: the Flag that sets it."""
    return {"flag": Flag(name, text, **how)}


# One flag sets both networks' learning rates.
_LEARNING_RATE = _flag(
    "--lr", "Adam learning rate of both networks", parse=values.number(0, open_low=True)
)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """GAN training hyperparameters. ``batch_size`` is the GLOBAL batch (all devices).

    One generator iteration is ``n_critic`` critic steps then one generator step. ``loss`` is
    the GAN loss (``fastgp.train.objective.losses``). The penalty ``gp_kind`` is taken at ``gp_at``
    (``fastgp.train.objective.penalties``; None: the kind's usual points) and applied on every
    ``gp_every``-th critic step (counted over the whole run) with weight ``gp_weight * gp_every``
    (lazy regularisation, StyleGAN2), the critic's Adam corrected as StyleGAN2's when
    ``lazy_adam``. ``gp_schedule="cosine"`` moves the weight from ``gp_weight`` to
    ``gp_weight_final`` over ``total_steps`` after ``gp_warmup`` iterations of linear warm-up.
    ``approx_scale`` says how ``gp_weight`` reaches ``approximate-r1``: as its lambda, or ("r1")
    divided by ``gp_sigma**2`` so that it reads as an exact R1 weight. ``precision`` is the
    compute dtype of both networks' ``apply``; parameters, optimiser state, losses and norms
    stay float32. ``vit_patch`` (None: the recipe's) is the ViT critic's patch side.
    ``g_average`` > 0 keeps an exponential moving average of the generator's parameters with
    that half-life in generator steps (``fastgp.train.trainers.averaging``), and samples and
    evaluations come from it; 0 keeps none. With ``decay_fraction > 0`` both learning rates stay
    constant, then decay linearly to 0 over the last ``decay_fraction`` of ``total_steps``
    generator iterations (the critic's schedule counts its ``n_critic`` steps per iteration).
    ``second_order="auto"`` must be resolved (``fastgp.train.run.penalty_tuning``) before training.
    ``gp_kind="approximate-r1"`` is ``fastgp.approximate_r1`` at ``gp_at`` with noise
    ``gp_sigma``; it takes no input-gradient, so its norm statistics are NaN, and
    ``second_order`` does not apply to it. Raises ConfigError naming the invalid field(s).
    """

    batch_size: int = dataclasses.field(
        default=64,
        metadata=_flag(
            "--batch-size",
            "GLOBAL batch, divisible by processes x devices",
            parse=values.positive_int,
        ),
    )
    n_critic: int = dataclasses.field(
        default=5,
        metadata=_flag("--n-critic", "critic steps per generator step", parse=values.positive_int),
    )
    gp_kind: TrainKind = dataclasses.field(
        default="wgan-gp",
        metadata=_flag(
            "--gp-kind",
            "penalty: two-sided WGAN-GP, one-sided LP, R1, or approximate-r1, the "
            "finite-difference R1 of fastgp.approximate_r1 with noise --gp-sigma (first-order "
            "autodiff only; --approx-scale says how --gp-weight reaches it)",
            choices=TRAIN_KINDS,
        ),
    )
    gp_target: float = 1.0
    gp_weight: float = dataclasses.field(
        default=10.0, metadata=_flag("--gp-weight", "penalty weight lambda", parse=values.number(0))
    )
    gp_every: int = dataclasses.field(
        default=1,
        metadata=_flag(
            "--gp-every",
            "apply the penalty on every k-th critic step, weight x k (StyleGAN2's lazy "
            "regularisation: k = 16; see --lazy-adam)",
            parse=values.positive_int,
        ),
    )
    gp_sigma: float = dataclasses.field(
        default=0.01,
        metadata=_flag(
            "--gp-sigma",
            "noise standard deviation of --gp-kind approximate-r1",
            parse=values.number(0, open_low=True),
        ),
    )
    lr_g: float = dataclasses.field(default=1e-4, metadata=_LEARNING_RATE)
    lr_d: float = dataclasses.field(default=1e-4, metadata=_LEARNING_RATE)
    betas: tuple[float, float] = (0.5, 0.9)
    precision: Precision = dataclasses.field(
        default="f32",
        metadata=_flag("--precision", "compute dtype of both networks", choices=tuple(PRECISIONS)),
    )
    backend: Backend = dataclasses.field(
        default="auto",
        metadata=_flag(
            "--backend",
            "penalty implementation. Default auto: XLA on every platform today (the measurements "
            "behind it: docs/performance.md); pallas forces the Pallas kernel on TPU and GPU; "
            "tpu-interpret runs it in Pallas interpret mode on CPU, for checks (far slower)",
            choices=BACKENDS,
            recipe_default=False,
        ),
    )
    latent_dim: int = 2
    seed: int = dataclasses.field(
        default=0, metadata=_flag("--seed", f"random seed, 0..{values.SEED_MAX}", parse=values.seed)
    )
    total_steps: int | None = dataclasses.field(
        default=None, metadata=_flag("--steps", "generator iterations", parse=values.positive_int)
    )
    decay_fraction: float = dataclasses.field(
        default=0.0,
        metadata=_flag(
            "--decay-fraction",
            "both learning rates decay linearly to 0 over this final fraction of --steps, "
            "0 = constant",
            parse=values.number(0, 1),
        ),
    )
    second_order: ConfigSecondOrder = dataclasses.field(
        default="reverse-over-forward",
        metadata=_flag(
            "--second-order",
            "how the penalty's parameter gradient is taken: reverse-over-forward (the VJP of a JVP "
            "of the critic) or reverse (nested grad), both exact; auto: time both on this run's "
            "critic loss at start-up (checked against the naive penalty) and train with the faster",
            choices=CONFIG_SECOND_ORDER,
        ),
    )
    critic: CriticName = dataclasses.field(
        default="conv",
        metadata=_flag(
            "--critic",
            "critic of --dataset digits or mnist: the conv network, or vit, a small ViT (4x4 "
            "patches, pre-LN blocks with fastgp.attention, a mean-pooled head) with its own recipe "
            "(docs/trainer.md)",
            choices=CRITICS,
        ),
    )
    loss: Loss = dataclasses.field(
        default="wasserstein",
        metadata=_flag(
            "--loss",
            "GAN loss: wasserstein (WGAN), non-saturating (the logistic loss of StyleGAN2-ADA and "
            "APT) or relativistic (the pairing loss softplus(D(fake) - D(real)) of R3GAN); it sets "
            "the loss alone (R3GAN's whole recipe: --recipe r3gan)",
            choices=LOSSES,
        ),
    )
    gp_at: Placement | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--gp-at",
            "where the penalty is taken: interpolates (the default of wgan-gp and wgan-lp), "
            "real (R1; the default of r1 and approximate-r1), fake (R2) or real+fake (R1 + R2, "
            "each with the full weight: R3GAN's gamma is twice --gp-weight)",
            choices=PLACEMENTS,
            recipe_default=False,
        ),
    )
    approx_scale: ApproximateScale = dataclasses.field(
        default="lambda",
        metadata=_flag(
            "--approx-scale",
            "how --gp-weight reaches approximate-r1: lambda, APT's weight of "
            "mean (D(x + sigma n) - D(x))^2, which is R1 with weight about lambda x sigma^2 "
            "(APT: 100 with sigma 0.01); or r1, that penalty divided by sigma^2, so --gp-weight "
            "reads as an exact R1 weight (the eps^2 scaling)",
            choices=APPROXIMATE_SCALES,
        ),
    )
    gp_schedule: WeightSchedule = dataclasses.field(
        default="constant",
        metadata=_flag(
            "--gp-schedule",
            "the penalty weight over the run: constant, or cosine (R3GAN's): a linear warm-up "
            "from 0 over --gp-warmup steps, then a half cosine from --gp-weight to "
            "--gp-weight-final at --steps",
            choices=WEIGHT_SCHEDULES,
        ),
    )
    gp_weight_final: float | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--gp-weight-final", "the weight a cosine --gp-schedule ends at", parse=values.number(0)
        ),
    )
    gp_warmup: int = dataclasses.field(
        default=0,
        metadata=_flag(
            "--gp-warmup", "generator steps of the schedule's warm-up", parse=values.integer
        ),
    )
    lazy_adam: bool = dataclasses.field(
        default=False,
        metadata=_flag(
            "--lazy-adam",
            "with --gp-every k > 1, correct the critic's Adam as StyleGAN2-ADA does: lr x k/(k+1), "
            "each beta to the power k/(k+1)",
            switch=True,
        ),
    )
    vit_patch: int | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--vit-patch",
            "patch side of --critic vit, dividing the image: on mnist 4 (49 tokens, the default) "
            "or 2 (196 tokens)",
            parse=values.positive_int,
            recipe_default=False,
        ),
    )
    g_average: int = dataclasses.field(
        default=0,
        metadata=_flag(
            "--g-average",
            "half-life in generator steps of the moving average of the generator's parameters "
            "(StyleGAN's G_ema) that samples and evaluations come from; 0: none, the parameters",
            parse=values.non_negative_int,
        ),
    )

    def __post_init__(self) -> None:
        check(self)

    @property
    def placement(self) -> Placement:
        """Where the penalty is taken: ``gp_at``, or the kind's default points."""
        return default_placement(self.gp_kind) if self.gp_at is None else self.gp_at

    @property
    def dtype(self) -> Any:
        """The compute dtype passed to ``apply`` (jnp.float32 or jnp.bfloat16)."""
        return PRECISIONS[self.precision]

    @property
    def exact_kind(self) -> Kind:
        """``gp_kind`` as the exact penalty's kind (``"approximate-r1"`` has none)."""
        if self.gp_kind == "approximate-r1":
            raise ValueError("gp_kind='approximate-r1' is not an exact penalty's kind")
        return self.gp_kind

    @property
    def resolved_second_order(self) -> SecondOrder:
        """``second_order`` once ``"auto"`` is resolved (``fastgp.train.run.penalty_tuning``)."""
        if self.second_order == "auto":
            raise ValueError("second_order='auto' is resolved before training")
        return self.second_order


def flag_of(field: "dataclasses.Field[Any]") -> Flag | None:
    """The flag that sets ``field`` (a field of TrainConfig), or None."""
    return field.metadata.get("flag")


FLAGS = {
    f.name: flag.name for f in dataclasses.fields(TrainConfig) if (flag := flag_of(f)) is not None
}

__all__ = ["FLAGS", "Flag", "TrainConfig", "flag_of"]
