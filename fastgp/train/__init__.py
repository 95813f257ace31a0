"""The fastgp training application: a sharded WGAN-GP trainer, its naive oracle and the CLI.

Needs the ``train`` extra (optax, orbax-checkpoint, rich, matplotlib, scikit-learn). Nothing in the
library (``fastgp.penalty`` and its helpers) imports from here.
"""
