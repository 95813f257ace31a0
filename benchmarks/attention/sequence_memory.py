"""Sequence-parallel attention's memory per device: the ring, the all-to-all and the all-gather.

    python -m benchmarks.attention.sequence_memory [--tokens 4096 16384] [--shards 2 4 8]
        [--repeats 3] [--heads 2] [--modes shard_map explicit "auto jit"] [--scheduler memory]
    -> benchmarks/results/attention/sequence_memory.{json,md}   (--heads 8: sequence_memory_h8;
       --scheduler memory: sequence_memory_memory_scheduler; --out: a path of its own)
    python -m benchmarks.attention.sequence_memory --topology v5e:4x4 [--tokens 65536 262144]
        [--shards 1 4 8 16]
    -> benchmarks/results/attention/sequence_memory_tpu.{json,md}

Two programs of ``fastgp.attention(q, k, v)`` on B = 2 samples, 2 heads of 64 (``--heads``),
float32, XLA's
blockwise loops: the gradient of ``sum(o ** 2)`` in (q, k, v), and the reverse-over-forward
program of an exact R1 (the gradient of ``sum(jvp(attention, (q, k, v), (q, k, v))[1] ** 2)``).
Each is compiled for one CPU device holding everything, and with the tokens split over n devices:
inside ``shard_map`` (``sample_axis_name``), under explicit axes and under Auto ``jax.jit`` (the
arrays' shardings alone), with each ``sequence_parallel`` scheme that applies ("all-to-all" where
n divides the heads). The figure is the
compiled program's temporaries per device (XLA's memory analysis) over one device's, set beside
1/n; the collectives in each program; and the fastest of ``--repeats`` runs of each on this
machine's simulated devices (all on the same cores, so the times compare the schemes with each
other, not with one device; 0: compile only).

Each (T, program, n) also gets the ring's floor: what a ring step runs, the one-device program
compiled at T / n tokens, plus the state the ring keeps beside it (``RING_STATE``), over one
device's temporaries. XLA:CPU schedules for concurrency by default; ``--scheduler memory``
compiles with its memory-minimising scheduler instead
(``--xla_cpu_enable_concurrency_optimized_scheduler=false``, probed first), the floors included.

With ``--topology``, the R1 program in bfloat16 with ``backend="pallas"`` (the Mosaic kernels in
every ring step) is compiled for the chips of a TPU slice through libtpu's compile-only client,
inside ``shard_map`` over a (data, seq) = (chips / n, n) mesh, one sample per data shard: the
figure is the peak memory per chip, and per sample (the peak times n: constant where the memory
falls as 1/n).
"""

import os
import pathlib
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import benchmarks
import fastgp
from benchmarks import harness, records, xla_flags
from benchmarks.tables import markdown_table
from fastgp import measure as cf
from fastgp.options import SEQUENCE_SCHEMES as SCHEMES
from fastgp.options import Scheme

OUT = benchmarks.RESULTS / "attention" / "sequence_memory"
OUT_TPU = benchmarks.RESULTS / "attention" / "sequence_memory_tpu"
BATCH, HEADS, HEAD_DIM = 2, 2, 64
HEADS_TPU = 4  # the long ViT critic's
MODES = ("shard_map", "explicit", "auto jit")
SCHEDULERS = {
    "concurrency": (),
    "memory": ("--xla_cpu_enable_concurrency_optimized_scheduler=false",),
}
# Arrays the size of a device's q that the ring holds beside its step's one-device pass, for the
# program's largest pass: the key-side arguments it holds and the ones in flight (2 each), the
# key-side sums arriving with their block (1 each), its query-side sums (1 each). The gradient's
# VJP: k, v (x 2), g_k, g_v, g_q = 7; R1's second-order VJP (the largest of its forward, tangent,
# VJP and second VJP): k, v, dk, dv (x 2), the k and v parts of its result, its q and o parts = 12.
RING_STATE = {"gradient": 7, "reverse-over-forward": 12}
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")


def programs(attention: Any) -> dict[str, Any]:
    """{name: (q, k, v) -> the program's outputs} for an attention (q, k, v) -> o."""

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(attention(q, k, v) ** 2)

    def r1(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(jax.jvp(attention, (q, k, v), (q, k, v))[1] ** 2)

    return {
        "gradient": jax.grad(loss, argnums=(0, 1, 2)),
        "reverse-over-forward": jax.grad(r1, argnums=(0, 1, 2)),
    }


def collective_counts(text: str) -> dict[str, int]:
    counts = dict.fromkeys(COLLECTIVES, 0)
    for line in text.splitlines():
        for kind in COLLECTIVES:
            if f" {kind}(" in line or f" {kind}-start(" in line:
                counts[kind] += 1
    return {kind: n for kind, n in counts.items() if n}


def measure(program: Any, *args: jax.Array, repeats: int = 3) -> dict[str, Any]:
    """The compiled program's temporaries and collectives, and the fastest of ``repeats`` runs
    after a warm-up (seconds; none when ``repeats`` is 0)."""
    compiled = jax.jit(program).lower(*args).compile()
    figures = cf.figures(compiled)
    row = {"temp": figures["temp"], "collectives": collective_counts(compiled.as_text() or "")}
    if repeats == 0:
        return row
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return row | {"seconds": min(times)}


def sharded_attention(n: int, mode: str, scheme: Scheme) -> tuple[Any, Any]:
    """(attention over the tokens split on n devices, the placement of its inputs)."""
    devices = jax.devices()[:n]
    if mode == "shard_map":
        mesh = jax.make_mesh((n,), ("seq",), axis_types=(AxisType.Auto,), devices=devices)
        spec = P(None, "seq")
        local = lambda q, k, v: fastgp.attention(
            q, k, v, backend="xla", sample_axis_name="seq", sequence_parallel=scheme
        )
        fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    else:  # explicit axes, or Auto jax.jit: the arrays' shardings say the split
        types = AxisType.Explicit if mode == "explicit" else AxisType.Auto
        mesh = jax.make_mesh((n,), ("seq",), axis_types=(types,), devices=devices)
        spec = P(None, "seq")
        fn = lambda q, k, v: fastgp.attention(q, k, v, backend="xla", sequence_parallel=scheme)
    return fn, (mesh, spec)


def applies(scheme: Scheme, heads: int, n: int) -> bool:
    """Whether ``scheme`` runs as itself here: "auto" is one of the others, and the all-to-all
    needs n to divide the heads."""
    if scheme == "all-to-all":
        return heads % n == 0  # each device's heads a multiple of the token shards
    return scheme != "auto"


def attention_inputs(tokens: int, heads: int) -> list[jax.Array]:
    """q, k and v: (B, tokens, heads, HEAD_DIM) float32 draws."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    return [jax.random.normal(key, (BATCH, tokens, heads, HEAD_DIM)) for key in keys]


def one_device(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The attention every split is compared with: one device holding every token."""
    return fastgp.attention(q, k, v, backend="xla")


def floors(
    tokens: int, shards: list[int], one: dict[tuple[int, str], int], heads: int = HEADS
) -> list[dict[str, Any]]:
    """Per program and n: the ring's floor over one device's temporaries (``one``: {(T,
    program): bytes}, :func:`run`'s one-device rows; see the module), with what it adds up: the
    one-device program at tokens / n (``step``) and ``RING_STATE`` arrays the size of a
    device's q (``state``), in bytes."""
    q = attention_inputs(tokens, heads)[0]
    q_bytes = q.size * q.dtype.itemsize
    rows = []
    for name, program in programs(one_device).items():
        base = one[(tokens, name)]
        for n in shards:
            step = measure(program, *attention_inputs(tokens // n, heads), repeats=0)["temp"]
            state = RING_STATE[name] * q_bytes // n
            row = {"tokens": tokens, "program": name, "shards": n, "step": step, "state": state}
            rows.append(row | {"floor": (step + state) / base})
    return rows


def run(
    tokens: int,
    shards: list[int],
    repeats: int = 3,
    heads: int = HEADS,
    modes: tuple[str, ...] = MODES,
) -> list[dict[str, Any]]:
    args = attention_inputs(tokens, heads)
    rows = []
    for name, program in programs(one_device).items():
        base = measure(program, *args, repeats=repeats)
        rows.append({"tokens": tokens, "program": name, "shards": 1, **base})
        for n in shards:
            for mode in modes:
                for scheme in (s for s in SCHEMES if applies(s, heads, n)):
                    fn, (mesh, spec) = sharded_attention(n, mode, scheme)
                    placed = [jax.device_put(x, NamedSharding(mesh, spec)) for x in args]
                    sharded = programs(fn)[name]
                    if mode == "explicit":
                        with jax.set_mesh(mesh):
                            got = measure(sharded, *placed, repeats=repeats)
                    else:
                        got = measure(sharded, *placed, repeats=repeats)
                    row = {"tokens": tokens, "program": name, "shards": n, "mode": mode}
                    row |= {"scheme": scheme, **got, "of_one": got["temp"] / base["temp"]}
                    print(row, flush=True)
                    rows.append(row)
    return rows


def _ratios(result: dict[str, Any]) -> dict[tuple, float]:
    """{(T, program, n, mode, scheme): temporaries over one device's}."""
    return {
        (r["tokens"], r["program"], r["shards"], r["mode"], r["scheme"]): r["of_one"]
        for r in result["rows"]
        if r["shards"] > 1
    }


def table(result: dict[str, Any]) -> list[str]:
    """docs/performance.md's table: per T, program and n, each scheme's temporaries per device
    over one device's, in shard_map, under explicit axes and under Auto jax.jit, beside 1/n."""
    ratios = _ratios(result)
    seconds = {
        (r["tokens"], r["program"], r["shards"], r["mode"], r["scheme"]): r.get("seconds")
        for r in result["rows"]
        if r["shards"] > 1
    }
    keys = sorted({key[:3] for key in ratios})
    splits = [(s, m) for s in SCHEMES for m in MODES if any(key[3:] == (m, s) for key in ratios)]
    cell = lambda key: "" if key not in ratios else f"{ratios[key]:.3f}"  # the scheme's not here
    floor = {(r["tokens"], r["program"], r["shards"]): r["floor"] for r in result.get("floors", [])}
    cells = [
        [f"{t:,}", program, n, f"{1 / n:.3f}"]
        + ([f"{floor[(t, program, n)]:.3f}"] if floor else [])
        + [cell((t, program, n, mode, scheme)) for scheme, mode in splits]
        for t, program, n in keys
    ]
    head = ["T", "program", "n", "1 / n"] + (["ring floor"] if floor else [])
    head += [f"{scheme} ({mode})" for scheme, mode in splits]
    if all("seconds" in r for r in result["rows"]):  # records before the clock have none
        others = [s for s, m in splits if m == "shard_map" and s != "ring"]
        head += [f"{s} s / ring s (shard_map)" for s in others]
        for row, (t, program, n) in zip(cells, keys, strict=True):
            ring = seconds[(t, program, n, "shard_map", "ring")]
            for s in others:
                other = seconds.get((t, program, n, "shard_map", s))
                row.append("" if other is None else f"{other / ring:.2f}")
    return markdown_table(head, cells)


def _span(values: list[float]) -> str:
    """ "0.80x", or "0.80-0.95x": the values' range, to two decimals."""
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{low}x" if low == high else f"{low}-{high}x"


def floor_summary(result: dict[str, Any], margin: float = 0.15) -> str:
    """docs/performance.md's sentence: how many of the ring's cells (every T, program, n and
    mode) hold at most ``1 + margin`` times their floor, and the others, each over its floor."""
    floor = {(r["tokens"], r["program"], r["shards"]): r["floor"] for r in result["floors"]}
    over: dict[tuple, list[float]] = {}
    for key, ratio in _ratios(result).items():
        if key[4] == "ring":
            over.setdefault(key[:3], []).append(ratio / floor[key[:3]])
    cells = [x for xs in over.values() for x in xs]
    misses = [
        f"{t:,} tokens, {program}, n = {n}: {_span(xs)}"
        for (t, program, n), xs in sorted(over.items())
        if max(xs) > 1 + margin
    ]
    held = sum(x <= 1 + margin for x in cells)
    head = f"{held} of {len(cells)} ring cells within {margin * 100:.0f} % of their floor"
    return head + ("" if not misses else "; over it: " + "; ".join(misses))


def auto_jit_summary(result: dict[str, Any]) -> str:
    """docs/performance.md's sentence: the all-to-all under Auto jax.jit, per program, its
    temporaries per device times n over one device's (every T and n of ``result``) and its
    all-to-alls, beside shard_map's."""

    def cells(program: str, mode: str) -> list[dict[str, Any]]:
        return [
            r
            for r in result["rows"]
            if r["program"] == program and r.get("mode") == mode and r.get("scheme") == "all-to-all"
        ]

    def trades(rows: list[dict[str, Any]]) -> str:
        return "-".join(str(c) for c in sorted({r["collectives"]["all-to-all"] for r in rows}))

    held, with_ = {}, {}
    for program in ("gradient", "reverse-over-forward"):
        auto, in_map = cells(program, "auto jit"), cells(program, "shard_map")
        held[program] = _span([r["of_one"] * r["shards"] for r in auto])
        with_[program] = f"{trades(auto)} all-to-alls ({trades(in_map)} in shard_map)"
    tokens = " and ".join(f"{t:,}" for t in sorted({r["tokens"] for r in result["rows"]}))
    shards = sorted({r["shards"] for r in result["rows"] if r.get("mode") == "auto jit"})
    return (
        f"with {tokens} tokens over {', '.join(map(str, shards[:-1]))} and {shards[-1]} CPU "
        f"devices ({result['heads']} heads), the all-to-all's gradient program holds "
        f"{held['gradient']} of 1 / n of one device's temporaries per device, with "
        f"{with_['gradient']}, and its R1 program {held['reverse-over-forward']}, with "
        f"{with_['reverse-over-forward']}"
    )


def scheduler_summary(default: dict[str, Any], memory: dict[str, Any]) -> str:
    """docs/performance.md's sentence: per program, one device's temporaries and the ring's per
    device (every T, n and mode) under the memory scheduler over those under the default."""

    def temps(result: dict[str, Any], ring: bool) -> dict[tuple, int]:
        """{row's key: temporaries}: the ring's rows, or one device's."""
        return {
            (r["tokens"], r["program"], r["shards"], r.get("mode"), r.get("scheme")): r["temp"]
            for r in result["rows"]
            if (r["shards"] > 1) == ring and r.get("scheme") in (None, "ring")
        }

    parts = []
    for program in programs(one_device):
        spans = []
        for ring in (False, True):
            old, new = temps(default, ring), temps(memory, ring)
            spans.append(
                _span([new[k] / v for k, v in old.items() if k[1] == program and k in new])
            )
        parts.append(f"{program}: one device {spans[0]}, the ring {spans[1]}")
    return "; ".join(parts)


def _largest(ratios: dict[tuple, float]) -> tuple[int, int]:
    """The largest T and the largest n of a result's ratios."""
    return max(key[0] for key in ratios), max(key[2] for key in ratios)


def headline(result: dict[str, Any], heads_result: dict[str, Any]) -> str:
    """README's sentence: at the largest T and n, each scheme's range over the programs in
    shard_map (the sentence's setting); the all-to-all's from ``heads_result``, a run whose heads
    n divides."""

    def span(result: dict[str, Any], scheme: str) -> str:
        ratios = _ratios(result)
        t, n = _largest(ratios)
        return _span(
            [
                v
                for k, v in ratios.items()
                if k[0] == t and k[2] == n and k[3] == "shard_map" and k[4] == scheme
            ]
        )

    t, n = _largest(_ratios(result))
    return (
        f"with {t:,} tokens over {n} CPU devices, attention's gradient and R1 programs hold "
        f"{span(result, 'ring')} one device's temporaries per device on the ring, "
        f"{span(heads_result, 'all-to-all')} with the all-to-all ({heads_result['heads']} heads) "
        f"and {span(result, 'all-gather')} with the gather"
    )


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    base = {(r["tokens"], r["program"]): r["temp"] for r in rows if r["shards"] == 1}
    table = []
    for r in rows:
        if r["shards"] == 1:
            continue
        table.append(
            [
                f"{r['tokens']:,}",
                r["program"],
                r["shards"],
                r["mode"],
                r["scheme"],
                f"{r['temp'] / 2**20:.1f}",
                f"{base[(r['tokens'], r['program'])] / 2**20:.1f}",
                f"{r['of_one']:.3f}",
                f"{r['of_one'] * r['shards']:.2f}",
                ", ".join(f"{k} {v}" for k, v in sorted(r["collectives"].items())),
            ]
        )
    head = [
        "T",
        "program",
        "n",
        "mode",
        "scheme",
        "MiB / device",
        "one device MiB",
        "/ one device",
        "x n",
        "collectives",
    ]
    command = "python -m benchmarks.attention.sequence_memory " + " ".join(result["argv"])
    return records.page(
        "Sequence-parallel attention: compiled temporaries per device (CPU)",
        f"Generated by `{command}`. B = {BATCH}, {result.get('heads', HEADS)} heads of {HEAD_DIM}, "
        "float32, backend "
        "xla, not causal. `/ one device`: the program's temporaries per device over those of one "
        "device holding every token; `x n`: that ratio times n (1.00 is a perfect 1/n).",
        markdown_table(head, table) + _floor_lines(result),
        result,
    )


def _floor_lines(result: dict[str, Any]) -> list[str]:
    """The page's table of the ring's floors (none for records before them)."""
    if not result.get("floors"):
        return []
    head = ["T", "program", "n", "step MiB (one device at T / n)", "state MiB", "floor"]
    cells = [
        [f"{r['tokens']:,}", r["program"], r["shards"], f"{r['step'] / 2**20:.1f}"]
        + [f"{r['state'] / 2**20:.1f}", f"{r['floor']:.3f}"]
        for r in result["floors"]
    ]
    scheduler = result.get("scheduler", "concurrency")
    note = (
        "The ring's floor over one device's temporaries: the step's one-device program plus "
        f"`RING_STATE` arrays the size of a device's q (XLA:CPU's {scheduler} scheduler):"
    )
    return ["", note, "", *markdown_table(head, cells)]


def tpu_compiled(
    topology: str,
    tokens: int,
    n: int,
    scheme: Scheme,
    names: tuple[str, ...],
    token_mesh: tuple[tuple[int, ...], tuple[str, ...]] | None = None,
    heads: int = HEADS_TPU,
) -> dict[str, Any]:
    """{name: the program of :func:`programs` compiled for ``topology``'s chips}: bfloat16,
    ``backend="pallas"``, inside ``shard_map`` over a (data, seq) = (chips / n, n) mesh, one
    sample per data shard, the tokens split over "seq" by ``scheme``; or with ``token_mesh``
    (the shape and names of the token axes, n devices in all) over (data, *names)."""
    import numpy as np
    from jax.sharding import Mesh

    shape, axes = token_mesh or ((n,), ("seq",))
    devices = np.array(cf.tpu_devices(topology))
    mesh = Mesh(devices.reshape((devices.size // n, *shape)), ("data", *axes))
    spec = P("data", axes)
    x = jax.ShapeDtypeStruct(
        (devices.size // n, tokens, heads, HEAD_DIM),
        jnp.bfloat16,
        sharding=NamedSharding(mesh, spec),
    )
    local = lambda q, k, v: fastgp.attention(
        q, k, v, backend="pallas", sample_axis_name=axes, sequence_parallel=scheme
    )
    fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    chosen = programs(lambda q, k, v: fn(q, k, v).astype(jnp.float32))
    return {name: jax.jit(chosen[name]).lower(x, x, x).compile() for name in names}


def tpu_rows(topology: str, tokens: int, shards: list[int]) -> list[dict[str, Any]]:
    """The R1 program per chip of ``topology`` for each n and scheme (see the module)."""
    rows = []
    for n in shards:
        one: list[Scheme] = ["ring"]
        schemes = [s for s in SCHEMES if applies(s, HEADS_TPU, n)] if n > 1 else one
        for scheme in schemes:
            name = "reverse-over-forward"
            compiled = tpu_compiled(topology, tokens, n, scheme, (name,))[name]
            figures = cf.figures(compiled)
            row = {"topology": topology, "tokens": tokens, "shards": n, "scheme": scheme}
            row |= {"peak": figures["peak"], "temp": figures["temp"]}
            row["collectives"] = collective_counts(compiled.as_text() or "")
            print(row, flush=True)
            rows.append(row)
    return rows


def tpu_table(result: dict[str, Any]) -> list[str]:
    """docs/performance.md's table: per T and n, each scheme's peak per chip and per sample."""
    rows = result["rows"]
    by = {(r["tokens"], r["shards"], r["scheme"]): r for r in rows}
    schemes = [s for s in SCHEMES if any(r["scheme"] == s for r in rows)]
    cells = []
    for t, n in sorted({(r["tokens"], r["shards"]) for r in rows}):
        cell = [f"{t:,}", n]
        for scheme in schemes:
            r = by.get((t, n, "ring" if n == 1 else scheme))
            cell += (
                ["", ""]
                if r is None
                else [
                    f"{r['peak'] / 2**30:.3f}",
                    f"{r['peak'] * n / 2**30:.3f}",
                ]
            )
        cells.append(cell)
    head = ["T", "n"] + [f"{s} GiB {per}" for s in schemes for per in ("/ chip", "x n")]
    return markdown_table(head, cells)


def tpu_markdown(result: dict[str, Any]) -> str:
    command = "python -m benchmarks.attention.sequence_memory " + " ".join(result["argv"])
    return records.page(
        f"Sequence-parallel attention's R1 program on {result['topology']} (compile-only)",
        f"Generated by `{command}`. One sample per data shard, {HEADS_TPU} heads of {HEAD_DIM}, "
        "bfloat16, backend pallas; peak memory per chip (n = 1: one chip holds a whole sample; "
        "the gather's row at n = 1 is the same program).",
        tpu_table(result),
        result,
    )


def _schedule(scheduler: str) -> None:
    """XLA:CPU's flags for ``scheduler``, set before JAX's backend starts; ValueError where this
    XLA lacks one."""
    wanted = SCHEDULERS[scheduler]
    missing = [flag for flag in wanted if flag not in xla_flags.known(wanted)]
    if missing:
        raise ValueError(f"this jaxlib's XLA has no {missing}: --scheduler {scheduler} cannot run")
    os.environ["XLA_FLAGS"] = " ".join((os.environ["XLA_FLAGS"], *wanted))


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+")
    parser.add_argument("--shards", type=int, nargs="+")
    parser.add_argument("--topology", help="a TPU slice to compile for, e.g. v5e:4x4")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per CPU program (0: compile only)"
    )
    parser.add_argument("--heads", type=int, default=HEADS, help="heads of the CPU programs")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", type=pathlib.Path, help="the results' path, without suffix")
    parser.add_argument(
        "--scheduler", choices=tuple(SCHEDULERS), default="concurrency", help="XLA:CPU's scheduler"
    )
    args = parser.parse_args(argv)
    _schedule(args.scheduler)
    invocation = sys.argv[1:] if argv is None else list(argv)
    if args.topology:
        tokens, shards = args.tokens or [65536, 262144], args.shards or [1, 4, 8, 16]
        rows = [r for t in tokens for r in tpu_rows(args.topology, t, shards)]
        result = {"argv": invocation, "topology": args.topology, **records.provenance()}
        records.write(OUT_TPU, {**result, "rows": rows}, tpu_markdown)
        return 0
    tokens, shards = args.tokens or [4096, 16384], args.shards or [2, 4, 8]
    modes = tuple(args.modes)
    rows = [row for t in tokens for row in run(t, shards, args.repeats, args.heads, modes)]
    result = {"argv": invocation, "heads": args.heads, "scheduler": args.scheduler}
    result |= {**records.provenance(), "rows": rows}
    one = {(r["tokens"], r["program"]): r["temp"] for r in rows if r["shards"] == 1}
    result["floors"] = [row for t in tokens for row in floors(t, shards, one, args.heads)]
    out = OUT if args.heads == HEADS else OUT.with_name(f"{OUT.name}_h{args.heads}")
    if args.scheduler != "concurrency":
        out = out.with_name(f"{out.name}_{args.scheduler}_scheduler")
    out = args.out or out
    records.write(out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
