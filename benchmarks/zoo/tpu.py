"""The critic zoo's whole critic steps compiled for TPU chips, and the largest batch that fits.

    python -m benchmarks.zoo.tpu programs [--generations v5e,v6e] [--critics ...] [--variants ...]
    python -m benchmarks.zoo.tpu capacity [--generation v5e] [--critics ...] [--variants ...]
                                          [--cached]

``programs``: for each generation and ``critics.ZOO_TPU`` critic (bfloat16, per-chip batch), one
critic step (critic loss + penalty, value_and_grad wrt params, Adam) per variant of ``workloads``,
compiled for one chip from this host (``fastgp.measure``); flops, bytes, copies, temp and peak
memory and the roofline bound go to ``results/zoo/zoo_tpu.{json,md}``.

``capacity``: the largest per-chip batch whose critic step compiles within the chip's HBM, per
critic and variant. The compiler is the judge: a batch fits when its step compiles and does not
when compiling fails with RESOURCE_EXHAUSTED. Two compiles (the zoo batch and twice it) fit peak
memory as a + b * batch to predict the limit; probes around the prediction, widening until one
fits and one does not, then bisection, pin it to within ``--resolution`` (5 % by default). A batch
that fits takes minutes to compile and one that does not fails in seconds, so the bisection
probes above the middle.
Results go to ``results/zoo/zoo_capacity.{json,md}``.

Both keep every compiled figure in their JSON as they go and reuse each other's on the next run
(delete the files to measure again): compiles take a minute or more each on a 2-core host.
"""

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax

import benchmarks
from benchmarks import workloads as W
from benchmarks.tables import markdown_table
from benchmarks.zoo import critics as zoo
from fastgp import measure as cf

RESULTS = benchmarks.RESULTS / "zoo"
PROGRAMS = RESULTS / "zoo_tpu.json"  # the compiles of ``programs``
SEARCHES = RESULTS / "zoo_capacity_compiles.json"  # those of ``capacity``
PROGRAM_VARIANTS = (
    "plain",
    "naive",
    "fastgp",
    "fastgp-reverse",
    "fastgp-remat",
    "fastgp-dots",
    "fastgp-pallas",
)
CAPACITY_VARIANTS = ("plain", "naive", "fastgp", "fastgp-remat", "fastgp-dots")
MULTIPLE = 8  # batches probed are multiples of this
FLAT = 1.1  # a peak below FLAT x the zoo batch's has not grown enough to predict from


class Cache:
    """Compiled figures keyed by (generation, critic, variant, batch): read from ``paths``, each
    new one appended to the first (``programs`` and ``capacity`` each write their own file and
    read both, so that they can run side by side)."""

    def __init__(self, *paths):
        self.path = paths[0]
        unique = dict.fromkeys(pathlib.Path(p).resolve() for p in paths)
        self.records = [r for p in unique if p.exists() for r in json.loads(p.read_text())]
        self.own = json.loads(self.path.read_text()) if self.path.exists() else []

    def get(self, generation, critic, variant, batch):
        key = (generation, critic, variant, batch)
        for r in self.records:
            if (r["generation"], r["critic"], r["variant"], r["batch"]) == key:
                return r
        return None

    def fitting_batches(self, generation, critic, variant, fits=True):
        """The batches of this critic step that compiled within HBM (with ``fits=False``, those
        that did not)."""
        key = (generation, critic, variant)
        return [
            r["batch"]
            for r in self.records
            if (r["generation"], r["critic"], r["variant"]) == key and r["fits"] == fits
        ]

    def add(self, record):
        self.records.append(record)
        self.own.append(record)
        self.path.write_text(json.dumps(self.own, indent=1) + "\n")


def compile_step(cache, generation, spec, variant, batch):
    """The record of ``spec``'s critic step at ``batch`` on one chip: figures or fits=False."""
    found = cache.get(generation, spec.name, variant, batch)
    if found is not None:
        return found
    spec = spec._replace(batch=batch)
    structs = jax.eval_shape(lambda: W.inputs(spec))
    start = time.perf_counter()
    record = dict(generation=generation, critic=spec.name, variant=variant, batch=batch)
    try:
        program = cf.compile_for(cf.tpu_device(generation), W.critic_step(spec, variant), *structs)
    except Exception as err:  # an out-of-memory compile is a measurement here
        if not cf.is_out_of_memory(err):
            raise
        record.update(fits=False, error=str(err).strip().splitlines()[0][:300])
    else:
        figures = cf.figures(program)
        record.update(fits=True, roofline_s=cf.roofline_s(figures, generation), **figures)
    record["compile_s"] = time.perf_counter() - start
    cache.add(record)
    print(
        f"{generation} {spec.name} {variant} batch {batch}: "
        f"{'fits' if record['fits'] else 'out of memory'} ({record['compile_s']:.0f} s)",
        flush=True,
    )
    return record


# --- programs -------------------------------------------------------------------------------------


def render_programs(records):
    lines = [
        "# The critic zoo compiled for TPU (AOT from a CPU host via libtpu)",
        "",
        "One whole critic step per critic and variant (critic loss + penalty, value_and_grad",
        "wrt params, Adam) at the zoo's per-chip batch in bfloat16 (`benchmarks/zoo/critics.py`),",
        "compiled for one chip. `flops`, `bytes`: XLA's cost analysis; `copy`: copy ops outside",
        "fusions; `temp`, `peak`: the memory analysis (temporaries; the most HBM live at once).",
        "`roofline`: max(flops / bf16 peak, bytes / HBM bandwidth) from the chip's published",
        "figures, a lower bound, not a time. Ratios are to the naive step of the same generation",
        "and critic. Regenerate with `make tpu-compile` (`python -m benchmarks.zoo.tpu programs`).",
        "",
    ]
    rows = []
    for r in records:
        base = next(
            b
            for b in records
            if (b["generation"], b["critic"], b["variant"])
            == (r["generation"], r["critic"], "naive")
        )
        rows.append(
            [
                r["generation"],
                f"{r['critic']} ({r['batch']})",
                r["variant"],
                f"{r['flops'] / 1e9:.3f}",
                f"{r['flops'] / base['flops']:.4f}x",
                f"{r['bytes'] / 1e6:.2f}",
                f"{r['bytes'] / base['bytes']:.4f}x",
                r["copies"],
                f"{r['temp'] / 2**20:.1f}",
                f"{r['peak'] / 2**20:.1f}",
                f"{r['roofline_s'] * 1e6:.1f}",
                f"{r['roofline_s'] / base['roofline_s']:.4f}x",
                f"{r['compile_s']:.0f}",
            ]
        )
    head = [
        "generation",
        "critic (batch)",
        "variant",
        "GFLOP",
        "flops / naive",
        "MB accessed",
        "bytes / naive",
        "copy",
        "temp MiB",
        "peak MiB",
        "roofline us",
        "/ naive",
        "compile s",
    ]
    return "\n".join([*lines, *markdown_table(head, rows)]) + "\n"


def at_zoo_batch(records):
    """The records of the zoo's own batches, in generation, critic and variant order."""
    order = {name: i for i, name in enumerate((*cf.TOPOLOGIES, *zoo.ZOO_TPU, *PROGRAM_VARIANTS))}
    keyed: dict[tuple, dict] = {}
    for r in records:
        key = (r["generation"], r["critic"], r["variant"])
        if r["fits"] and r["batch"] == zoo.ZOO_TPU[r["critic"]].batch:
            keyed.setdefault(key, r)
    chosen = list(keyed.values())
    return sorted(
        chosen, key=lambda r: (order[r["generation"]], order[r["critic"]], order[r["variant"]])
    )


def programs(args):
    cache = Cache(args.cache, PROGRAMS, SEARCHES)
    for generation in args.generations:
        for name in args.critics:
            spec = zoo.ZOO_TPU[name]
            for variant in args.variants:
                compile_step(cache, generation, spec, variant, spec.batch)
    (RESULTS / "zoo_tpu.md").write_text(render_programs(at_zoo_batch(cache.records)))


# --- capacity -------------------------------------------------------------------------------------


def _down(batch):
    return max(MULTIPLE, batch // MULTIPLE * MULTIPLE)


def _affine_guess(cache, generation, spec, variant):
    """(the largest batch known to fit, the batch at which its peak memory would fill the chip's
    HBM): the steeper slope to the largest fit, from the zoo batch or the one below."""
    fitting = sorted(cache.fitting_batches(generation, spec.name, variant))
    below, top = fitting[-2:]
    peak = {b: cache.get(generation, spec.name, variant, b)["peak"] for b in fitting}
    per_sample = max(
        1.0,
        (peak[top] - peak[spec.batch]) / (top - spec.batch),
        (peak[top] - peak[below]) / (top - below),
    )
    return top, _down(int(top + (cf.CHIPS[generation].hbm_bytes - peak[top]) / per_sample))


def largest_batch(cache, generation, spec, variant, resolution):
    """(largest batch that fits, smallest that does not, the batches compiled)."""
    probes = []

    def fits(batch):
        probes.append(batch)
        return compile_step(cache, generation, spec, variant, batch)["fits"]

    def tolerance(batch):
        return max(MULTIPLE, _down(int(batch * resolution)))

    lo, hi = 0, None  # lo fits (0: none known yet), hi does not (None: none known yet)
    for batch in (spec.batch, 2 * spec.batch):
        if fits(batch):
            lo = batch
        else:
            hi = batch
            break
    if hi is None:  # predict from peak memory, affine in the batch
        first = cache.get(generation, spec.name, variant, spec.batch)
        top = max(cache.fitting_batches(generation, spec.name, variant))
        # At small batches the peak can be all fixed buffers; double until it grows.
        while cache.get(generation, spec.name, variant, top)["peak"] < FLAT * first["peak"]:
            if not fits(2 * top):
                hi = 2 * top
                break
            lo = top = 2 * top
    if hi is None:
        top, guess = _affine_guess(cache, generation, spec, variant)
        lo = max(lo, top)
        if guess > lo:
            if fits(guess):
                lo = guess
            else:
                hi = guess
    step = tolerance(lo)
    while hi is None:  # widen upwards until a batch does not fit
        batch = _down(lo + step)
        if fits(batch):
            lo, step = batch, 2 * step
        else:
            hi = batch
    step = tolerance(hi)
    while hi - lo > step:  # widen downwards from a prediction that did not fit
        batch = _down(hi - step)
        if batch <= lo:
            break
        if fits(batch):
            lo = batch
            break
        hi, step = batch, 2 * step
    while hi - lo > tolerance(lo):  # bisect, above the middle: a batch that fits compiles in
        mid = _down(lo + 2 * (hi - lo) // 3)  # minutes, one that does not fails in seconds
        if mid <= lo:
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi, probes


def _relative(row, rows, variant):
    """``row``'s fitting batch over ``variant``'s for the same critic ("-" if not measured)."""
    base = [b for b in rows if b["critic"] == row["critic"] and b["variant"] == variant]
    return f"{row['fits'] / base[0]['fits']:.2f}x" if base and base[0]["fits"] else "-"


def render_capacity(rows, generation, resolution):
    hbm = cf.CHIPS[generation].hbm_bytes / 2**30
    lines = [
        f"# The largest per-chip batch whose critic step fits a {generation} chip ({hbm:.0f} GiB)",
        "",
        "A batch fits when its whole critic step (bfloat16, `benchmarks/zoo/critics.py`) compiles",
        "for one chip; it does not when the compiler fails with RESOURCE_EXHAUSTED. `fits` is the",
        "largest batch that compiled, `fails` the smallest that did not (the search stops within",
        f"{resolution:.0%}). `/ naive`: the fitting batch relative to the naive penalty's. `peak`:",
        "at the zoo batch, the memory analysis' most HBM live at once. `smaller that failed`:",
        "batches below `fits` that did not compile (whether a batch fits is not monotonic in",
        "the batch: the compiler's layouts and rematerialisation change with it). `compiles`:",
        "the batches the search compiled (with `--cached`, every one on record for the step,",
        "earlier searches' included). `make tpu-capacity`.",
        "",
    ]
    cells = [
        [
            f"{row['critic']} ({row['zoo_batch']})",
            row["variant"],
            row["fits"],
            row["fails"],
            _relative(row, rows, "naive"),
            _relative(row, rows, "plain"),
            f"{row['peak_mib']:.0f}",
            ", ".join(map(str, row.get("failed_below", []))) or "-",
            row["compiles"],
        ]
        for row in rows
    ]
    head = [
        "critic",
        "variant",
        "fits",
        "fails",
        "/ naive",
        "/ plain",
        "peak MiB (zoo batch)",
        "smaller that failed",
        "compiles",
    ]
    return "\n".join([*lines, *markdown_table(head, cells)]) + "\n"


def bracket_from_cache(cache, generation, spec, variant):
    """(largest batch that fitted, smallest above it that did not, the batches compiled) from
    the compiles on record, compiling nothing; None if this step was never compiled."""
    fitting = cache.fitting_batches(generation, spec.name, variant)
    failing = cache.fitting_batches(generation, spec.name, variant, fits=False)
    if not fitting:
        return None
    lo = max(fitting)
    return lo, min((b for b in failing if b > lo), default=None), fitting + failing


def capacity(args):
    cache = Cache(SEARCHES, PROGRAMS)
    rows = []
    for name in args.critics:
        spec = zoo.ZOO_TPU[name]
        for variant in args.variants:
            if args.cached:
                found = bracket_from_cache(cache, args.generation, spec, variant)
                if found is None or found[1] is None:
                    continue  # not searched, or no batch found that does not fit
                lo, hi, probes = found
            else:
                lo, hi, probes = largest_batch(
                    cache, args.generation, spec, variant, args.resolution
                )
            zoo_record = cache.get(args.generation, name, variant, spec.batch)
            rows.append(
                dict(
                    critic=name,
                    variant=variant,
                    zoo_batch=spec.batch,
                    fits=lo,
                    fails=hi,
                    compiles=len(probes),
                    failed_below=sorted(
                        b
                        for b in cache.fitting_batches(args.generation, name, variant, fits=False)
                        if b < lo
                    ),
                    peak_mib=zoo_record.get("peak", 0) / 2**20 if zoo_record["fits"] else 0,
                )
            )
            print(f"{name} {variant}: fits {lo}, fails {hi} ({len(probes)} compiles)", flush=True)
            (RESULTS / "zoo_capacity.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = render_capacity(rows, args.generation, args.resolution)
    (RESULTS / "zoo_capacity.md").write_text(table)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    listed = lambda text: [item for item in text.split(",") if item]
    p = sub.add_parser("programs")
    p.add_argument("--generations", type=listed, default=["v5e", "v6e"])
    p.add_argument("--critics", type=listed, default=list(zoo.ZOO_TPU))
    p.add_argument("--variants", type=listed, default=list(PROGRAM_VARIANTS))
    p.add_argument(
        "--cache", type=pathlib.Path, default=PROGRAMS, help="where new compiles are written"
    )
    c = sub.add_parser("capacity")
    c.add_argument("--generation", default="v5e", choices=tuple(cf.CHIPS))
    c.add_argument("--critics", type=listed, default=list(zoo.ZOO_TPU))
    c.add_argument("--variants", type=listed, default=list(CAPACITY_VARIANTS))
    c.add_argument("--resolution", type=float, default=0.05)
    c.add_argument(
        "--cached",
        action="store_true",
        help="tabulate the searches on record without compiling (steps not searched are left out)",
    )
    args = parser.parse_args(argv)
    {"programs": programs, "capacity": capacity}[args.command](args)


if __name__ == "__main__":
    main()
