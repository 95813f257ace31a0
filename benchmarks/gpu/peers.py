"""Attention's reverse-over-reverse step on one GPU, fastgp beside its peers (run on the device).

    python -m benchmarks.gpu.peers [--tokens 1024,4096,16384] [--budget-s 50]
                                   [--flashback MODULE:FUNCTION]
                                   [--out benchmarks/results/gpu/gpu_peers]

The step a penalty's double backward takes through attention: the gradient in (q, k, v) of
<VJP(attention)(q, k, v)(g), u>, the VJP of the VJP, on (B, T, H, D) = (4, T, 4, 64) bfloat16, not
causal. Each attention in its own program: ``fastgp.attention`` on its Triton kernels
(``backend="pallas"``), ``fastgp.naive_attention`` (``jnp``: every T x T array in memory),
``jax.nn.dot_product_attention`` with cuDNN's fused kernel, and, with ``--flashback``, a softmax
attention (q, k, v) -> o in the same layout importable as ``MODULE:FUNCTION`` (flashback's fused
backward-over-backward, built there from a fetched copy; its code is not part of fastgp).
Per cell: the compiled program's peak memory (arguments, outputs and temporaries), the median
of interleaved timed calls, and the largest difference of its gradients from jnp's over jnp's
largest entry (where jnp fits), or why there are none (a derivative the attention lacks, a program
over 90 % of the device's memory). Everything stops at the time budget; what it did not reach is
written as not measured.

``--smoke`` runs the same code at 64 tokens on CPU (the kernels in interpret mode, XLA's attention
for cuDNN's): it checks the script, not the figures.
"""

import functools
import importlib
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import benchmarks
import fastgp
from benchmarks import harness, records
from benchmarks.gpu import memory
from benchmarks.tables import markdown_table
from fastgp.measure import host_leaves, interleaved_times, relative_errors

Attention = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def attentions(smoke: bool, flashback: str | None) -> dict[str, Attention]:
    """{name: (q, k, v) -> o}, each (B, T, H, D)."""
    found: dict[str, Attention] = {
        "fastgp": functools.partial(
            fastgp.attention, backend="gpu-interpret" if smoke else "pallas"
        ),
        "jnp": fastgp.naive_attention,
        "cudnn": functools.partial(
            jax.nn.dot_product_attention, implementation="xla" if smoke else "cudnn"
        ),
    }
    if flashback:
        module, name = flashback.split(":")
        found["flashback"] = getattr(importlib.import_module(module), name)
    return found


def reverse_over_reverse(attention: Attention) -> Callable[..., tuple[jax.Array, ...]]:
    """(q, k, v, g, u_q, u_k, u_v) -> the gradient in (q, k, v) of <VJP(q, k, v)(g), u>."""

    def inner(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, *u: jax.Array) -> Any:
        cotangents = jax.vjp(attention, q, k, v)[1](g)
        return sum(jnp.sum(c.astype(jnp.float32) * w) for c, w in zip(cotangents, u, strict=True))

    return jax.grad(inner, argnums=(0, 1, 2))


def operands(b: int, t: int, h: int, d: int) -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.PRNGKey(0), 7)
    return tuple((jax.random.normal(key, (b, t, h, d)) * 0.5).astype(jnp.bfloat16) for key in keys)


def measure(
    tokens: int,
    shape: tuple[int, int, int],
    found: dict[str, Attention],
    rounds: int,
    deadline: float,
) -> list[dict[str, Any]]:
    """Each attention's compiled peak and, where it fits, its median step time."""
    b, h, d = shape
    args = operands(b, tokens, h, d)
    rows, calls = [], {}
    for name, attention in found.items():
        row: dict[str, Any] = dict(tokens=tokens, attention=name)
        if time.monotonic() > deadline:
            rows.append(row)
            continue
        step = jax.jit(reverse_over_reverse(attention))
        try:
            compiled = step.lower(*args).compile()
        except Exception as err:  # no second derivative, or no compile: a finding here
            rows.append(row | dict(error=f"{type(err).__name__}: {str(err)[:200]}"))
            continue
        row.update(peak=memory.program_bytes(compiled), fits=memory.fits(compiled))
        rows.append(row)
        if row["fits"]:
            calls[name] = functools.partial(lambda f: jax.block_until_ready(f(*args)), compiled)
    times = interleaved_times(calls, rounds=rounds, warmup=1) if calls else {}
    results = {name: call() for name, call in calls.items()}
    for row in rows:
        if row["attention"] in times:
            row["ms"] = 1e3 * float(np.median(np.asarray(times[row["attention"]])))
        if row["attention"] in results and "jnp" in results:
            row["off_jnp"] = _difference(results[row["attention"]], results["jnp"])
    return rows


def _difference(got: Any, want: Any) -> float:
    """The largest difference of the gradients in (q, k, v) from ``want``'s, over ``want``'s
    largest entry (inf where they are not finite)."""
    ours, ref = host_leaves(got), host_leaves(want)
    scale = max(float(np.max(np.abs(leaf))) for leaf in ref)
    return max(relative_errors(ours, ref, scale, ["g_q", "g_k", "g_v"]))


def _cell(row: dict[str, Any]) -> list[str]:
    if "error" in row:
        return ["fails", "", "", row["error"][:120]]
    if "peak" not in row:
        return ["not measured", "", "", ""]
    peak = f"{row['peak'] / 2**30:.2f}"
    off = f"{row['off_jnp']:.1e}" if "off_jnp" in row else ""
    return [f"{row['ms']:.2f}" if "ms" in row else "over 90 % of memory", peak, off, ""]


def table(result: dict[str, Any]) -> str:
    cells = [[f"{r['tokens']:,}", r["attention"], *_cell(r)] for r in result["rows"]]
    b, h, d = result["shape"]
    return records.page(
        f"Attention's reverse-over-reverse step on {result['device']}",
        f"Written by `python -m benchmarks.gpu.peers`. (B, H, D) = ({b}, {h}, {d}), bfloat16, not "
        "causal: the gradient in (q, k, v) of <VJP(attention)(g), u>.",
        markdown_table(
            ["tokens", "attention", "ms / step", "peak GiB", "off jnp", "why none"], cells
        ),
        result,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", default="1024,4096,16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=50.0)
    parser.add_argument("--flashback", help="MODULE:FUNCTION, a (q, k, v) -> o attention")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument(
        "--out", type=pathlib.Path, default=benchmarks.RESULTS / "gpu" / "gpu_peers"
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    tokens = [64] if args.smoke else [int(t) for t in args.tokens.split(",")]
    shape = (1, 1, 16) if args.smoke else (4, 4, 64)
    found = attentions(args.smoke, args.flashback)
    result: dict[str, Any] = dict(
        argv=sys.argv[1:] if argv is None else list(argv),
        **records.provenance(),
        device=str(jax.devices()[0].device_kind),
        shape=list(shape),
        rows=[],
    )
    for t in tokens:
        result["rows"] += measure(t, shape, found, 1 if args.smoke else args.rounds, deadline)
        records.write(args.out, result, table)
    return result


if __name__ == "__main__":
    main()
