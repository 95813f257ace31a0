"""The trainers: the sharded GAN trainer and the one-device oracle it must equal.

    state.py          TrainState, initialisation, optimisers and the RNG derivation
    averaging.py      the generator's parameter average, the last step of its optimiser
    trainer.py        the shard_map GAN trainer
    naive_trainer.py  the oracle: GAN training written plainly, on one device
    fusion.py         whether Trainer.run fuses its iterations into one lax.scan by default
    core_stats.py     per-core input-gradient norm statistics, summarised on the host
    nonfinite.py      the first non-finite loss of a chunk, or a non-finite state

Imports ``config``, ``objective``, ``models`` and ``data`` at most.
"""
