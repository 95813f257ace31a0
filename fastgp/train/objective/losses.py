"""The GAN losses of the trainer, per sample, from the critic's float32 scores.

    critic_terms(loss, real, fake)      -> (B,): the critic's loss is their mean
    generator_terms(loss, fake, real)   -> (B,): the generator's loss is their mean
    uses_real_in_generator(loss)        -> whether generator_terms reads ``real``

With r = D(real) and f = D(fake) of the same batch index:

    loss             critic                          generator         where it comes from
    wasserstein      f - r                           -f                WGAN (Arjovsky et al.
                                                                       2017), WGAN-GP's loss
    non-saturating   softplus(f) + softplus(-r)      softplus(-f)      Goodfellow et al. 2014;
                                                                       StyleGAN2-ADA, APT
    relativistic     softplus(f - r)                 softplus(r - f)   the pairing loss
                                                                       (Jolicoeur-Martineau
                                                                       2019); R3GAN, APT2

softplus(-x) = -log sigmoid(x), the logistic loss, written with ``jax.nn.softplus`` (stable for
any score). The relativistic loss pairs real and fake sample b, so the generator's step draws real
samples too. Each loss's critic minimum is where it tells real from fake; the penalty is added
to the critic's loss by the trainer.
"""

from typing import Literal, TypeAlias

import jax

Loss: TypeAlias = Literal["wasserstein", "non-saturating", "relativistic"]
LOSSES: tuple[Loss, ...] = ("wasserstein", "non-saturating", "relativistic")


def _check(loss: str) -> None:
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")


def critic_terms(loss: Loss, real: jax.Array, fake: jax.Array) -> jax.Array:
    """(B,) per-sample critic loss from (B,) scores of real and fake samples."""
    _check(loss)
    if loss == "wasserstein":
        return fake - real
    if loss == "non-saturating":
        return jax.nn.softplus(fake) + jax.nn.softplus(-real)
    return jax.nn.softplus(fake - real)


def generator_terms(loss: Loss, fake: jax.Array, real: jax.Array | None = None) -> jax.Array:
    """(B,) per-sample generator loss from (B,) scores of its fakes (and, for the relativistic
    loss, of as many real samples: ValueError without them)."""
    _check(loss)
    if loss == "wasserstein":
        return -fake
    if loss == "non-saturating":
        return jax.nn.softplus(-fake)
    if real is None:
        raise ValueError("the relativistic generator loss pairs each fake with a real sample")
    return jax.nn.softplus(real - fake)


def uses_real_in_generator(loss: Loss) -> bool:
    """Whether the generator's loss reads real samples' scores (the relativistic loss)."""
    _check(loss)
    return loss == "relativistic"


__all__ = ["LOSSES", "Loss", "critic_terms", "generator_terms", "uses_real_in_generator"]
