"""``fastgp check`` on a list of cells, for the correct trainer and with a planted error, in one
process of one JAX job (tests/train/test_check_bounds.py).

    python tests/check_grid_worker.py DEVICES CELLS_JSON [COORDINATOR PROCESSES PROCESS_ID]
    -> one JSON line per cell (process 0 only): {"cell", "ok", "planted_ok", "correct", "planted"}

DEVICES: CPU devices of this process (set before JAX starts). CELLS_JSON: a list of
``fastgp.train.run.check.run_check`` keyword arguments, ``batch_size`` among them; each runs on
every device of the job. With COORDINATOR the process joins a job of PROCESSES processes (gloo
collectives, as ``fastgp check --processes``) and the check runs on the XLA backend.

The planted error: every gradient the sharded trainer all-reduces comes out 1.0001 times too large
(its one all-reduce, ``trainer._packed_value_and_grad``, wrapped, as the "scaled_gradients"
scenario of tests/multidevice_worker.py plants it), the smallest error the check must catch.
"""

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))

# The imports below come after the device count is set, before anything can start JAX (E402).
from fastgp.train.cli.launcher import start_distributed  # noqa: E402
from fastgp.train.run import check  # noqa: E402
from fastgp.train.trainers import trainer  # noqa: E402

PLANTED_SCALE = 1.0001
HONEST = trainer._packed_value_and_grad


def planted(*args, **kwargs):
    """The all-reduced gradients, PLANTED_SCALE times too large."""
    value, grads = HONEST(*args, **kwargs)
    return value, jax.tree.map(lambda g: PLANTED_SCALE * g, grads)


def run(cell: dict, plant: bool) -> dict:
    trainer._packed_value_and_grad = planted if plant else HONEST
    try:
        return check.run_check(jax.device_count(), **cell)
    finally:
        trainer._packed_value_and_grad = HONEST


def main() -> None:
    cells = json.loads(sys.argv[2])
    if len(sys.argv) > 3:
        coordinator, processes, process_id = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        start_distributed(coordinator, processes, process_id)
    for cell in cells:
        correct, wrong = run(cell, False), run(cell, True)
        if jax.process_index() == 0:
            record = {
                "cell": {**cell, "devices": jax.device_count(), "processes": jax.process_count()},
                "ok": correct["ok"],
                "planted_ok": wrong["ok"],
                "correct": correct["max_rel_diff"],
                "planted": wrong["max_rel_diff"],
                "tolerance": correct["tolerance"],
                "seconds": correct["seconds"] + wrong["seconds"],
            }
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
