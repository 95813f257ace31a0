"""One run per output directory: an exclusive lock file that names the run holding it.

    lock = RunLock.acquire(out)      raises DirectoryBusy naming the holder (pid, host, start)
    ...
    lock.release()                   also at interpreter exit; the kernel drops it on any death

The lock is ``fcntl.flock`` on ``out/LOCK_NAME``, so a process that dies, even by SIGKILL, holds
nothing. The file records pid, host and start time for the message a second run prints. Where the
file system has no flock (some network mounts), the recorded pid decides: a lock whose pid is not
running on this host is stale and taken over.
"""

import atexit
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

LOCK_NAME = ".fastgp.lock"
RECORD_WAIT_S = 5.0


class DirectoryBusy(RuntimeError):
    """Another live run holds the directory's lock."""

    def __init__(self, directory: Path | str, holder: dict[str, Any]) -> None:
        who = (
            (
                f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
                f"{holder.get('started', '?')}"
            )
            if holder
            else "a process that did not say which"
        )
        super().__init__(f"{directory} is in use by another fastgp train ({who})")
        self.directory, self.holder = directory, holder


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text() or "{}")
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def _holder_record(path: Path, wait_s: float = RECORD_WAIT_S) -> dict[str, Any]:
    """The record of the process holding ``path``'s flock.

    The holder writes its record just after it takes the lock, so a second run that arrives
    in between finds the file empty; it waits up to ``wait_s`` for the record to appear.
    """
    deadline = time.monotonic() + wait_s
    while not (holder := _read(path)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return holder


def _alive_here(holder: dict[str, Any]) -> bool:
    """True if ``holder`` names a running process on this host (other than this one)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """The lock of one directory, held by this process until :meth:`release`."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd
        atexit.register(self.release)

    @classmethod
    def acquire(cls, directory: Path | str) -> "RunLock":
        """Lock ``directory`` (which must exist) or raise DirectoryBusy; OSError if unwritable."""
        path = Path(directory) / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DirectoryBusy(directory, _holder_record(path)) from None
            except OSError as err:
                if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    os.close(fd)
                    raise
                holder = _read(path)
                if _alive_here(holder):
                    os.close(fd)
                    raise DirectoryBusy(directory, holder) from None
            # The holder before us may have unlinked the file after we opened it: lock the
            # file that is at the path now.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Remove the lock file and unlock (idempotent)."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None
        atexit.unregister(self.release)


__all__ = ["DirectoryBusy", "LOCK_NAME", "RunLock"]
