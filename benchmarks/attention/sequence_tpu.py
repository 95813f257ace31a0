"""A long-sequence ViT critic with its tokens split over chips: penalty steps compiled for v5e:4x4.

    python -m benchmarks.attention.sequence_tpu [--tokens 16384,65536] [--shards 1,4,8,16]
                                                [--kinds r1,wgan-gp] [--capacity 65536:16]
                                                [--max-compiles 6] [--budget-s 2400]
                                                [--scheme all-gather|ring|all-to-all]

The zoo's long ViT critic (``zoo.critics.vit_long``: 4x4 patches, dim 256, 4 heads of 64, 2 pre-LN
blocks; parameters float32, cast to bfloat16 with the input, as ``benchmarks.attention.tpu``
does), rewritten here for sequence parallelism (:func:`vit_seq`): each chip holds a band of every
image's rows, i.e. a contiguous slice of its tokens; the attention is ``fastgp.attention(...,
backend="pallas", sample_axis_name="seq", sequence_parallel=scheme)`` (``--scheme``: each chip
keeps its queries and gathers the keys and values, "all-gather", passes them around the ring,
"ring", or trades the token split for a head split, "all-to-all", at n = 4, the heads' count;
records of every scheme share one file, those without a scheme are the gather's), the
position embedding is this shard's slice (``lax.axis_index("seq") * T_local``) and the token mean
is a ``psum`` over "seq", so every slice returns the whole sample's score.

The step: ``value_and_grad`` over the critic's parameters of ``fastgp.gradient_penalty`` (R1 at
the reals; WGAN-GP at ``fastgp.interpolate`` of real and fake), penalty backend "auto", inside
``jax.shard_map`` over a ``(data, seq)`` mesh of the 16 chips of a v5e:4x4 slice (``seq`` = n
chips per sample, ``data`` = 16 / n), ``axis_name="data"``, ``sample_axis_name="seq"``, as
docs/recipes.md's "Samples that span devices" does. Compiled ahead of time from this host with
libtpu's compile-only client: per chip peak memory and temporaries (the memory analysis), flops
and bytes (cost analysis; the Mosaic calls count their ``pl.CostEstimate``), and the collectives
of the program, with the shapes of every all-gather. With ``--capacity T:n``, a doubling search
on the global batch at T tokens over n sequence shards (from the power of two that the batch-1
peak suggests, to the first RESOURCE_EXHAUSTED), then a bisection between the two in multiples
of the data axis (at most ``--max-compiles`` compiles per kind).

Results go to ``results/attention/sequence_tpu.{json,md}``; compiled records are reused (delete
to redo). ``--budget-s`` stops starting compiles after that many seconds; what is left is
reported as not measured.
"""

import collections
import itertools
import json
import math
import os
import re
import time
from typing import cast

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import benchmarks
import fastgp
from benchmarks import capacity, harness
from benchmarks.tables import markdown_table
from benchmarks.zoo import critics as zoo
from fastgp import measure as cf
from fastgp.options import SEQUENCE_SCHEMES as SCHEMES
from fastgp.options import Kind, Scheme
from fastgp.train.models.networks import Model

RESULTS = benchmarks.RESULTS / "attention"
RECORDS = RESULTS / "sequence_tpu.json"
TOPOLOGY = "v5e:4x4"
GENERATION = "v5e"
TOKENS = (16384, 65536)
SHARDS = (1, 4, 8, 16)
KINDS = ("r1", "wgan-gp")
DIM, DEPTH, HEADS, PATCH = 256, 2, 4, 4  # zoo.critics.vit_long's
WEIGHT = 10.0
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")


def vit_seq(
    tokens: int,
    seq: str = "seq",
    backend: str = "pallas",
    dtype=jnp.bfloat16,
    scheme: Scheme = "all-gather",
) -> Model:
    """``zoo.critics.vit_long(tokens)`` for a slice of each image's rows inside ``shard_map``:
    the same parameters (its ``init``); ``apply(params, x)`` takes (B, S / n, S, 3), this chip's
    band of rows (a contiguous slice of the row-major tokens), and returns the (B,) float32
    whole-sample scores on every chip of the sample."""
    head_dim = DIM // HEADS

    def attention(y, blk):
        b, n, _ = y.shape
        qkv = (y @ blk["qkv"]["w"] + blk["qkv"]["b"]).reshape(b, n, 3, HEADS, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        out = fastgp.attention(
            q, k, v, backend=backend, sample_axis_name=seq, sequence_parallel=scheme
        )
        return out.reshape(b, n, DIM) @ blk["proj"]["w"] + blk["proj"]["b"]

    def apply(params, x):
        p = zoo._cast(params, dtype)
        h = zoo._conv(x.astype(dtype), p["embed"], stride=PATCH, padding="VALID")
        b, rows, cols, _ = h.shape
        t_local = rows * cols
        h = h.reshape(b, t_local, DIM)
        h = h + lax.dynamic_slice_in_dim(p["pos"], lax.axis_index(seq) * t_local, t_local)
        for blk in p["blocks"]:
            h = h + attention(zoo._layer_norm(h, blk["ln1"]), blk)
            y = zoo._layer_norm(h, blk["ln2"])
            h = h + jax.nn.gelu(y @ blk["fc1"]["w"] + blk["fc1"]["b"]) @ blk["fc2"]["w"]
            h = h + blk["fc2"]["b"]
        pooled = zoo._layer_norm(h, p["ln"]).astype(jnp.float32).sum(axis=1)
        pooled = (lax.psum(pooled, seq) / tokens).astype(dtype)  # the whole sample's mean
        return (pooled @ p["out"]["w"] + p["out"]["b"])[:, 0].astype(jnp.float32)

    return Model(zoo.vit_long(tokens).init, apply)


def penalty_step(model: Model, kind: str):
    """(params, real[, fake, key]) -> (penalty, parameter gradients), for inside shard_map."""

    def step(params, real, *rest):
        def loss(p):
            critic = lambda y: model.apply(p, y)
            if kind == "r1":
                x = real
            else:
                fake, key = rest
                x = fastgp.interpolate(key, real, fake, axis_name="data", sample_axis_name="seq")
            return fastgp.gradient_penalty(
                critic,
                x,
                kind=cast(Kind, kind),
                weight=WEIGHT,
                axis_name="data",
                sample_axis_name="seq",
            )

        return jax.value_and_grad(loss)(params)

    return step


def mesh_of(shards: int, topology: str = TOPOLOGY) -> Mesh:
    devices = np.array(cf.tpu_devices(topology))
    return Mesh(devices.reshape(devices.size // shards, shards), ("data", "seq"))


def lower(
    tokens: int,
    shards: int,
    batch: int,
    kind: str,
    backend: str = "pallas",
    topology: str = TOPOLOGY,
    scheme: Scheme = "all-gather",
):
    """The lowered shard_mapped step on the (data, seq) mesh, ``batch`` global samples."""
    mesh = mesh_of(shards, topology)
    model = vit_seq(tokens, backend=backend, scheme=scheme)
    side = PATCH * math.isqrt(tokens)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    params = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, P())),
        params,
    )
    image = jax.ShapeDtypeStruct(
        (batch, side, side, 3), jnp.bfloat16, sharding=NamedSharding(mesh, P("data", "seq"))
    )
    args, specs = [params, image], [P(), P("data", "seq")]
    if kind != "r1":
        key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P()))
        args += [image, key]
        specs += [P("data", "seq"), P()]
    run = jax.shard_map(penalty_step(model, kind), mesh=mesh, in_specs=tuple(specs), out_specs=P())
    return jax.jit(run).lower(*args)


# --- the collectives of the compiled program ------------------------------------------------------

_OP = re.compile(
    r"=\s*(?P<result>\(.*?\)|\S+)\s+(?P<kind>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"[a-z]+\d*\[[\d,]*\]")
_DIMS = re.compile(r"dimensions=\{([\d,]*)\}")
_GROUP = re.compile(r"replica_groups=\{\{([\d,]*)\}")
_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[[\d,]+\](T\([\d,]+\))?")
_CHAIN = re.compile(r'(?:chain_id|async_collective_name)="[^"]*"')
_SOURCE = re.compile(r'op_name="(?:jit\(\w+\)/)?(?:shard_map/)?([^"]*)"')


def _dims(array):
    return [int(d) for d in array.split("[")[1].rstrip("]").split(",") if d]


def _axis(line, shards):
    """The mesh axis a collective runs over, from its first replica group: "seq" (n consecutive
    chips; all 16 when n = 16), "data" (16 / n chips n apart; all 16 when n = 1), "all" (both
    axes) or the group as written."""
    group = _GROUP.search(line)
    if group:
        ids = [int(i) for i in group[1].split(",") if i]
    else:
        iota = _IOTA.search(line)
        if not iota:
            return "?"
        size = int(iota[2])
        ids = list(range(size)) if not iota[3] else list(range(0, 16, 16 // size))[:size]
    steps = {b - a for a, b in itertools.pairwise(ids)}
    if len(ids) == shards and steps <= {1}:
        return "seq"
    if len(ids) == 16 // shards and steps <= {shards}:
        return "data"
    if len(ids) == 16:
        return "all"
    return "{" + ",".join(map(str, ids)) + "}"


def collectives(hlo_text: str, shards: int) -> dict:
    """The collective instructions of a compiled program (every ``kind(`` or ``kind-start(``,
    also those inside the fusions that TPU's asynchronous collectives call):
    ``counts`` {kind: {"ops": instructions, "arrays": arrays moved, "collectives": distinct
    collectives}} and ``shapes``, each distinct (kind, result array, dimensions, mesh axis, the
    JAX op it comes from) with its instructions ("count") and collectives. XLA:TPU splits one
    asynchronous collective over several continuation fusions, each holding a copy of the
    instruction with the same ``chain_id``: a collective is a chain, an async start, or else one
    instruction."""
    counts: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"ops": 0, "arrays": 0})
    logical: dict[str, set[str]] = collections.defaultdict(set)
    shapes: collections.Counter[tuple[str, ...]] = collections.Counter()
    shape_logical: dict[tuple[str, ...], set[str]] = collections.defaultdict(set)
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if not m:
            continue
        chain = _CHAIN.search(line)
        name = chain[0] if chain else line.split("=")[0].strip()
        logical[m["kind"]].add(name)
        arrays = _ARRAY.findall(m["result"])
        if m["start"] and len(arrays) > 1:  # (operands, results[, context]) of a start
            arrays = arrays[len(arrays) // 2 :]
        counts[m["kind"]]["ops"] += 1
        counts[m["kind"]]["arrays"] += max(len(arrays), 1)
        dims = _DIMS.search(line)
        source = _SOURCE.search(line)
        for array in arrays:
            key = (
                m["kind"],
                array,
                dims[1] if dims else "",
                _axis(line, shards),
                source[1] if source else "",
            )
            shapes[key] += 1
            shape_logical[key].add(name)
    for kind, names in logical.items():
        counts[kind]["collectives"] = len(names)
    return {
        "counts": {k: dict(v) for k, v in sorted(counts.items())},
        "shapes": [
            dict(
                kind=k,
                result=r,
                dimensions=d,
                axis=a,
                source=s,
                count=n,
                collectives=len(shape_logical[(k, r, d, a, s)]),
            )
            for (k, r, d, a, s), n in sorted(shapes.items())
        ],
    }


def _kv_shaped(result, record):
    """(B, T or T / n, [1,] 4, 64): a key or value (or its tangent or cotangent)."""
    tokens = (record["tokens"], record["tokens"] // record["shards"])
    return len(result) >= 4 and result[1] in tokens and result[-2:] == [HEADS, DIM // HEADS]


_MLP_SHAPES = ([DIM, 4 * DIM], [4 * DIM, DIM], [4 * DIM])  # fc1, fc2: no token axis


def token_collectives(record: dict) -> list[str]:
    """Every collective of a record whose arrays have a token axis (T or T / n long), as
    "m (k instructions) x kind what: operand -> result over axis (the JAX op)". An all-gather is
    "k/v token axis" when it grows axis 1 of a k/v-shaped array from T / n to T over "seq", else
    "OTHER"; the others are "k/v-shaped" or "(T, dim): the position embedding's gradient"."""
    said = []
    t, n = record["tokens"], record["shards"]
    for g in record.get("shapes", []):
        result = _dims(g["result"])
        if n == 1 or not {t, t // n} & set(result) or result in _MLP_SHAPES:
            continue
        operand = list(result)
        if g["kind"] == "all-gather":
            axis = int(g["dimensions"]) if g["dimensions"].isdigit() else -1
            ok = g["axis"] == "seq" and axis == 1 and result[1] == t and _kv_shaped(result, record)
            operand[axis] //= n if g["axis"] == "seq" else 1
            what = "k/v token axis" if ok else "OTHER"
        elif _kv_shaped(result, record):
            what = "k/v-shaped"
        elif result == [t, DIM] or result == [t // n, DIM]:
            what = "(T, dim): the position embedding's gradient"
        else:
            what = "OTHER"
        shapes = f"{tuple(operand)} -> {g['result']}" if g["kind"] == "all-gather" else g["result"]
        said.append(
            f"{g['collectives']} ({g['count']} instructions) x {g['kind']} {what}: {shapes} "
            f"over {g['axis']} ({g['source'] or 'no JAX op: made by XLA'})"
        )
    return said


def only_kv_gathered(record: dict) -> bool:
    """Whether every all-gather of the program grows the token axis of a k/v-shaped array."""
    gathered = [s for s in token_collectives(record) if " x all-gather " in s]
    total = record["counts"].get("all-gather", {}).get("collectives", 0)
    named = sum(int(s.split(" ")[0]) for s in gathered)
    return named == total and all("OTHER" not in s for s in gathered)


# --- compiles, cached -------------------------------------------------------------------------


def _records():
    return json.loads(RECORDS.read_text()) if RECORDS.exists() else []


def _save(records):
    RESULTS.mkdir(parents=True, exist_ok=True)
    RECORDS.write_text(json.dumps(records, indent=1) + "\n")


def find(records, tokens, shards, batch, kind, scheme="all-gather"):
    key = dict(topology=TOPOLOGY, tokens=tokens, shards=shards, batch=batch, kind=kind)
    return next(
        (r for r in records if all(r.get(k) == v for k, v in key.items()) and _scheme(r) == scheme),
        None,
    )


def _scheme(record):
    """A record's sequence_parallel scheme (the records from before the ring have none)."""
    return record.get("scheme", "all-gather")


class Budget:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return self.end - time.monotonic()


def compile_record(records, tokens, shards, batch, kind, budget, scheme="all-gather"):
    """The record of one compiled step (reused when on file), or None when the budget is spent."""
    found = find(records, tokens, shards, batch, kind, scheme)
    if found is not None:
        return found
    if budget.left() <= 0:
        print(f"T={tokens} n={shards} B={batch} {kind}: not measured (budget spent)", flush=True)
        return None
    record = dict(
        topology=TOPOLOGY,
        tokens=tokens,
        shards=shards,
        data=16 // shards,
        batch=batch,
        kind=kind,
        t_local=tokens // shards,
        scheme=scheme,
    )
    start = time.perf_counter()
    try:
        program = lower(tokens, shards, batch, kind, scheme=scheme).compile()
    except Exception as err:  # an out-of-memory compile is a measurement here
        lines = str(err).strip().splitlines() or [type(err).__name__]
        record.update(fits=False, error=f"{type(err).__name__}: {lines[0][:300]}")
        if cf.is_out_of_memory(err):
            record["error"] = lines[0][:300]
    else:
        text = program.as_text() or ""
        record.update(fits=True, **cf.figures(program), **collectives(text, shards))
    record["compile_s"] = round(time.perf_counter() - start, 1)
    records.append(record)
    _save(records)
    state = "fits" if record["fits"] else record["error"][:100]
    peak = f", peak {record['peak'] / 2**30:.2f} GiB" if record["fits"] else ""
    print(
        f"T={tokens} n={shards} B={batch} {kind} {scheme}: {state}{peak} ({record['compile_s']} s)",
        flush=True,
    )
    return record


def _oom(record):
    return record is not None and not record["fits"] and "RESOURCE_EXHAUSTED" in record["error"]


def _answer(record):
    """A probe's answer to the capacity search: fits, out of HBM, or None (no budget left, or
    another compile error)."""
    if record is None or not (record["fits"] or _oom(record)):
        return None
    return record["fits"]


def largest_batch(records, tokens, shards, kind, max_compiles, budget, scheme="all-gather"):
    """The global batch ``benchmarks.capacity.search`` finds to a multiple of the data axis, from
    the power of two that the batch-of-one-per-row peak suggests (else from the data axis), with
    at most ``max_compiles`` new compiles. Returns (the largest batch that fits, 0 if not one
    sample per data shard does; the first out of HBM), either None when not decided."""
    data = 16 // shards
    base = find(records, tokens, shards, data, kind, scheme)
    hbm = cf.CHIPS[GENERATION].hbm_bytes
    start = data
    if base is not None and base["fits"]:
        start = data * 2 ** max(0, int(math.log2(hbm / base["peak"])) - 1)
    made = 0

    def fits(batch):
        nonlocal made
        new = find(records, tokens, shards, batch, kind, scheme) is None
        if new and made >= max_compiles:
            return None
        record = compile_record(records, tokens, shards, batch, kind, budget, scheme)
        made += new and record is not None
        return _answer(record)

    found = capacity.search(fits, start, multiple=data)
    return found.fit, found.over


# --- the report -------------------------------------------------------------------------------


def _gib(n):
    return f"{n / 2**30:.2f}"


def _collective_cell(record):
    kinds = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")
    return " / ".join(str(record["counts"].get(k, {}).get("collectives", 0)) for k in kinds)


def table(records, tokens=TOKENS, shards=SHARDS, kinds=KINDS, scheme="all-gather"):
    """The published table of ``scheme``'s records: per penalty, T and n (one sample per data
    shard), the per-chip peak, peak x n (constant if the peak falls as 1/n), the collectives, and
    the largest global batch where it was searched; "out of HBM" / "not measured" where it did
    not fit / was not compiled."""
    records = [r for r in records if _scheme(r) == scheme]
    capacity = capacity_from_records(records)
    rows = []
    for kind in kinds:
        for t in tokens:
            for n in shards:
                r = find(records, t, n, 16 // n, kind, scheme)
                cells = [kind, f"{t:,}", str(n), f"{t // n:,}", str(16 // n)]
                if r is None:
                    cells += ["not measured", "", "", ""]
                elif not r["fits"]:
                    cells += ["out of HBM" if _oom(r) else "does not compile", "", "", ""]
                else:
                    cells += [_gib(r["peak"]), _gib(r["peak"] * n), _collective_cell(r), ""]
                fit, over = capacity.get((t, n, kind), (None, None))
                if fit is not None or over is not None:
                    cells[-1] = f"{fit or 'none'}" + (f" ({over}: out of HBM)" if over else "")
                rows.append(cells)
    return markdown_table(
        [
            "penalty",
            "tokens T",
            "seq shards n",
            "tokens per chip",
            "global batch",
            "peak GiB per chip",
            "peak x n GiB",
            "all-gather / reduce-scatter / all-reduce / collective-permute / all-to-all",
            "largest global batch",
        ],
        rows,
    )


def capacity_from_records(records):
    """{(T, n, kind): (largest fitting batch, smallest out-of-memory batch above it)} of every
    (T, n, kind) compiled at more than one batch."""
    found: dict[tuple[int, int, str], dict[int, dict]] = collections.defaultdict(dict)
    for r in records:
        found[(r["tokens"], r["shards"], r["kind"])][r["batch"]] = r
    searched = {}
    for key, by_batch in sorted(found.items()):
        if len(by_batch) < 2:
            continue
        fits = [b for b, r in by_batch.items() if r["fits"]]
        fit = max(fits) if fits else None
        over = [b for b, r in by_batch.items() if _oom(r) and (fit is None or b > fit)]
        searched[key] = (fit, min(over) if over else None)
    return searched


def render(records):
    lines = [
        "# A sequence-parallel long ViT critic on 16 v5e chips (compiled from a CPU host)",
        "",
        (
            "Written by `python -m benchmarks.attention.sequence_tpu`. The zoo's long ViT critic "
            "(4x4 patches, dim 256, 4 heads of 64, 2 pre-LN blocks, bfloat16) with each image's "
            'rows split over n chips (`fastgp.attention(backend="pallas", '
            'sample_axis_name="seq")`, position slice, psum pooling); value_and_grad over the '
            "parameters of `fastgp.gradient_penalty` (backend auto) in `shard_map` over a "
            f"(data, seq) = (16 / n, n) mesh of {TOPOLOGY}. One sample per data shard."
        ),
        "",
    ]
    for scheme in SCHEMES:
        if any(_scheme(r) == scheme for r in records):
            lines += [f"## Peak memory per chip against the sequence shards: {scheme}", ""]
            lines += [*table(records, scheme=scheme), ""]
    lines += ["## Collectives per program (collectives; HLO instructions; arrays moved)", ""]
    order = lambda r: (_scheme(r), r["kind"], r["tokens"], r["shards"], r["batch"])
    for r in sorted(records, key=order):
        if not r["fits"]:
            continue
        counts = (
            ", ".join(
                f"{k} {v['collectives']} ({v['ops']} instructions, {v['arrays']} arrays)"
                for k, v in r["counts"].items()
            )
            or "none"
        )
        lines.append(
            f"- {_scheme(r)}, {r['kind']} T={r['tokens']:,} n={r['shards']} batch {r['batch']}: "
            f"{counts}"
        )
        lines += [f"  - {g}" for g in token_collectives(r)]
    lines.append("")
    errors = sorted({r["error"][:120] for r in records if not r["fits"] and not _oom(r)})
    if errors:
        lines += ["Programs that did not compile for another reason than memory:", ""]
        lines += [f"- {e}" for e in errors] + [""]
    (RESULTS / "sequence_tpu.md").write_text("\n".join(lines))


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--shards", default=",".join(map(str, SHARDS)))
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--capacity", default="65536:16", help="T:n to search the batch at")
    parser.add_argument("--max-compiles", type=int, default=6)
    parser.add_argument("--budget-s", type=float, default=2400)
    parser.add_argument("--scheme", choices=SCHEMES, default="all-gather")
    args = parser.parse_args(argv)
    budget = Budget(args.budget_s)
    records = _records()
    kinds = args.kinds.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    shards = [int(n) for n in args.shards.split(",")]
    search = tuple(int(v) for v in args.capacity.split(":")) if args.capacity else None
    # the longest sequence first, the most shards first, and its batch search before the
    # shorter sequence: the headline figures first when the budget runs out
    for t in sorted(tokens, reverse=True):
        for kind in kinds:
            for n in sorted(shards, reverse=True):
                compile_record(records, t, n, 16 // n, kind, budget, args.scheme)
        if search and search[0] == t:
            for kind in kinds:
                fit, over = largest_batch(
                    records, search[0], search[1], kind, args.max_compiles, budget, args.scheme
                )
                print(f"capacity T={t} n={search[1]} {kind}: fits {fit}, out of HBM at {over}")
    render(records)


if __name__ == "__main__":
    main()
