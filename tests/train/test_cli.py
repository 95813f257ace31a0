"""The ``fastgp`` command line end to end: outputs, exact resume, SIGKILL, processes, bad flags.

Every run is a subprocess (``python -m fastgp.train.cli``), as a user would start it. One short 2-D
run (``REFERENCE``) is shared: its outputs are checked, and the interrupted runs must reach exactly
its parameters.
"""

import fcntl
import json
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

from fastgp.train.cli import launcher
from fastgp.train.cli.main import main
from fastgp.train.recipes.defaults import build_problem, default_config
from fastgp.train.run.checkpoints import Checkpoints
from fastgp.train.trainers.state import init_state

ROOT = Path(__file__).resolve().parents[2]
# 400 generator steps of the 2-D recipe at batch 64: checkpoints every 50, LR decay from 200.
RUN_FLAGS = [
    "--steps",
    "400",
    "--batch-size",
    "64",
    "--checkpoint-every",
    "50",
    "--log-every",
    "50",
    "--eval-every",
    "100",
    "--eval-samples",
    "500",
    "--no-progress",
]


def fastgp(env, *args, timeout=240, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "fastgp.train.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def last_json(stdout):
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def final_state(out, step=400):
    """The TrainState checkpointed at ``step`` in ``out`` (numpy)."""
    config = default_config("8gaussians", batch_size=64, total_steps=400, backend="xla")
    template = init_state(config, *build_problem("8gaussians", config)[:2])
    return Checkpoints(Path(out) / "checkpoints").state(step, template)


def assert_same_state(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def reference(run_tmp_path, child_env):
    """An uninterrupted 400-step run: (output dir, its summary). Made once per test session, also
    under pytest-xdist (the workers take turns on a lock)."""
    out = run_tmp_path / "cli-reference"
    with open(run_tmp_path / "cli-reference.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "summary.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            fastgp(child_env, "train", *RUN_FLAGS, "--out", str(out))
    return out, json.loads((out / "summary.json").read_text())


# --- a short run leaves every output --------------------------------------------------------------


@pytest.mark.slow
def test_train_writes_every_output(reference):
    out, summary = reference
    assert summary["steps"] == 400 and summary["dataset"] == "8gaussians"
    assert summary["total_modes"] == 8 and 0 <= summary["modes"] <= 8
    assert summary["wall_s"] > 0 and summary["processes"] == 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(50, 401, 50))
    for r in records:
        assert {
            "step",
            "wall_s",
            "critic_loss",
            "penalty",
            "wasserstein",
            "generator_loss",
            "norm_mean",
            "norm_min",
            "norm_max",
            "nonfinite",
        } <= set(r)
        assert len(r["norm_mean"]) == 1 and r["nonfinite"] == [0]
        assert r["norm_min"][0] <= r["norm_mean"][0] <= r["norm_max"][0]
    assert [r["step"] for r in records if "modes" in r] == [100, 200, 300, 400]
    samples = np.load(out / "samples.npy")
    assert samples.shape == (2500, 2) and samples.dtype == np.float32
    assert np.all(np.isfinite(samples))
    png = (out / "figure.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(out / "figure.png").shape[:2] > (400, 400)
    assert Checkpoints(out / "checkpoints").latest_step() == 400
    assert json.loads((out / "summary.json").read_text()) == summary
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["total_steps"] == 400
    assert run["fused"] is True  # the MLP pair: one scan per chunk on CPU too


# --- resume: exactly the uninterrupted run --------------------------------------------------------


def test_four_device_cpu_run_completes(tmp_path, child_env):
    """One process, 4 CPU devices, the iterations dispatched one by one (``--fused off``, the way
    the digits conv pair runs on CPU): XLA:CPU's in-process all-reduce aborted after 40 s when a
    later iteration was queued behind it (two tries of 300 steps of the default recipe both died
    that way)."""
    fastgp(
        child_env,
        "train",
        "--steps",
        "300",
        "--devices",
        "4",
        "--fused",
        "off",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
        timeout=300,
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["devices"] == 4 and summary["steps"] == 300
    assert json.loads((tmp_path / "run" / "run.json").read_text())["fused"] is False


@pytest.mark.slow
def test_resume_after_n_steps_equals_uninterrupted_2n(reference, tmp_path, child_env):
    fastgp(child_env, "train", *RUN_FLAGS, "--out", str(tmp_path), "--stop-at", "200")
    assert Checkpoints(tmp_path / "checkpoints").latest_step() == 200
    proc = fastgp(child_env, "train", "--resume", "--out", str(tmp_path), "--no-progress")
    assert last_json(proc.stdout)["steps"] == 400
    assert_same_state(final_state(tmp_path), final_state(reference[0]))
    np.testing.assert_allclose(
        np.load(tmp_path / "samples.npy"),
        np.load(reference[0] / "samples.npy"),
        rtol=1e-6,
        atol=1e-6,
    )
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(50, 401, 50))


def _committed_steps(directory):
    if not directory.exists():
        return []
    return sorted(
        int(p.name)
        for p in directory.iterdir()
        if p.name.isdigit() and (p / "commit_success.txt").exists()
    )


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_continues_from_last_checkpoint(reference, tmp_path, child_env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastgp.train.cli", "train", *RUN_FLAGS, "--out", str(tmp_path)],
        cwd=ROOT,
        env=child_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 180
    while not _committed_steps(tmp_path / "checkpoints") and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr and proc.stderr.read().decode()[-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    latest = Checkpoints(tmp_path / "checkpoints").latest_step()
    assert latest is not None and latest < 400, latest
    resumed = fastgp(child_env, "train", "--resume", "--out", str(tmp_path), "--no-progress")
    assert last_json(resumed.stdout)["steps"] == 400
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == sorted(set(steps)) and steps[-1] == 400
    assert_same_state(final_state(tmp_path), final_state(reference[0]))


def test_resume_rejects_contradicting_flags(reference, tmp_path, child_env):
    out = reference[0]
    proc = fastgp(child_env, "train", "--resume", "--out", str(out), "--steps", "500", check=False)
    assert proc.returncode == 2 and "--steps 500 contradicts the checkpoint" in proc.stderr
    proc = fastgp(child_env, "train", "--out", str(out), check=False)
    assert proc.returncode == 2 and "pass --resume" in proc.stderr


# --- several processes ----------------------------------------------------------------------------


@pytest.mark.slow
def test_check_two_processes_of_two_devices(child_env):
    proc = fastgp(
        child_env,
        "check",
        "--devices",
        "2",
        "--processes",
        "2",
        "--steps",
        "2",
        "--batch-size",
        "16",
        "--n-critic",
        "2",
    )
    result = last_json(proc.stdout)
    assert result["ok"] is True and result["processes"] == 2
    assert result["mesh"]["shape"] == [4]
    assert max(result["max_rel_diff"].values()) <= 1e-4


@pytest.mark.slow
def test_two_process_train_checkpoints_and_resumes(tmp_path, child_env):
    flags = [
        "--steps",
        "20",
        "--batch-size",
        "32",
        "--checkpoint-every",
        "10",
        "--log-every",
        "10",
        "--eval-every",
        "10",
        "--no-progress",
        "--processes",
        "2",
        "--devices",
        "1",
        "--out",
        str(tmp_path),
    ]
    fastgp(child_env, "train", *flags, "--stop-at", "10")
    assert Checkpoints(tmp_path / "checkpoints").latest_step() == 10
    proc = fastgp(child_env, "train", *flags, "--resume")
    summary = last_json(proc.stdout)
    assert summary["processes"] == 2 and summary["devices"] == 2 and summary["steps"] == 20
    assert {p.name for p in tmp_path.iterdir()} >= {
        "metrics.jsonl",
        "samples.npy",
        "figure.png",
        "checkpoints",
        "summary.json",
    }
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20]
    assert all(len(r["norm_mean"]) == 2 for r in records)  # one entry per core


class _StderrLines:
    """Collects a child's stderr lines on a thread (so the pipe never fills)."""

    def __init__(self, proc):
        self.lines = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc):
        for line in proc.stderr:
            self.lines.append(line)

    def text(self):
        self._thread.join(5)
        return "".join(self.lines)


def _two_process_run(child_env, tmp_path, devices):
    """A long 2-process run, once its first metrics line is written: (supervisor, its stderr,
    the pid of process 1, every child's pid)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fastgp.train.cli",
            "train",
            "--processes",
            "2",
            "--devices",
            str(devices),
            "--steps",
            "100000",
            "--batch-size",
            "64",
            "--log-every",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=child_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    err = _StderrLines(proc)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text()) and time.monotonic() < deadline:
        assert proc.poll() is None, err.text()[-3000:]
        time.sleep(0.1)
    pids = {
        int(line.split("(pid ")[1].rstrip(")\n")): int(line.split()[3])
        for line in err.lines
        if line.startswith("fastgp: started process")
    }
    return proc, err, next(pid for pid, index in pids.items() if index == 1), pids


def _signal_and_wait(proc, err, victim, signum):
    """Send ``signum`` to ``victim``, wait up to 60 s for the run to end (then kill it; its
    children get SIGKILL through PR_SET_PDEATHSIG, stopped or not): (exit code, seconds, stderr)."""
    os.kill(victim, signum)
    sent_at = time.monotonic()
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    return code, time.monotonic() - sent_at, err.text()


@pytest.mark.slow
def test_one_process_dies_the_other_stops_with_a_clear_error(tmp_path, child_env):
    proc, err, victim, pids = _two_process_run(child_env, tmp_path, devices=2)
    code, elapsed, text = _signal_and_wait(proc, err, victim, signal.SIGKILL)
    assert code != 0 and elapsed < 60
    assert f"process 1 of 2 (pid {victim}) was killed by SIGKILL" in text, text[-3000:]
    assert all(_gone(pid) for pid in pids)


@pytest.mark.slow
def test_a_stopped_process_is_named_as_the_one_that_stopped_responding(tmp_path, child_env):
    """SIGSTOP (a hung host): the peer aborts when the heartbeat is lost; the stopped one is named
    and killed."""
    proc, err, victim, pids = _two_process_run(child_env, tmp_path, devices=1)
    code, elapsed, text = _signal_and_wait(proc, err, victim, signal.SIGSTOP)
    errors = [line for line in text.splitlines() if line.startswith("fastgp: error:")]
    assert code != 0 and elapsed < launcher.HEARTBEAT_S + launcher.GRACE_S + 10, (elapsed, text)
    assert len(errors) == 1, text[-3000:]
    assert errors[0].startswith(f"fastgp: error: process 1 of 2 (pid {victim}) stopped responding")
    assert "process 0 of 2" not in errors[0], errors[0]  # the healthy one is not the cause
    assert all(_gone(pid) for pid in pids)


def test_of_two_found_dead_at_once_the_one_killed_from_outside_is_named(tmp_path, capsys):
    """Process 1 is SIGKILLed; process 0, its collective's peer gone, aborts a moment later (as
    gloo does). Both are usually dead by the supervisor's next look: process 1 is the cause."""
    marker = tmp_path / "killed"
    peer = (
        "import os, pathlib, signal, time\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        "while not m.exists(): time.sleep(0.005)\n"
        "os.abort()\n"
    )
    victim = (
        "import os, pathlib, signal\n"
        f"pathlib.Path({str(marker)!r}).touch()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    commands = [[sys.executable, "-c", peer], [sys.executable, "-c", victim]]
    assert launcher.supervise(commands) == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("fastgp: error")]
    assert re.match(r"fastgp: error: process 1 of 2 \(pid \d+\) was killed by SIGKILL", line), line


@pytest.mark.parametrize(
    "failed,cause",
    [
        ([(0, -signal.SIGABRT), (1, -signal.SIGKILL)], 1),
        ([(0, -signal.SIGABRT), (1, -signal.SIGSEGV)], 1),
        ([(0, -signal.SIGABRT), (1, 1)], 1),
        ([(0, 2), (1, -signal.SIGTERM)], 1),
        ([(0, 1), (1, 1)], 0),
        ([(1, -signal.SIGABRT), (2, -signal.SIGABRT)], 1),
    ],
)
def test_the_cause_among_failures_found_together(failed, cause):
    assert launcher._cause(failed)[0] == cause


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0


# --- bad flags: clear errors naming the flag ------------------------------------------------------


@pytest.mark.parametrize(
    "argv,flag,words",
    [
        (
            ["train", "--batch-size", "10", "--devices", "4"],
            "--batch-size",
            "not divisible by the 4",
        ),
        (
            ["check", "--batch-size", "10", "--devices", "2", "--processes", "2"],
            "--batch-size",
            "not divisible by the 4 devices",
        ),
        (["train", "--dataset", "cifar10"], "--dataset", "invalid choice: 'cifar10'"),
        (["train", "--precision", "fp8"], "--precision", "invalid choice: 'fp8'"),
        (["train", "--gp-every", "0"], "--gp-every", "must be a positive integer, got 0"),
        (["train", "--gp-weight", "-1"], "--gp-weight", "must be a finite number >= 0"),
        (["train", "--steps", "many"], "--steps", "must be a positive integer"),
        (["train", "--backend", "cuda"], "--backend", "invalid choice: 'cuda'"),
        (["check", "--dataset", "swissroll"], "--dataset", "invalid choice: 'swissroll'"),
        (["check", "--devices", "0"], "--devices", "must be a positive integer, got 0"),
        (
            ["check", "--processes", "2", "--backend", "tpu-interpret"],
            "--backend",
            "runs within one process only",
        ),
        (
            ["train", "--backend", "pallas"],
            "--backend",
            "pallas runs the kernels on TPU or GPU only",
        ),
        (
            ["check", "--backend", "pallas"],
            "--backend",
            "pallas runs the kernels on TPU or GPU only",
        ),
        (["train", "--backend", "gpu-interpret"], "--backend", "cannot run under shard_map"),
        (["check", "--backend", "interpret"], "--backend", "cannot run under shard_map"),
        (["train", "--steps", "9000000000"], "--steps", "must be at most 2147483647"),
        (["train", "--seed", str(10**23)], "--seed", "must be an integer in 0..4294967295"),
        (["check", "--seed", "-1"], "--seed", "must be an integer in 0..4294967295"),
        (["check", "--second-order", "forward"], "--second-order", "invalid choice: 'forward'"),
        (["train", "--second-order", "forward"], "--second-order", "invalid choice: 'forward'"),
        (["check", "--second-order", "auto"], "--second-order", "invalid choice: 'auto'"),
        (["check", "--gp-kind", "wgan"], "--gp-kind", "invalid choice: 'wgan'"),
        (["train", "--gp-kind", "r2"], "--gp-kind", "invalid choice: 'r2'"),
        (["check", "--precision", "f16"], "--precision", "invalid choice: 'f16'"),
        (["check", "--backend", "cuda"], "--backend", "invalid choice: 'cuda'"),
        (["train", "--fused", "yes"], "--fused", "invalid choice: 'yes'"),
        (["train", "--out", __file__], "--out", "is a file, not a directory"),
        (
            ["train", "--out", os.path.join(__file__, "run")],
            "--out",
            f"cannot be created: {__file__} is a file",
        ),
        (
            ["train", "--resume", "--out", "/nonexistent/typo"],
            "--out",
            "/nonexistent/typo does not exist, so there is no run to --resume",
        ),
    ],
)
def test_bad_flags_name_the_flag(argv, flag, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and words in err, err


def test_out_under_a_read_only_directory_names_out(tmp_path, capsys):
    from test_run_faults import read_only

    with read_only(tmp_path), pytest.raises(SystemExit) as exc:
        main(["train", "--out", str(tmp_path / "run")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"argument --out: {tmp_path / 'run'} cannot be created: {tmp_path} is not writable" in err
    ), err


def test_out_that_cannot_be_created_names_out(tmp_path, monkeypatch, capsys):
    # Where access() says yes but mkdir fails (root-squashed mounts, races): the run's own check.
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert main(["train", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"fastgp train: error: --out {tmp_path / 'run'} cannot be written (Permission denied"
    ), err


def test_too_many_critic_steps_name_the_steps_flag(tmp_path, capsys):
    assert main(["train", "--steps", "900000000", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "fastgp train: error: --steps 900000000: total_steps x n_critic = "
        "900000000 x 5 = 4500000000 critic steps"
    ), err


def _record_run_check(monkeypatch):
    """``check.run_check`` replaced by a recorder: the (args, kwargs) of every call. JAX
    starts first, with conftest's devices, so that ``--devices 2`` leaves this process's count."""
    from fastgp.train.run import check

    jax.devices()
    calls = []

    def fake_run_check(*args, **kwargs):
        calls.append((args, kwargs))
        return {"ok": True}

    monkeypatch.setattr(check, "run_check", fake_run_check)
    return calls


def test_check_calls_run_check_with_its_flags(monkeypatch):
    """``fastgp check`` parses once and calls run_check with every option it was given."""
    run_check_calls = _record_run_check(monkeypatch)
    argv = ["check", "--devices", "2", "--steps", "1", "--batch-size", "8", "--dataset", "digits"]
    argv += ["--gp-kind", "r1", "--second-order", "reverse", "--precision", "bf16"]
    argv += ["--critic", "vit"]
    assert main([*argv, "--backend", "xla", "--lr", "0.5", "--seed", "3", "--gp-every", "2"]) == 0
    (args, kwargs), *_ = run_check_calls
    assert args == (2, 1, 8)
    assert kwargs == {
        "backend": "xla",
        "n_critic": 5,
        "gp_kind": "r1",
        "gp_every": 2,
        "precision": "bf16",
        "lr": 0.5,
        "seed": 3,
        "second_order": "reverse",
        "dataset": "digits",
        "critic": "vit",
        "loss": "wasserstein",
        "gp_at": None,
    }


def test_check_takes_run_checks_defaults_through_one_parser(capsys, monkeypatch):
    """The check's defaults are run_check's: ``fastgp check`` (``python -m fastgp.train.cli
    check``) parses its flags once, with run_check's keyword arguments as their defaults."""
    import inspect

    from fastgp.train.cli.parser import build_parser
    from fastgp.train.run import check

    signature = inspect.signature(check.run_check).parameters
    defaults = {n: p.default for n, p in signature.items() if p.kind is p.KEYWORD_ONLY}
    assert defaults["second_order"] == "reverse-over-forward"
    parsed = vars(build_parser().parse_args(["check"]))
    assert {name: parsed[name] for name in defaults} == defaults
    assert (parsed["devices"], parsed["steps"], parsed["batch_size"]) == (8, 5, 64)

    run_check_calls = _record_run_check(monkeypatch)
    assert main(["check", "--devices", "2"]) == 0
    assert run_check_calls == [((2, 5, 64), defaults)]

    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps the help at the terminal's width
    with pytest.raises(SystemExit) as exc:
        main(["check", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--second-order {reverse-over-forward,reverse}" in text
    assert "(default reverse-over-forward)" in text and "forward or" not in text

    with pytest.raises(SystemExit) as exc:
        main(["check", "--second-order", "forward"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --second-order: invalid choice: 'forward'" in err, err


def test_with_cpu_devices_carries_on_or_reruns(monkeypatch):
    """JAX has started here (with conftest's CPU devices, or a count a test above asked for): up to
    that count the command goes on in this process; for more it runs again in a fresh interpreter
    with them (XLA_FLAGS), on the CPU."""
    have = jax.device_count()
    assert launcher.with_cpu_devices(have, "fastgp.train.cli", []) is None
    assert launcher.with_cpu_devices(1, "fastgp.train.cli", []) is None
    runs = []

    def fake_run(command, env):
        runs.append((command, env))
        return subprocess.CompletedProcess(command, 7)

    monkeypatch.setattr(subprocess, "run", fake_run)  # launcher.subprocess is this module
    want = str(have + 1)
    assert (
        launcher.with_cpu_devices(have + 1, "fastgp.train.cli", ["check", "--devices", want]) == 7
    )
    ((command, env),) = runs
    assert command == [sys.executable, "-m", "fastgp.train.cli", "check", "--devices", want]
    assert env["JAX_PLATFORMS"] == "cpu"
    flags = [f for f in env["XLA_FLAGS"].split() if f.startswith(launcher.FORCE_FLAG)]
    assert flags == [f"{launcher.FORCE_FLAG}={want}"]


@pytest.mark.slow
def test_check_after_jax_started_with_one_device_reruns_with_the_devices(child_env):
    """A program that used JAX (one CPU device) and then calls the command's ``main`` with
    ``check``: the check runs again in a fresh interpreter with the devices asked for."""
    argv = ["check", "--devices", "2", "--steps", "1", "--batch-size", "8", "--n-critic", "1"]
    code = (
        "import sys, jax; assert jax.device_count() == 1; "
        "from fastgp.train.cli.main import main; "
        f"sys.exit(main({[*argv, '--backend', 'xla']!r}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=child_env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["ok"] is True and result["mesh"]["shape"] == [2]


def _strict_json(text):
    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.slow
def test_digits_run_logs_the_digits_metric(tmp_path, child_env):
    """A short digits run evaluates the two-sample test and class coverage at --eval-every and at
    the end, on at least the metric's 8 sets of 898 samples, into metrics.jsonl and summary.json."""
    proc = fastgp(
        child_env,
        "train",
        "--dataset",
        "digits",
        "--steps",
        "4",
        "--log-every",
        "2",
        "--eval-every",
        "2",
        "--eval-samples",
        "100",
        "--checkpoint-every",
        "4",
        "--no-progress",
        "--out",
        str(tmp_path),
        timeout=600,
    )
    summary = last_json(proc.stdout)
    keys = ("c2st_accuracy", "c2st_floor", "classes_covered", "class_entropy")
    records = [_strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    for r in records:
        assert set(keys) <= set(r), r
        assert 0.4 <= r["c2st_floor"] <= 0.6 and r["c2st_floor"] <= r["c2st_accuracy"] <= 1.0
        assert 0 <= r["classes_covered"] <= 10 and 0.0 <= r["class_entropy"] <= 1.0
    stored = _strict_json((tmp_path / "summary.json").read_text())
    assert stored == summary and stored["steps"] == 4 and stored["dataset"] == "digits"
    assert {k: stored[k] for k in keys} == {k: records[-1][k] for k in keys}
    assert stored["c2st_samples"] == 898 and len(stored["class_histogram"]) == 10
    # --eval-samples 100 is raised to the 8 sets of 898 the Frechet distance averages over
    assert sum(stored["class_histogram"]) == 8 * 898 and stored["frechet_sets"] == 8
    assert list(stored).index("c2st_floor") == list(stored).index("c2st_accuracy") + 1
    assert np.load(tmp_path / "samples.npy").shape == (2500, 8, 8, 1)
    assert (tmp_path / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_busy_port_is_a_clear_error(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            main(["check", "--devices", "2", "--processes", "2", "--port", str(port)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --port: port {port} is busy" in err, err
