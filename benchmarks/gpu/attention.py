"""The long ViT critic's penalty steps through attention on one GPU: time, peak memory, capacity.

    python -m benchmarks.gpu.attention [--tokens 1024,4096,16384] [--budget-s 420]
                                       [--capacity-only]
                                       [--out benchmarks/results/gpu/attention_gpu]

For each token count, the bfloat16 critic step of ``zoo.critics.long_spec`` (critic loss and
penalty, value_and_grad over the parameters, Adam) with each attention: ``fastgp.attention`` on
its Triton kernels (``backend="pallas"``) and on its blockwise XLA loops (``"xla"``), the zoo's
softmax attention (``jnp``, every T x T array in memory), and ``jax.nn.dot_product_attention``
with cuDNN's fused kernel (first order only, so it takes ``approximate_r1`` and the plain step).
Steps: WGAN-GP, exact R1, approximate R1, and the plain step (no penalty). Each is compiled and,
where it fits, timed interleaved with the others of its token count (median seconds); peak
memory is the compiled program's (arguments + outputs + temporaries). The largest power-of-two
batch whose program fits the device's memory is searched by compiling only (``--capacity-only``
does only that, for a budget of its own). Everything stops at the time budget: what it did not
reach is written as not measured.

``--smoke`` runs the same code at 64 tokens on CPU (the kernels in interpret mode, XLA's attention
for cuDNN's; one capacity search): it checks the script, not the figures.
"""

import functools
import pathlib
import sys
import time
from typing import Any

import jax
import numpy as np

import benchmarks
from benchmarks import capacity, harness, records
from benchmarks import workloads as W
from benchmarks.gpu import memory
from benchmarks.tables import markdown_table
from benchmarks.zoo import critics as zoo
from fastgp import attention
from fastgp.measure import interleaved_times

# name: (attention, step variant of ``workloads``)
VARIANTS = {
    "fastgp/wgan-gp": ("fastgp", "fastgp"),
    "fastgp-xla/wgan-gp": ("fastgp-xla", "fastgp"),
    "jnp/wgan-gp": ("jnp", "fastgp"),
    "fastgp/exact-r1": ("fastgp", "exact-r1"),
    "cudnn/approximate-r1": ("cudnn", "approximate-r1"),
    "fastgp/plain": ("fastgp", "plain"),
    "cudnn/plain": ("cudnn", "plain"),
}
CAPACITY = ("fastgp/wgan-gp", "jnp/wgan-gp", "fastgp/exact-r1", "cudnn/approximate-r1")


def attention_fns(smoke: bool) -> dict:
    kernels = "gpu-interpret" if smoke else "pallas"
    return {
        "fastgp": functools.partial(attention, backend=kernels),
        "fastgp-xla": functools.partial(attention, backend="xla"),
        "jnp": None,
        "cudnn": functools.partial(
            jax.nn.dot_product_attention, implementation=None if smoke else "cudnn"
        ),
    }


def _compiled(spec, variant):
    structs = jax.eval_shape(lambda: W.inputs(spec))
    step = jax.jit(W.critic_step(spec, variant))
    return step, step.lower(*structs).compile()


def measure(tokens: int, batch: int, fns: dict, rounds: int, deadline: float) -> list[dict]:
    """Each variant's compiled peak and, where it fits, its median step time; variants reached
    after the deadline are left unmeasured."""
    rows, calls = [], {}
    for name, (attention_name, variant) in VARIANTS.items():
        spec = zoo.long_spec(tokens, fns[attention_name], batch=batch)
        row = dict(tokens=tokens, variant=name, batch=batch)
        if time.monotonic() > deadline:
            rows.append(row | dict(fits=None))
            continue
        try:
            step, compiled = _compiled(spec, variant)
        except Exception as err:  # no derivative rule, or a compile failure: a measurement here
            rows.append(row | dict(fits=False, error=f"{type(err).__name__}: {str(err)[:200]}"))
            continue
        row.update(peak=memory.program_bytes(compiled), fits=memory.fits(compiled))
        rows.append(row)
        if row["fits"]:
            args = W.inputs(spec)
            calls[name] = functools.partial(lambda f, a: jax.block_until_ready(f(*a)), step, args)
    times = interleaved_times(calls, rounds=rounds, warmup=1) if calls else {}
    for row in rows:
        if row["variant"] in times:
            row["step_ms"] = 1e3 * float(np.median(times[row["variant"]]))
    return rows


def largest_batch(
    tokens: int,
    name: str,
    fns: dict,
    start: int,
    cap: int,
    deadline: float,
    known: dict[int, bool] | None = None,
) -> int | None:
    """The largest power-of-two batch whose program fits (``benchmarks.capacity.search`` without
    bisection), by compiling only; None if the deadline passed first. ``known``: batch -> fits,
    for programs already compiled."""
    attention_name, variant = VARIANTS[name]

    def fits(batch: int) -> bool | None:
        if known and batch in known:
            return known[batch]
        if time.monotonic() > deadline:
            return None
        try:
            _, compiled = _compiled(zoo.long_spec(tokens, fns[attention_name], batch), variant)
        except Exception:
            return False
        return memory.fits(compiled)

    found = capacity.search(fits, start, cap=cap, bisect=False)
    return found.fit if found.settled else None


def _time_cell(row: dict) -> str:
    if "step_ms" in row:
        return f"{row['step_ms']:.1f}"
    return "not measured" if row["fits"] is None else "x"


def merged(results: list[dict]) -> dict:
    """One result of several runs on one device: each token count's rows and capacities from the
    last run that holds that count, so that every ratio in a table stays within one run. Then the
    capacity-only runs, in order, put in each capacity they measured."""
    last = {row["tokens"]: result for result in results for row in result["rows"]}
    rows = [row for t in sorted(last) for row in last[t]["rows"] if row["tokens"] == t]
    capacity = {
        key: found
        for t, result in last.items()
        for key, found in result["capacity"].items()
        if int(key.split()[0]) == t
    }
    for result in results:
        if not result["rows"]:
            capacity.update((k, v) for k, v in result["capacity"].items() if v is not None)
    runs = [{k: r[k] for k in ("argv", "machine", "commit")} for r in results]
    return dict(device=results[-1]["device"], runs=runs, rows=rows, capacity=capacity)


def table_lines(result: dict) -> list[str]:
    """The markdown table of a result: a row per token count and step."""
    head = [
        "tokens",
        "step",
        "batch",
        "ms / step",
        "peak GiB",
        "vs fastgp/wgan-gp",
        "largest batch",
    ]
    by_key = {(r["tokens"], r["variant"]): r for r in result["rows"]}
    body = []
    for r in result["rows"]:
        base = by_key.get((r["tokens"], "fastgp/wgan-gp"), {})
        ratio = (
            f"{r['step_ms'] / base['step_ms']:.2f}x" if "step_ms" in r and "step_ms" in base else ""
        )
        key = f"{r['tokens']} {r['variant']}"
        body.append(
            [
                f"{r['tokens']:,}",
                r["variant"],
                r["batch"],
                _time_cell(r),
                f"{r['peak'] / 2**30:.2f}" if "peak" in r else "",
                ratio,
                _capacity_cell(result["capacity"][key]) if key in result["capacity"] else "",
            ]
        )
    for key, found in result["capacity"].items():  # searched without a timed row
        tokens, variant = key.split(" ", 1)
        if (int(tokens), variant) not in by_key:
            cells = ["" for _ in head[2:-1]]
            body.append([f"{int(tokens):,}", variant, *cells, _capacity_cell(found)])
    return markdown_table(head, body)


def _capacity_cell(found: int | None) -> str | int:
    return "not measured" if found is None else found


def table(result: dict) -> str:
    intro = (
        f"# The long ViT critic's penalty steps through attention on {result['device']}\n\n"
        "Written by `python -m benchmarks.gpu.attention`. x: does not fit or does not compile.\n\n"
    )
    return intro + "\n".join(table_lines(result)) + "\n"


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", default="1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--capacity-only", action="store_true")
    parser.add_argument(
        "--out", type=pathlib.Path, default=benchmarks.RESULTS / "gpu/attention_gpu"
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    tokens = [64] if args.smoke else [int(t) for t in args.tokens.split(",")]
    fns = attention_fns(args.smoke)
    result: dict[str, Any] = dict(
        argv=sys.argv if argv is None else argv,
        **records.provenance(),
        device=str(jax.devices()[0].device_kind),
        rows=[],
        capacity={},
    )
    for t in [] if args.capacity_only else tokens:
        batch = 2 if args.smoke else (4 if t >= 16384 else 8)
        result["rows"] += measure(t, batch, fns, 1 if args.smoke else args.rounds, deadline)
        records.write(args.out, result, table)
    for t in tokens:
        for name in CAPACITY[:1] if args.smoke else CAPACITY:
            start = 2 if args.smoke else (4 if t >= 16384 else 8)
            cap = 4 if args.smoke else args.max_batch
            known = {
                row["batch"]: row["fits"]
                for row in result["rows"]
                if (row["tokens"], row["variant"]) == (t, name) and row["fits"] is not None
            }
            found = largest_batch(t, name, fns, start, cap, deadline, known)
            result["capacity"][f"{t} {name}"] = found
            records.write(args.out, result, table)
    print(table(result))
    return result


if __name__ == "__main__":
    main()
