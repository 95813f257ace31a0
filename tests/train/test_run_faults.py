"""``fastgp train`` under faults: damaged or unwritable checkpoints, a full disk, two runs in one
--out, SIGTERM/SIGINT, diverging training, and a mesh that does not divide a resumed batch.

Every run is a subprocess, as a user would start it. One short uninterrupted run (``reference``)
is shared: resumed runs must end bitwise equal to it. Runs share a persistent JAX compilation cache
so that each one compiles the training step once per test session.
"""

import asyncio
import contextlib
import fcntl
import gc
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import tensorstore as ts
from orbax.checkpoint._src.asyncio_utils import cancellable
from orbax.checkpoint._src.serialization.type_handlers import NumpyHandler

from fastgp.train.recipes.defaults import build_problem, default_config
from fastgp.train.run.checkpoints import DIGEST, Checkpoints
from fastgp.train.run.lock import LOCK_NAME
from fastgp.train.trainers.state import init_state

ROOT = Path(__file__).resolve().parents[2]
STEPS = 100
# Chunks of 5 steps, checkpoints every 20 (orbax keeps the newest 3: 60, 80, 100 at the end).
FLAGS = [
    "--steps",
    str(STEPS),
    "--batch-size",
    "32",
    "--log-every",
    "5",
    "--checkpoint-every",
    "20",
    "--eval-every",
    "50",
    "--eval-samples",
    "200",
    "--no-progress",
]
CLI = [sys.executable, "-m", "fastgp.train.cli"]


@pytest.fixture(scope="module")
def env(child_env):
    return child_env


def fastgp(env, *args, timeout=240, **kwargs):
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, **kwargs
    )


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def start(env, *args, **kwargs):
    return subprocess.Popen(
        [*CLI, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def metric_steps(out):
    return [
        json.loads(line)["step"] for line in (Path(out) / "metrics.jsonl").read_text().splitlines()
    ]


def state_at(out, step):
    config = default_config("8gaussians", batch_size=32, total_steps=STEPS, backend="xla")
    template = init_state(config, *build_problem("8gaussians", config)[:2])
    return Checkpoints(Path(out) / "checkpoints").state(step, template)


def assert_bitwise_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y), "states differ"


def one_clear_line(proc, *words):
    """The run failed with exactly one line on stderr, holding ``words``, and no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fastgp train: error: "), proc.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def reference(run_tmp_path, env):
    """An uninterrupted run (made once per session, also under pytest-xdist) and its end state."""
    out = run_tmp_path / "faults-reference"
    with open(run_tmp_path / "faults-reference.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "summary.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            ok(fastgp(env, "train", *FLAGS, "--out", str(out)))
    assert not (out / LOCK_NAME).exists()  # released at exit
    return out, state_at(out, STEPS)


def copy_of(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    return out


# --- 1. damaged checkpoints are skipped; resume is bitwise equal -------------------------------


def _largest_data_file(step_dir):
    return max(
        (p for p in (step_dir / "state").rglob("d/*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )


def _truncate(step_dir):
    path = _largest_data_file(step_dir)
    os.truncate(path, path.stat().st_size // 2)


def _overwrite(step_dir):
    path = _largest_data_file(step_dir)
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(bytes(64))


DAMAGE = {
    "truncated-data-file": _truncate,
    "deleted-data-file": lambda d: _largest_data_file(d).unlink(),
    "changed-data-bytes": _overwrite,  # orbax may restore this without noticing
    "missing-manifest": lambda d: next((d / "state").rglob("manifest.ocdbt")).unlink(),
    "missing-metadata": lambda d: (d / "state" / "_METADATA").unlink(),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_newest_checkpoint_is_skipped_and_resume_is_bitwise_equal(
    reference, tmp_path, env, damage
):
    out = copy_of(reference, tmp_path)
    DAMAGE[damage](out / "checkpoints" / str(STEPS))
    proc = ok(fastgp(env, "train", "--resume", "--out", str(out), "--no-progress"))
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr  # what was skipped, where it resumed
    assert lines[0].startswith(f"fastgp train: checkpoint {STEPS} is damaged: "), lines[0]
    assert lines[1] == "fastgp train: resuming from checkpoint 80, the newest intact one"
    assert (out / "checkpoints-damaged" / str(STEPS)).is_dir()
    assert Checkpoints(out / "checkpoints").steps() == [60, 80, STEPS]
    assert_bitwise_equal(state_at(out, STEPS), reference[1])
    assert metric_steps(out) == list(range(5, STEPS + 1, 5))


@pytest.mark.slow
def test_every_checkpoint_damaged_is_an_error_naming_them(reference, tmp_path, env):
    out = copy_of(reference, tmp_path)
    for step in (60, 80, STEPS):
        (out / "checkpoints" / str(step) / "state" / "_METADATA").unlink()
    proc = fastgp(env, "train", "--resume", "--out", str(out), "--no-progress")
    assert proc.returncode == 2
    one_clear_line(proc, "--resume: every checkpoint in", "60:", "80:", f"{STEPS}:")


def test_resume_without_a_checkpoint_is_an_error_naming_the_directory(tmp_path, env):
    proc = fastgp(env, "train", "--resume", "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 2
    one_clear_line(proc, f"no checkpoint in {tmp_path / 'checkpoints'}", "drop --resume")
    assert not (tmp_path / "metrics.jsonl").exists()


# --- 1. checkpoints that cannot be written end the run at once --------------------------------


@contextlib.contextmanager
def read_only(path):
    """``path`` unwritable for this user: mode 555, or the immutable flag when running as root
    (root ignores modes); skips where neither is possible."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    try:
        immutable = subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    except FileNotFoundError:
        immutable = False
    if not immutable:
        pytest.skip("running as root without chattr +i: root can write any directory")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.slow
def test_unwritable_checkpoints_end_the_run_at_once(tmp_path, env):
    (tmp_path / "checkpoints").mkdir(parents=True)
    with read_only(tmp_path / "checkpoints"):
        proc = fastgp(env, "train", *FLAGS, "--out", str(tmp_path), timeout=180)
    assert proc.returncode == 1
    one_clear_line(proc, "cannot write checkpoint 20 to", "The run stopped at step 20")
    assert not (tmp_path / "summary.json").exists()


# Orbax creates each checkpoint's temporary directory with os.makedirs; with no inodes left that
# fails with ENOSPC (before this was handled, the process never exited).
INODES_EXHAUSTED = """
import errno, os, sys
real_makedirs = os.makedirs
def makedirs(path, *args, **kwargs):
    if "orbax-checkpoint-tmp" in str(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return real_makedirs(path, *args, **kwargs)
os.makedirs = makedirs
from fastgp.train.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_no_inodes_left_ends_the_run_at_once(tmp_path, env):
    proc = subprocess.run(
        [sys.executable, "-c", INODES_EXHAUSTED, "train", *FLAGS, "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1
    one_clear_line(proc, "cannot write checkpoint 20", "No space left on device")


# Writes past 64 KiB fail (EFBIG) inside tensorstore, as writes to a full disk fail (ENOSPC).
FILE_SIZE_LIMITED = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
sys.argv[0] = "fastgp"
runpy.run_module("fastgp.train.cli", run_name="__main__")
"""


@pytest.mark.slow
def test_disk_full_while_checkpointing_is_one_message(tmp_path, env):
    env = {k: v for k, v in env.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
    env.pop("JAX_COMPILATION_CACHE_DIR")  # cache entries would hit the limit too
    proc = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMITED, "train", *FLAGS, "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1
    one_clear_line(proc, "cannot write checkpoint 20", "File too large")
    assert not list((tmp_path / "checkpoints").glob("*orbax-checkpoint-tmp*"))
    assert metric_steps(tmp_path) == [5, 10, 15, 20]


def test_partial_save_recreated_by_late_writes_is_removed(tmp_path):
    """Writes still in flight after a failed save recreate its directories; they go too."""
    checkpoints = Checkpoints(tmp_path)
    partial = tmp_path / "20.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp" / "d"
    partial.mkdir(parents=True)

    def late_writes():
        for _ in range(3):
            time.sleep(0.05)
            partial.mkdir(parents=True, exist_ok=True)

    writer = threading.Thread(target=late_writes)
    writer.start()
    checkpoints._remove_partial(20)
    writer.join()
    checkpoints.close()
    assert not list(tmp_path.glob("*orbax-checkpoint-tmp*"))


def _left_when_the_loop_closes(coroutine):
    """Runs ``coroutine()`` as a task until it finishes or waits, closes the loop and collects
    the task, as happens to the writes of a failed orbax save (asyncio then logs about the task).
    Nothing else holds the coroutine, so collecting the task is not left to the exit."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(coroutine())
    loop.run_until_complete(asyncio.wait([task], timeout=0.5))
    loop.close()
    del task
    gc.collect()


def asyncio_records(caplog, coroutine):
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        _left_when_the_loop_closes(coroutine)
    return [r.getMessage().splitlines()[0] for r in caplog.records]


def test_asyncio_logs_nothing_about_the_writes_of_a_failed_save(tmp_path, caplog):
    """Orbax's tasks left by a failed save, failed or pending, are not reported a second time;
    other tasks still are."""
    Checkpoints(tmp_path).close()
    file_in_a_file = {"driver": "zarr", "kvstore": {"driver": "file", "path": "/dev/null/x"}}

    def failed_write():
        return NumpyHandler()._open_and_write(np.zeros(3), file_in_a_file, ts.Context())

    assert asyncio_records(caplog, failed_write) == []
    assert asyncio_records(caplog, lambda: cancellable(asyncio.Event().wait())) == []

    async def not_orbax(fail):
        if fail:
            raise ValueError("a failure of some other task")
        await asyncio.Event().wait()

    assert asyncio_records(caplog, lambda: not_orbax(True)) == [
        "Task exception was never retrieved"
    ]
    assert asyncio_records(caplog, lambda: not_orbax(False)) == [
        "Task was destroyed but it is pending!"
    ]


# --- 2. one run per --out -----------------------------------------------------------------------


@pytest.mark.slow
def test_second_run_into_the_same_out_is_refused(tmp_path, env):
    procs = [start(env, "train", *FLAGS, "--out", str(tmp_path)) for _ in range(2)]
    results = [(p.wait(timeout=240), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, _, err in results if code == 2)
    assert "is in use by another fastgp train (pid" in loser, loser
    assert metric_steps(tmp_path) == list(range(5, STEPS + 1, 5))
    assert not (tmp_path / LOCK_NAME).exists()


# --- 3. graceful stop ---------------------------------------------------------------------------


def _wait_for_first_log(proc, out, timeout=180):
    metrics = Path(out) / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and metrics.read_text()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no metrics line"
        time.sleep(0.02)


@pytest.mark.slow
def test_sigterm_mid_run_then_resume_is_bitwise_equal(reference, tmp_path, env):
    proc = start(env, "train", *FLAGS, "--out", str(tmp_path))
    _wait_for_first_log(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] < STEPS
    stopped = summary["steps"]
    assert f"stopped by SIGTERM at step {stopped} of {STEPS}" in err, err
    assert Checkpoints(tmp_path / "checkpoints").latest_step() == stopped
    assert stopped >= metric_steps(tmp_path)[-1]
    assert (tmp_path / "samples.npy").exists() and (tmp_path / "figure.png").exists()
    assert not (tmp_path / LOCK_NAME).exists()
    ok(fastgp(env, "train", "--resume", "--out", str(tmp_path), "--no-progress"))
    assert_bitwise_equal(state_at(tmp_path, STEPS), reference[1])
    assert metric_steps(tmp_path) == list(range(5, STEPS + 1, 5))


@pytest.mark.slow
def test_sigint_stops_with_a_checkpoint(tmp_path, env):
    proc = start(env, "train", *FLAGS, "--out", str(tmp_path))
    _wait_for_first_log(proc, tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    stopped = json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert f"stopped by SIGINT at step {stopped}" in err
    assert Checkpoints(tmp_path / "checkpoints").latest_step() == stopped >= 5


@pytest.mark.slow
def test_second_signal_exits_at_once(tmp_path, env):
    proc = start(env, "train", *FLAGS, "--steps", "100000", "--out", str(tmp_path))
    _wait_for_first_log(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 143, err
    assert "second SIGTERM" in err or "stopped by SIGTERM" in err, err
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.slow
def test_sigterm_stops_every_process_of_a_multiprocess_run(tmp_path, env):
    proc = start(env, "train", *FLAGS, "--processes", "2", "--devices", "1", "--out", str(tmp_path))
    _wait_for_first_log(proc, tmp_path, timeout=300)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["processes"] == 2
    assert Checkpoints(tmp_path / "checkpoints").latest_step() == summary["steps"]
    assert summary["steps"] >= metric_steps(tmp_path)[-1]
    assert "was killed" not in err and "stopped the other processes" not in err, err


# --- 4. numerical faults ------------------------------------------------------------------------


def _strict_json(line):
    def refuse(token):
        raise ValueError(f"non-JSON token {token}")

    return json.loads(line, parse_constant=refuse)


@pytest.mark.slow
@pytest.mark.parametrize("flag,value", [("--lr", "1e30"), ("--gp-weight", "1e38")])
def test_nonfinite_training_stops_naming_step_and_quantity(tmp_path, env, flag, value):
    proc = fastgp(
        env, "train", *FLAGS, "--checkpoint-every", "5", flag, value, "--out", str(tmp_path)
    )
    assert proc.returncode == 1
    line = one_clear_line(proc, "training diverged: ")
    quantity = re.search(
        r"diverged: (\S+ (parameters|optimiser state) \S+|critic_loss|penalty|"
        r"wasserstein|generator_loss) .* (at|after) step (\d+)",
        line,
    )
    assert quantity, line
    bad = int(quantity.group(4))
    records = [_strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] >= bad
    assert not (tmp_path / "samples.npy").exists()
    latest = Checkpoints(tmp_path / "checkpoints").latest_step()
    if latest is not None:  # the last checkpoint is the last finite state
        assert latest < bad
        config = default_config("8gaussians", batch_size=32, total_steps=STEPS, backend="xla")
        template = init_state(config, *build_problem("8gaussians", config)[:2])
        kept = Checkpoints(tmp_path / "checkpoints").state(latest, template)
        assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(kept))


# --- 5. an error about a resumed run names the flag that was given ----------------------------


@pytest.mark.slow
def test_resume_on_devices_that_do_not_divide_the_batch_blames_devices(reference, tmp_path, env):
    out = copy_of(reference, tmp_path)
    proc = fastgp(env, "train", "--resume", "--devices", "3", "--out", str(out), "--no-progress")
    assert proc.returncode == 2
    line = one_clear_line(proc, "--devices 3", "batch size 32 (the checkpoint's)")
    assert "--batch-size" not in line


# --- the lock, in-process -----------------------------------------------------------------------

HOLD_LOCK = """
import sys, time
from fastgp.train.run.lock import RunLock
RunLock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


def test_lock_names_a_live_holder_and_is_free_after_it_dies(tmp_path):
    from fastgp.train.run.lock import DirectoryBusy, RunLock

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            DirectoryBusy, match=f"in use by another fastgp train \\(pid {holder.pid} on "
        ):
            RunLock.acquire(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock.acquire(tmp_path)  # SIGKILL left a stale file; it is taken
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


LOCK_THEN_RECORD_LATE = """
import fcntl, json, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
time.sleep(60)
"""


@pytest.mark.parametrize("record_after_s", [0.5, 30.0])
def test_lock_taken_but_not_yet_recorded(tmp_path, record_after_s):
    """A run that arrives between the holder's flock and its record still names the holder,
    and one whose holder never writes says so instead of hanging."""
    from fastgp.train.run.lock import DirectoryBusy, RunLock

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LOCK_THEN_RECORD_LATE,
            str(tmp_path / LOCK_NAME),
            str(record_after_s),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        expected = f"\\(pid {holder.pid} on " if record_after_s < 1 else "did not say which"
        with pytest.raises(DirectoryBusy, match=expected):
            RunLock.acquire(tmp_path)
    finally:
        holder.kill()
        holder.wait()


def test_lock_without_flock_uses_the_recorded_pid(tmp_path, monkeypatch):
    import errno
    import socket

    from fastgp.train.run import lock

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)  # lock.fcntl is this module
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    lock.RunLock.acquire(tmp_path).release()  # a dead pid on this host: stale
    path.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    with pytest.raises(lock.DirectoryBusy, match=f"pid {os.getppid()}"):
        lock.RunLock.acquire(tmp_path)


# --- unit checks of the fault detection ---------------------------------------------------------


def test_first_nonfinite_loss_names_the_first_quantity_in_computation_order():
    from fastgp.train.trainers.nonfinite import first_nonfinite_loss

    shape = (3, 5, 2)  # iterations, critic steps, cores
    metrics = {
        name: np.zeros(shape, np.float32) for name in ("critic_loss", "penalty", "wasserstein")
    }
    metrics["generator_loss"] = np.zeros((3, 2), np.float32)
    assert first_nonfinite_loss(metrics, 40) is None
    metrics["generator_loss"][1] = np.nan
    metrics["wasserstein"][2, 0] = np.inf
    assert first_nonfinite_loss(metrics, 40) == "generator_loss is nan at step 42"
    metrics["penalty"][1, 3] = -np.inf
    assert first_nonfinite_loss(metrics, 40) == ("penalty is -inf at step 42 (critic step 4 of 5)")


def test_nonfinite_state_names_the_array():
    from fastgp.train.trainers.nonfinite import nonfinite_state

    config = default_config("8gaussians")
    state = init_state(config, *build_problem("8gaussians", config)[:2])
    assert nonfinite_state(state) is None
    d_params = jax.tree.map(lambda a: a, state.d_params)
    d_params[1]["w"] = d_params[1]["w"].at[0, 0].set(np.nan)
    assert nonfinite_state(state._replace(d_params=d_params)) == (
        "critic parameters d_params[1]['w'] hold non-finite values"
    )
    adam, schedule = state.g_opt[0], state.g_opt[1:]
    nu = jax.tree.map(lambda a: a, adam.nu)
    nu[0]["b"] = nu[0]["b"].at[0].set(np.inf)
    g_opt = (adam._replace(nu=nu), *schedule)
    assert nonfinite_state(state._replace(g_opt=g_opt)) == (
        "generator optimiser state g_opt[0].nu[0]['b'] hold non-finite values"
    )


def test_metrics_are_strict_json(tmp_path):
    from fastgp.train.run.outputs import MetricsLog, read_metrics

    log = MetricsLog(tmp_path)
    log.append({"step": 1, "critic_loss": float("nan"), "norm_mean": [float("inf"), 1.0]})
    line = (tmp_path / "metrics.jsonl").read_text()
    assert _strict_json(line) == {"step": 1, "critic_loss": None, "norm_mean": [None, 1.0]}
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["critic_loss"] is None


@pytest.mark.slow
def test_digest_lists_every_file_of_a_checkpoint(reference):
    step_dir = reference[0] / "checkpoints" / str(STEPS)
    files = json.loads((step_dir / DIGEST).read_text())["files"]
    on_disk = {
        str(p.relative_to(step_dir))
        for p in step_dir.rglob("*")
        if p.is_file() and p.name != DIGEST
    }
    assert set(files) == on_disk and any(name.startswith("state/") for name in files)
