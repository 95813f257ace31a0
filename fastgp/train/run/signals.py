"""Graceful stop on SIGTERM and SIGINT: the first asks the run to stop, a second exits at once.

    stop = StopRequest(announce=True).install()      in the main thread
    ...  if stop.requested: checkpoint, write outputs, return       (checked between chunks)
    stop.uninstall()

The signal is seen at once even while the main thread waits inside XLA: Python's C-level handler
writes its number to a wakeup pipe and a watcher thread reads it. The first signal sets
``requested`` (its name) and prints one line; the second prints one line, runs the ``on_exit``
callbacks (e.g. releasing the run's lock) and ends the process with status 128 + signal number.
"""

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Turns SIGTERM/SIGINT into a stop request; see the module docstring."""

    def __init__(self, announce: bool = True, prefix: str = "fastgp train"):
        self.requested: str | None = None  # "SIGTERM" / "SIGINT" once a signal arrived
        self.signum: int | None = None
        self.announce, self.prefix = announce, prefix
        # callables run before a second signal ends the process
        self.on_exit: list[Callable[[], object]] = []
        self._previous: dict[signal.Signals, Any] | None = None
        self._previous_wakeup = -1
        self._read_fd = self._write_fd = -1

    def install(self) -> "StopRequest":
        """Take over SIGTERM and SIGINT (main thread only; elsewhere nothing is installed)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous = {s: signal.signal(s, _ignore) for s in SIGNALS}
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="fastgp-signals", daemon=True).start()
        return self

    def uninstall(self) -> None:
        """Give SIGTERM and SIGINT back their previous handlers."""
        if self._previous is None:
            return
        signal.set_wakeup_fd(self._previous_wakeup)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = None
        os.close(self._write_fd)  # the watcher reads EOF and ends

    def _say(self, text: str) -> None:
        print(f"{self.prefix}: {text}", file=sys.stderr, flush=True)

    def _watch(self) -> None:
        fd = self._read_fd
        while True:
            try:
                data = os.read(fd, 1)
            except OSError:
                return
            if not data:
                os.close(fd)
                return
            signum = data[0]
            if signum not in SIGNALS:
                continue
            name = signal.Signals(signum).name
            if self.requested is None:
                self.requested, self.signum = name, signum
                if self.announce:
                    self._say(
                        f"{name} received: stopping after the current chunk with a "
                        f"checkpoint and the outputs ({name} again to stop at once)"
                    )
                continue
            if self.announce:
                self._say(f"second {name}: stopping now, without a checkpoint")
            for callback in self.on_exit:
                try:
                    callback()
                except Exception:
                    pass
            os._exit(128 + signum)


def _ignore(signum: int, frame: Any) -> None:
    """The Python-level handler; the watcher thread does the work."""


__all__ = ["SIGNALS", "StopRequest"]
