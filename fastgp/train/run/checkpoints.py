"""Orbax checkpoints of a whole run: the TrainState and the run's metadata (config, dataset, ...).

    ckpts = Checkpoints(directory)
    ckpts.save(step, state, meta)          every process calls it; host copies are written
    ckpts.steps()                          -> committed steps, oldest first
    ckpts.verify(step)                     raises CheckpointDamaged if a file changed or is gone
    ckpts.meta(step)                       -> dict (JSON)
    ckpts.state(step, template)            -> TrainState of numpy arrays shaped like template
    ckpts.quarantine(step, to)             move a damaged checkpoint out of the way

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a run
killed mid-save leaves the previous checkpoint as the latest one. Saves are synchronous (orbax's
background threads would keep a process alive after a failed save). After each save process 0
writes ``DIGEST`` into the checkpoint: the size and SHA-256 of every file, so a truncated,
changed or deleted file is found before it is restored (orbax restores some of those silently).
A save that fails raises :class:`CheckpointWriteError`; a checkpoint that cannot be read raises
:class:`CheckpointDamaged`; both carry a one-line reason.
"""

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

DIGEST = "fastgp-digest.json"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (read-only directory, disk or inodes full, ...)."""

    def __init__(self, step: int, directory: Path | str, reason: str) -> None:
        super().__init__(f"cannot write checkpoint {step} to {directory}: {reason}")
        self.step, self.directory, self.reason = step, directory, reason


class CheckpointDamaged(ValueError):
    """A committed checkpoint whose files are missing, changed or unreadable."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"checkpoint {step} is damaged: {reason}")
        self.step, self.reason = step, reason


def reason(err: BaseException) -> str:
    """One line saying why an orbax or tensorstore call failed (no traceback, no long paths)."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror + (f": {err.filename}" if err.filename else "")
    text = str(err)
    code = re.search(r"os_error_code='?(\d+)", text)
    if code:
        return os.strerror(int(code.group(1)))
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first if len(first) <= 200 else first[:197] + "..."


def host_copy(tree: Any) -> Any:
    """Numpy copy of a pytree of (replicated) jax arrays, from this process's first replica."""
    return jax.tree.map(
        lambda a: np.array(a.addressable_data(0)) if isinstance(a, jax.Array) else np.asarray(a),
        tree,
    )


def _quiet_late_failures() -> None:
    """After a failed save or restore, tensorstore still completes the operations that were in
    flight. Each would print a traceback for a failure already reported: "Event loop is closed"
    when it calls back into the loop orbax has closed (hundreds on a full disk), or asyncio's
    "Task exception was never retrieved" or "Task was destroyed but it is pending!" about the
    writes left when that loop closed. Drop exactly those (from the start: the first can come
    before the failure reaches us); report the rest."""
    previous = sys.unraisablehook
    if getattr(previous, "_fastgp", False):
        return

    def hook(unraisable: Any) -> None:
        err = unraisable.exc_value
        if not (isinstance(err, RuntimeError) and str(err) == "Event loop is closed"):
            previous(unraisable)

    hook._fastgp = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_OrbaxTaskLeftovers())


class _OrbaxTaskLeftovers(logging.Filter):
    """Drops asyncio's records about orbax's own tasks ("Task exception was never retrieved",
    "Task was destroyed but it is pending!").

    Orbax gathers its writes and closes its loop when the gather ends. A successful gather leaves
    no task behind; a failed one reached the caller as an exception, and its other writes are
    those records' tasks."""

    _ORBAX = str(Path(ocp.__file__).parent)

    def filter(self, record: logging.LogRecord) -> bool:
        if f"defined at {self._ORBAX}" in record.getMessage():
            return False
        err = record.exc_info[1] if record.exc_info else None
        frames = traceback.extract_tb(err.__traceback__) if err is not None else []
        return not any(frame.filename.startswith(self._ORBAX) for frame in frames)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Checkpoints:
    """Step-numbered checkpoints under ``directory`` (keeps the newest ``max_to_keep``)."""

    def __init__(self, directory: Path | str, max_to_keep: int = 3) -> None:
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta")
        )
        _quiet_late_failures()

    def steps(self) -> list[int]:
        """Steps of every committed checkpoint, oldest first (damaged ones included)."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """Step of the newest committed checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Write ``state`` (host copy) and ``meta`` as checkpoint ``step``; returns when done."""
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(host_copy(state)), meta=ocp.args.JsonSave(meta)
        )
        try:
            self._manager.save(step, args=args, force=True)
            self._manager.wait_until_finished()
            if jax.process_index() == 0:
                self._write_digest(step)
        except Exception as err:
            self._remove_partial(step)
            raise CheckpointWriteError(step, self.directory, reason(err)) from err

    def verify(self, step: int) -> None:
        """Raise CheckpointDamaged unless every file recorded at save time is unchanged.

        A checkpoint without a digest (written by an older version) passes; restoring it is
        then the only check."""
        root = self.directory / str(step)
        try:
            digest = json.loads((root / DIGEST).read_text())["files"]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointDamaged(step, f"unreadable {DIGEST} ({reason(err)})") from None
        for name, (size, sha) in sorted(digest.items()):
            path = root / name
            if not path.is_file():
                raise CheckpointDamaged(step, f"{name} is missing")
            if path.stat().st_size != size:
                raise CheckpointDamaged(
                    step, f"{name} has {path.stat().st_size} bytes, {size} were written"
                )
            if _sha256(path) != sha:
                raise CheckpointDamaged(step, f"{name} changed since it was written")

    def meta(self, step: int) -> dict[str, Any]:
        """The metadata saved with checkpoint ``step``."""
        try:
            meta = self._manager.restore(
                step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
            ).meta
        except Exception as err:
            raise CheckpointDamaged(step, f"its metadata cannot be read ({reason(err)})") from None
        if not isinstance(meta, dict) or not {"dataset", "config"} <= set(meta):
            raise CheckpointDamaged(step, "its metadata lacks the run's dataset and config")
        return meta

    def state(self, step: int, template: Any) -> Any:
        """Checkpoint ``step``'s state with the structure, shapes and dtypes of ``template``."""
        abstract = jax.tree.map(
            lambda a: np.zeros(np.shape(a), np.asarray(a).dtype), host_copy(template)
        )
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
            ).state
        except Exception as err:
            raise CheckpointDamaged(step, f"its state cannot be read ({reason(err)})") from None
        return jax.tree.map(np.asarray, restored)

    def quarantine(self, step: int, to: Path | str) -> Path:
        """Move checkpoint ``step`` into the directory ``to`` (process 0); returns where it went."""
        to = Path(to)
        to.mkdir(parents=True, exist_ok=True)
        target, n = to / str(step), 1
        while target.exists():
            n += 1
            target = to / f"{step}-{n}"
        shutil.move(str(self.directory / str(step)), str(target))
        return target

    def reload(self) -> None:
        """Forget cached steps (after checkpoints were moved by this or another process)."""
        self._manager.reload()

    def close(self) -> None:
        self._manager.close()

    def _write_digest(self, step: int) -> None:
        root = self.directory / str(step)
        files = {
            str(p.relative_to(root)): [p.stat().st_size, _sha256(p)]
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != DIGEST
        }
        tmp = root / (DIGEST + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"files": files}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / DIGEST)

    def _remove_partial(self, step: int, settle_s: float = 0.25, limit_s: float = 5.0) -> None:
        """Best effort: drop the temporary directory a failed save left (it may fill a disk).

        Tensorstore finishes the writes that were in flight when the failure reached us, and
        they recreate directories after a first removal; so remove until none has reappeared
        for ``settle_s`` (at most ``limit_s``)."""
        if jax.process_index() != 0:
            return
        start = quiet_since = time.monotonic()
        while time.monotonic() - start < limit_s:
            partial = list(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))
            for path in partial:
                shutil.rmtree(path, ignore_errors=True)
            if partial:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= settle_s:
                return
            time.sleep(0.02)


__all__ = [
    "DIGEST",
    "CheckpointDamaged",
    "CheckpointWriteError",
    "Checkpoints",
    "host_copy",
    "reason",
]
