"""The GPU kernels' launch settings swept on the device: the tuned table fastgp reads.

    python -m benchmarks.gpu.sweep [--budget-s 120] [--out benchmarks/results/gpu]
    -> gpu_tuned.json (this device's row of fastgp/tuned/gpu.json), gpu_sweep.{json,md}

Attention: each of the six passes of the Triton kernels (``fastgp.kernels.attention.gpu``) on
(B, H, T, D) = (4, 4, 4096, D) bfloat16, D 64 and 128, not causal, at every candidate tile edge,
warp count and pipeline depth (``CANDIDATES``); the fastest of each pass and head dim goes in the
table. TFLOP/s by the kernels' own flop counts (``kernels.attention``'s loop counts: ``FLOPS``),
beside cuDNN's forward-plus-backward (``jax.nn.dot_product_attention``) on the same shapes by the
same counts. A candidate that does not compile, or whose results differ from the default launch's
by more than bfloat16's rounding, is left out and says why.

The penalty's norm kernel: programs per multiprocessor (``PROGRAMS_PER_SM``) on the rows of
``benchmarks.gpu.bandwidth``; the table takes the one with the least total time over the rows.

Medians of interleaved timed calls. Everything stops at the time budget: a pass it did not reach
keeps the default launch. Copy ``gpu_tuned.json``'s row into ``fastgp/tuned/gpu.json`` to keep
it; ``benchmarks/gpu/check.sh`` installs it for its later stages.

``--smoke`` runs the same code on CPU (the kernels in interpret mode, 64 tokens, D 16, two
candidates a pass, XLA's attention for cuDNN's): it checks the script, not the figures.
"""

import functools
import itertools
import json
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import benchmarks
from benchmarks import harness, records
from benchmarks.gpu.bandwidth import SHAPES
from benchmarks.tables import markdown_table
from fastgp._gpu import tuned as gpu_tuned
from fastgp.kernels.attention import gpu
from fastgp.kernels.penalty import gpu as penalty_gpu
from fastgp.measure import host_leaves, interleaved_times, relative_errors

PASSES = tuple(gpu.PASSES)
# Matmul depth per score of each pass (flops = 2 x scores x depth), kernels.attention's counts.
FLOPS = {
    "forward": lambda d, dv: d + dv,
    "tangent": lambda d, dv: 3 * d + 2 * dv,
    "vjp": lambda d, dv: (2 * d + dv) + (2 * d + 2 * dv),
    "tangent_jvp": lambda d, dv: 7 * d + 3 * dv,
    "vjp_jvp": lambda d, dv: (5 * d + 2 * dv) + (5 * d + 3 * dv),
    "second_vjp": lambda d, dv: (5 * d + 2 * dv) + (5 * d + 3 * dv),
}
CANDIDATES = [
    gpu_tuned.Launch(block, warps, stages)
    for block, warps, stages in itertools.product((32, 64, 128), (4, 8), (2, 3))
]
SMOKE_CANDIDATES = [gpu_tuned.Launch(16, 4, 2), gpu_tuned.Launch(32, 4, 2)]
PROGRAMS_PER_SM = (1, 2, 4, 8)
# A candidate's results against the default launch's: bfloat16's rounding of the outputs (the
# tiles' float32 sums differ in order only), well under a wrong tile's error.
AGREEMENT = 2e-2


def operands(name: str, shape: tuple[int, int, int, int], interpret: bool) -> tuple[jax.Array, ...]:
    """A pass's operands (``gpu.PASSES[name]``'s order): random q, k, v and directions, o and lse
    from the default forward, every key visible."""
    b, h, t, d = shape
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 16))
    x = lambda: (jax.random.normal(next(keys), (b, h, t, d)) * 0.5).astype(jnp.bfloat16)
    mask = jnp.ones((b, t), jnp.int32)
    q, k, v = x(), x(), x()
    o, lse = gpu.PASSES["forward"](q, k, v, mask, **_static(t, gpu_tuned.Launch(), interpret))
    primal = (q, k, v, o, lse)
    rows = jax.random.normal(next(keys), (b, h, t))
    return {
        "forward": (q, k, v, mask),
        "tangent": (*primal, mask, x(), x(), x()),
        "vjp": (*primal, mask, x(), rows),
        "tangent_jvp": (*primal, mask, x(), x(), x(), *primal),
        "vjp_jvp": (*primal, mask, x(), rows, *primal),
        "second_vjp": (*primal, mask, x(), x(), x(), x(), rows),
    }[name]


def _static(t: int, launch: gpu_tuned.Launch, interpret: bool = False) -> dict[str, Any]:
    block_q, block_k = gpu.gpu_blocks(t, t, launch.block)
    return dict(
        scale=0.125,
        causal=False,
        block_q=block_q,
        block_k=block_k,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        interpret=interpret,
    )


def _disagreement(got: Any, want: Any) -> float:
    """The largest difference of any result from the default launch's, over that result's
    largest entry (inf where it is not finite)."""
    errors = []
    for i, (a, b) in enumerate(zip(host_leaves(got), host_leaves(want), strict=True)):
        scale = max(float(np.max(np.abs(b))), 1e-30)
        errors += relative_errors([a], [b], scale, [f"result {i}"])
    return max(errors)


def sweep_pass(
    name: str, shape: tuple[int, int, int, int], candidates: list, rounds: int, smoke: bool
) -> list[dict[str, Any]]:
    """Every candidate's median seconds on ``name`` (or why it has none)."""
    b, h, t, d = shape
    args = operands(name, shape, smoke)
    calls: dict[str, Any] = {}
    rows = []
    key = lambda launch: f"{launch.block}/{launch.num_warps}/{launch.num_stages}"
    want = gpu.PASSES[name](*args, **_static(t, gpu_tuned.Launch(), smoke))
    for launch in candidates:
        row = {"pass": name, "head_dim": d, **vars(launch)}
        fn = functools.partial(gpu.PASSES[name], **_static(t, launch, smoke))
        try:
            got = jax.block_until_ready(fn(*args))
        except Exception as error:  # a launch the device cannot compile or run
            rows.append(row | {"error": f"{type(error).__name__}: {str(error)[:200]}"})
            continue
        off = _disagreement(got, want)
        if off > AGREEMENT:
            rows.append(row | {"error": f"differs from the default launch by {off:.1e}"})
            continue
        calls[key(launch)] = lambda fn=fn: jax.block_until_ready(fn(*args))
        rows.append(row)
    times = interleaved_times(calls, rounds=rounds, warmup=1) if calls else {}
    flops = 2 * b * h * t * t * FLOPS[name](d, d)
    for row in rows:
        launch = gpu_tuned.Launch(row["block"], row["num_warps"], row["num_stages"])
        if key(launch) in times:
            row["seconds"] = float(np.median(np.asarray(times[key(launch)])))
            row["tflops"] = flops / row["seconds"] / 1e12
    return rows


def cudnn_tflops(shape: tuple[int, int, int, int], rounds: int, smoke: bool) -> float:
    """cuDNN's forward plus backward on these shapes, TFLOP/s by fastgp's forward and VJP counts
    (XLA's attention in the smoke run)."""
    b, h, t, d = shape
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    q, k, v = (jax.random.normal(key, (b, t, h, d), jnp.bfloat16) for key in keys)
    implementation = "xla" if smoke else "cudnn"
    attend = functools.partial(jax.nn.dot_product_attention, implementation=implementation)
    step = jax.jit(lambda q, k, v: jax.vjp(attend, q, k, v)[1](attend(q, k, v)))
    seconds = np.median(
        interleaved_times({"cudnn": lambda: jax.block_until_ready(step(q, k, v))}, rounds=rounds)[
            "cudnn"
        ]
    )
    flops = 2 * b * h * t * t * (FLOPS["forward"](d, d) + FLOPS["vjp"](d, d))
    return float(flops / seconds / 1e12)


def sweep_penalty(rounds: int, smoke: bool) -> list[dict[str, Any]]:
    """The norm kernel's median seconds per row of the bandwidth table and programs per
    multiprocessor (the device's multiprocessors; an H100's in the smoke run)."""
    sms = getattr(jax.devices()[0], "core_count", None) or gpu_tuned.DEFAULT_SMS
    rows = []
    for batch, features in [(4, 5000)] if smoke else SHAPES:
        g = jax.random.normal(jax.random.PRNGKey(0), (batch, features), jnp.float32)
        calls: dict[str, Any] = {}
        for per_sm in PROGRAMS_PER_SM:
            split = penalty_gpu.splits(batch, features, 4, sms * per_sm)
            fn = functools.partial(penalty_gpu.row_sumsq, split=split, interpret=smoke)
            calls[str(per_sm)] = lambda fn=fn, g=g: jax.block_until_ready(fn(g))
        times = interleaved_times(calls, rounds=rounds)
        for per_sm_name, samples in times.items():
            seconds = float(np.median(np.asarray(samples)))
            rows.append(
                {"rows": batch, "features": features, "programs_per_sm": int(per_sm_name)}
                | {"seconds": seconds, "gb_s": g.size * 4 / seconds / 1e9}
            )
    return rows


def tuned(result: dict[str, Any]) -> dict[str, Any]:
    """This device's row of the tuned table: each pass and head dim's fastest launch, and the
    programs per multiprocessor with the least total time."""
    attention: dict[str, dict[str, dict[str, int]]] = {}
    for row in result["attention"]:
        if "seconds" not in row:
            continue
        best = attention.setdefault(row["pass"], {}).get(str(row["head_dim"]))
        if best is None or row["seconds"] < best["seconds"]:
            keep = {k: row[k] for k in ("block", "num_warps", "num_stages", "seconds")}
            attention[row["pass"]][str(row["head_dim"])] = keep
    for dims in attention.values():
        for launch in dims.values():
            del launch["seconds"]
    totals: dict[int, float] = {}
    for row in result["penalty"]:
        totals[row["programs_per_sm"]] = totals.get(row["programs_per_sm"], 0.0) + row["seconds"]
    penalty = {"programs_per_sm": min(totals, key=totals.__getitem__)} if totals else {}
    return {result["device"]: {"attention": attention, "penalty": penalty}}


def table(result: dict[str, Any]) -> str:
    """Per pass and head dim: the default launch's and the best's TFLOP/s, against cuDNN's
    forward plus backward; per programs per multiprocessor, the norm kernel's GB/s."""
    cells = []
    for (name, d), rows in itertools.groupby(
        result["attention"], key=lambda r: (r["pass"], r["head_dim"])
    ):
        timed = [r for r in rows if "seconds" in r]
        launch = lambda r: gpu_tuned.Launch(r["block"], r["num_warps"], r["num_stages"])
        default = next((r for r in timed if launch(r) == gpu_tuned.Launch()), None)
        best = min(timed, key=lambda r: r["seconds"], default=None)
        cudnn = result["cudnn_tflops"].get(str(d))
        cell = lambda r: "not measured" if r is None else f"{r['tflops']:.3g}"
        cells.append(
            [
                name,
                d,
                cell(default),
                cell(best),
                "" if best is None else "{block} / {num_warps} / {num_stages}".format(**best),
                "" if cudnn is None else f"{cudnn:.3g}",
                "" if best is None or cudnn is None else f"{best['tflops'] / cudnn:.2f}",
            ]
        )
    head = ["pass", "D", "default TFLOP/s", "best TFLOP/s", "best block / warps / stages"]
    head += ["cuDNN fwd+bwd TFLOP/s", "best / cuDNN"]
    lines = markdown_table(head, cells)
    penalty = [
        [f"{r['rows']} x {r['features']}", r["programs_per_sm"], f"{r['gb_s']:.0f}"]
        for r in result["penalty"]
    ]
    lines += ["", *markdown_table(["B x D", "programs / SM", "GB/s"], penalty)]
    skipped = [r for r in result["attention"] if "error" in r]
    lines += ["", f"Launches left out: {len(skipped)}."]
    lines += [
        "- {pass} D {head_dim} {block} / {num_warps} / {num_stages}: {error}".format(**r)
        for r in skipped
    ]
    return records.page(
        f"The GPU kernels' launch settings swept on {result['device']}",
        "Written by `python -m benchmarks.gpu.sweep`. (B, H, T) = "
        f"{tuple(result['shape'][:3])}, bfloat16, not causal; TFLOP/s by the kernels' own flop "
        "counts, medians of interleaved calls.",
        lines,
        result,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = harness.parser(__doc__)
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=benchmarks.RESULTS / "gpu")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    rounds = 1 if args.smoke else args.rounds
    b, h, t = (1, 1, 64) if args.smoke else (4, 4, 4096)
    head_dims = (16,) if args.smoke else (64, 128)
    candidates = SMOKE_CANDIDATES if args.smoke else CANDIDATES
    result: dict[str, Any] = dict(
        argv=sys.argv[1:] if argv is None else list(argv),
        **records.provenance(),
        device=str(jax.devices()[0].device_kind),
        shape=[b, h, t],
        attention=[],
        cudnn_tflops={},
        penalty=sweep_penalty(rounds, args.smoke),
    )
    for d in head_dims:
        for name in PASSES:
            if time.monotonic() > deadline:
                break
            if str(d) not in result["cudnn_tflops"]:
                result["cudnn_tflops"][str(d)] = cudnn_tflops((b, h, t, d), rounds, args.smoke)
            result["attention"] += sweep_pass(name, (b, h, t, d), candidates, rounds, args.smoke)
            print(name, d, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    records.write(args.out / "gpu_sweep", result, table)
    (args.out / "gpu_tuned.json").write_text(json.dumps(tuned(result), indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
