"""Several local processes as one JAX job: the supervisor that starts them, the set-up inside each.

    set_cpu_devices(n)                     XLA_FLAGS for n simulated CPU devices (before JAX starts)
    with_cpu_devices(n, module, argv)      n simulated CPU devices here, or rerun with them -> exit
    free_port() / check_port(port)         a coordinator port for 127.0.0.1
    supervise(commands, env)               start the processes, stop all if one fails -> exit code
    start_distributed(coordinator, P, i)   inside process i: gloo collectives + distributed init

Process 0 hosts the coordinator. The supervisor watches every child: when one exits with an error
or is killed, it stops the others (after ``GRACE_S``, so that a failure every process saw is
reported by process 0) and says which one died, so nothing waits on a peer that is gone. Of
several found dead at one look, one killed from outside or crashed is named before one that
aborted (SIGABRT), since that is how a process ends when a collective's peer vanishes. Inside
each process the coordination service's heartbeat (``HEARTBEAT_S``) is the second line of
defence: a process whose peer stops answering aborts with "tasks are unhealthy" instead of
hanging in a collective. When one fails while a peer is stopped (SIGSTOP, a debugger: what a hung
host looks like here), the supervisor names the stopped peer as the cause, not the process that
aborted on losing its heartbeat, and kills it at once (SIGKILL; a stopped process gets no other
signal). A child also dies with its supervisor (Linux ``PR_SET_PDEATHSIG``).

With ``graceful=True`` (``fastgp train``), SIGTERM or SIGINT to the supervisor is passed on once
to every child (each in its own process group, so a terminal's Ctrl-C reaches them only this way);
the children stop together at their next chunk end and the supervisor returns their status
(128 + the signal number). A second signal, or the first without ``graceful``, kills them all.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

FORCE_FLAG = "--xla_force_host_platform_device_count"
HEARTBEAT_S = 10  # a peer silent this long is declared dead by the coordination service
INIT_TIMEOUT_S = 60  # all processes must join within this long
POLL_S = 0.2
GRACE_S = 3.0  # after one child fails, the others may exit by themselves this long


def set_cpu_devices(
    n: int, env: MutableMapping[str, str] | None = None
) -> MutableMapping[str, str]:
    """Make JAX (not yet started) see ``n`` CPU devices: sets XLA_FLAGS in ``env`` (os.environ)."""
    if env is None:
        env = os.environ
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(FORCE_FLAG)]
    env["XLA_FLAGS"] = " ".join(flags + [f"{FORCE_FLAG}={n}"])
    return env


def with_cpu_devices(n: int, module: str, argv: Sequence[str]) -> int | None:
    """Give this process ``n`` simulated CPU devices, or run the command again where it has them.

    Returns None when the command can go on here: JAX's backends have not started (the count is
    set through the public ``jax_num_cpu_devices`` option and applies when they do), or they have
    started with at least ``n`` devices, or on a platform other than the CPU, which the count does
    not concern. Otherwise JAX started on the CPU with fewer devices in this process (a program
    used it before calling the command): ``python -m module *argv`` runs in a fresh interpreter on
    the CPU with ``n`` devices, and its exit status is returned.
    """
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)
        return None
    except RuntimeError:  # the backends have started with another count
        if jax.default_backend() != "cpu" or jax.device_count() >= n:
            return None
    env = set_cpu_devices(n, dict(os.environ, JAX_PLATFORMS="cpu"))
    return subprocess.run([sys.executable, "-m", module, *argv], env=env).returncode


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    """Raise ``OSError`` naming ``port`` if it cannot host the coordinator (already in use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError as err:
            raise OSError(
                f"port {port} is busy ({err.strerror}); pick another --port or leave "
                f"it out to use a free one"
            ) from None


def _child_setup() -> None:
    """In the child before exec: its own process group, and SIGKILL when the supervisor dies
    (Linux; else nothing). SIGKILL, not SIGTERM: SIGTERM asks a run to stop gracefully."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _stopped(pid: int) -> bool:
    """True if ``pid`` is stopped (state T or t in ``/proc/<pid>/stat``; False off Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _cause(failed: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The (process, status) that most likely caused the others among those found failed at one
    look: a signal from outside or a crash (SIGKILL, SIGSEGV, ...) first, then an error exit, then
    SIGABRT, which is how a process ends when a collective's peer vanishes under it (gloo's
    "Received data size doesn't match", the lost heartbeat). Ties go to the lowest index."""

    def rank(item: tuple[int, int]) -> tuple[int, int]:
        code = item[1]
        return (0 if code < 0 and -code != signal.SIGABRT else 1 if code > 0 else 2), item[0]

    return min(failed, key=rank)


def _failure(
    procs: Sequence[subprocess.Popen[Any]], failed: Sequence[tuple[int, int]]
) -> tuple[str, int]:
    """The error line for the processes ``failed`` ((index, status) pairs found at one look), and
    the status to exit with: names the likely cause, or the stopped peers if any."""
    names = [f"process {j} of {len(procs)} (pid {p.pid})" for j, p in enumerate(procs)]
    i, code = _cause(failed)
    after = "".join(f"; {names[j]} then {_describe(c)}" for j, c in failed if j != i)
    stopped = [names[j] for j, p in enumerate(procs) if p.poll() is None and _stopped(p.pid)]
    if not stopped:
        line = f"fastgp: error: {names[i]} {_describe(code)}{after}; stopped the other processes"
    else:
        line = (
            f"fastgp: error: {' and '.join(stopped)} stopped responding (stopped, so "
            f"{'their heartbeats' if len(stopped) > 1 else 'its heartbeat'} was lost); process {i} "
            f"then {_describe(code)}{after}; stopped the other processes"
        )
    return line, code


def _stop(procs: Sequence[subprocess.Popen[Any]], grace: float = 0.0) -> None:
    """Kill every child still running after ``grace`` seconds, or once only stopped ones are left
    (SIGKILL: SIGTERM would only ask them to stop at their next chunk end), and reap them."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(
        p.poll() is None and not _stopped(p.pid) for p in procs
    ):
        time.sleep(POLL_S / 4)
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


class _Signals:
    """SIGTERM/SIGINT received by the supervisor (the handler only counts them)."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, frame: Any) -> None:
        self.received.append(signum)


def _graceful(code: int) -> bool:
    """True for the status of a child that stopped on request (128 + SIGTERM or SIGINT)."""
    return code in (128 + signal.SIGTERM, 128 + signal.SIGINT)


def supervise(
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str] | None = None,
    *,
    quiet_others: bool = True,
    graceful: bool = False,
) -> int:
    """Run one process per command (process i gets ``commands[i]``); 0 when all succeed.

    Process 0 keeps stdout; the others' stdout is dropped when ``quiet_others`` (their errors still
    reach stderr). If any process fails, the rest are stopped and a line on stderr names it; the
    failing exit status (1 for a signal) is returned. See the module docstring for signals.
    """
    procs: list[subprocess.Popen[Any]] = []
    signals = _Signals()
    try:
        previous = {s: signal.signal(s, signals) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: signals keep their handlers
        previous = {}
    forwarded = 0
    try:
        _start(procs, commands, env, quiet_others)
        while True:
            if len(signals.received) > forwarded:
                if forwarded or not graceful:
                    return _kill_on_signal(procs, signals.received[-1], second=bool(forwarded))
                forwarded = len(signals.received)
                _forward(procs, signals.received[0])
            status = _status(procs, graceful)
            if status is not None:
                return status
            time.sleep(POLL_S)
    finally:
        _stop(procs)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _start(
    procs: list[subprocess.Popen[Any]],
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str] | None,
    quiet_others: bool,
) -> None:
    """Start process i with ``commands[i]``, appending each to ``procs`` as it starts (so that
    the caller stops those started if a later one cannot be)."""
    for i, cmd in enumerate(commands):
        out = subprocess.DEVNULL if (i and quiet_others) else None
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, preexec_fn=_child_setup))
        print(
            f"fastgp: started process {i} of {len(commands)} (pid {procs[-1].pid})",
            file=sys.stderr,
            flush=True,
        )


def _kill_on_signal(procs: Sequence[subprocess.Popen[Any]], signum: int, *, second: bool) -> int:
    """Kill every child on ``signum`` (the second one, or any without ``graceful``); 128 + it."""
    _stop(procs)
    name = signal.Signals(signum).name
    print(
        f"fastgp: {'second ' if second else ''}{name}; killed all processes",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum


def _forward(procs: Sequence[subprocess.Popen[Any]], signum: int) -> None:
    """Pass the first ``signum`` on to every running child: they stop at their next chunk end."""
    name = signal.Signals(signum).name
    print(
        f"fastgp: {name}: asking every process to stop at its next chunk end "
        f"({name} again to kill them)",
        file=sys.stderr,
        flush=True,
    )
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)


def _status(procs: Sequence[subprocess.Popen[Any]], graceful: bool) -> int | None:
    """The supervisor's exit status once it is decided, else None (children still running).

    A child that failed (a graceful stop's status excepted with ``graceful``) stops the others
    after ``GRACE_S`` and is named on stderr (of several found failed at once, the likely cause
    first): its status, 1 for a signal. Else, once every child
    has exited, the largest status."""
    codes = [p.poll() for p in procs]
    failed = [
        (i, c)
        for i, c in enumerate(codes)
        if c not in (None, 0) and not (graceful and _graceful(c))
    ]
    if failed:
        message, code = _failure(procs, failed)
        _stop(procs, grace=GRACE_S)
        print(message, file=sys.stderr, flush=True)
        return code if code > 0 else 1
    finished = [c for c in codes if c is not None]
    if len(finished) == len(codes):
        return max(finished)
    return None


def start_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join the job as ``process_id`` (gloo CPU collectives; heartbeat ``HEARTBEAT_S``)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=INIT_TIMEOUT_S,
        heartbeat_timeout_seconds=HEARTBEAT_S,
    )


__all__ = [
    "FORCE_FLAG",
    "check_port",
    "free_port",
    "set_cpu_devices",
    "start_distributed",
    "supervise",
    "with_cpu_devices",
]
