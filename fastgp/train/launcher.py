"""Several local processes as one JAX job: the supervisor that starts them, the set-up inside each.

    set_cpu_devices(n)                     XLA_FLAGS for n simulated CPU devices (before JAX starts)
    free_port() / check_port(port)         a coordinator port for 127.0.0.1
    supervise(commands, env)               start the processes, stop all if one fails -> exit code
    start_distributed(coordinator, P, i)   inside process i: gloo collectives + distributed init

Process 0 hosts the coordinator. The supervisor watches every child: when one exits with an error
or is killed, it stops the others at once and says which one died, so nothing waits on a peer that
is gone. Inside each process the coordination service's heartbeat (``HEARTBEAT_S``) is the second
line of defence: a process whose peer stops answering aborts with "tasks are unhealthy" instead of
hanging in a collective. A child also dies with its supervisor (Linux ``PR_SET_PDEATHSIG``).
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

FORCE_FLAG = "--xla_force_host_platform_device_count"
HEARTBEAT_S = 10          # a peer silent this long is declared dead by the coordination service
INIT_TIMEOUT_S = 60       # all processes must join within this long
POLL_S = 0.2


def set_cpu_devices(n: int, env=None) -> dict:
    """Make JAX (not yet started) see ``n`` CPU devices: sets XLA_FLAGS in ``env`` (os.environ)."""
    env = os.environ if env is None else env
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(FORCE_FLAG)]
    env["XLA_FLAGS"] = " ".join(flags + [f"{FORCE_FLAG}={n}"])
    return env


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
            raise OSError(f"port {port} is busy ({err.strerror}); pick another --port or leave "
                          f"it out to use a free one") from None


def _die_with_parent():
    """In the child before exec: get SIGKILL when the supervisor dies (Linux; else nothing).

    SIGKILL, not SIGTERM: JAX's preemption notifier catches SIGTERM and keeps running."""
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


def _stop(procs):
    """Kill every child still running (SIGKILL: JAX processes catch SIGTERM) and reap them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


class _Terminated(Exception):
    pass


def _raise_terminated(signum, frame):
    raise _Terminated(signal.Signals(signum).name)


def supervise(commands, env=None, *, quiet_others: bool = True) -> int:
    """Run one process per command (process i gets ``commands[i]``); 0 when all succeed.

    Process 0 keeps stdout; the others' stdout is dropped when ``quiet_others`` (their errors still
    reach stderr). If any process fails, the rest are killed and a line on stderr names it; the
    failing exit status (1 for a signal) is returned.
    """
    procs = []
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: SIGTERM keeps its handler
        previous = None
    try:
        for i, cmd in enumerate(commands):
            out = subprocess.DEVNULL if (i and quiet_others) else None
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, preexec_fn=_die_with_parent))
            print(f"fastgp: started process {i} of {len(commands)} (pid {procs[-1].pid})",
                  file=sys.stderr, flush=True)
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                _stop(procs)
                print(f"fastgp: error: process {i} of {len(procs)} (pid {procs[i].pid}) "
                      f"{_describe(code)}; stopped the other processes", file=sys.stderr,
                      flush=True)
                return code if code > 0 else 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(POLL_S)
    except (KeyboardInterrupt, _Terminated) as err:
        _stop(procs)
        why = "KeyboardInterrupt" if isinstance(err, KeyboardInterrupt) else str(err)
        print(f"fastgp: interrupted ({why}); stopped all processes", file=sys.stderr,
              flush=True)
        return 130
    finally:
        _stop(procs)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def start_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join the job as ``process_id`` (gloo CPU collectives; heartbeat ``HEARTBEAT_S``)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                               initialization_timeout=INIT_TIMEOUT_S,
                               heartbeat_timeout_seconds=HEARTBEAT_S)


__all__ = ["FORCE_FLAG", "check_port", "free_port", "set_cpu_devices", "start_distributed",
           "supervise"]
