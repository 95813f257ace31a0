"""What the trainer optimises: the GAN losses and the gradient penalty's use.

    losses.py        the GAN losses per sample (wasserstein, non-saturating, relativistic)
    penalties.py     where the penalty is taken, its weight schedule, lazy regularisation's Adam

Imports ``data`` and ``models`` at most.
"""
