"""Orbax checkpoints of a whole run: the TrainState and the run's metadata (config, dataset, ...).

    ckpts = Checkpoints(directory)
    ckpts.save(step, state, meta)          every process calls it; host copies are written
    ckpts.latest_step()                    -> int or None (only complete checkpoints count)
    ckpts.meta(step)                       -> dict (JSON)
    ckpts.state(step, template)            -> TrainState of numpy arrays shaped like template

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a run
killed mid-save leaves the previous checkpoint as the latest one. Saves are synchronous.
"""

from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp


def host_copy(tree):
    """Numpy copy of a pytree of (replicated) jax arrays, from this process's first replica."""
    return jax.tree.map(lambda a: np.array(a.addressable_data(0)) if isinstance(a, jax.Array)
                        else np.asarray(a), tree)


class Checkpoints:
    """Step-numbered checkpoints under ``directory`` (keeps the newest ``max_to_keep``)."""

    def __init__(self, directory, max_to_keep: int = 3):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "meta"))

    def latest_step(self):
        """Step of the newest complete checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state, meta: dict) -> None:
        """Write ``state`` (host copy) and ``meta`` as checkpoint ``step``; waits until done."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(host_copy(state)),
                                  meta=ocp.args.JsonSave(meta))
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()

    def meta(self, step: int) -> dict:
        """The metadata saved with checkpoint ``step``."""
        return self._manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore())).meta

    def state(self, step: int, template):
        """Checkpoint ``step``'s state with the structure, shapes and dtypes of ``template``."""
        abstract = jax.tree.map(lambda a: np.zeros(np.shape(a), np.asarray(a).dtype),
                                host_copy(template))
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract))).state
        return jax.tree.map(np.asarray, restored)

    def close(self) -> None:
        self._manager.close()


__all__ = ["Checkpoints", "host_copy"]
