"""A ``fastgp train`` run, and ``fastgp check``.

    loop.py            train(): the chunked training loop, evaluation, logs, checkpoints, outputs
    session.py         everything before the first step, gathered in a Session
    resolve.py         which run an invocation is: a fresh recipe, or the checkpoint's run
    options.py         RunOptions, RunError, RunFailure, the cadence's defaults, warnings
    penalty_tuning.py  --second-order auto: the run's critic loss handed to fastgp.autotune
    evaluation.py      the run's Evaluator: the dataset's quality metric, logged and plotted
    checkpoints.py     orbax checkpoints of a whole run, with digests of their files
    outputs.py         metrics.jsonl, samples.npy, summary.json, run.json (and its code's commit)
    figures.py         figure.png
    progress.py        the live progress bar
    signals.py         SIGTERM and SIGINT: stop at the next chunk end
    lock.py            one run per output directory
    check.py           ``fastgp check``: the sharded trainer against the oracle, step by step
    check_bounds.py    its bounds: each compared quantity's float32 error scale, and why
    check_scales.py    those error scales at the naive state of every step, sample by sample

Imports ``recipes`` and the layers below it at most; the command (``cli``) imports this.
"""
