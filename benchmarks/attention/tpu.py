"""Long-sequence ViT critic steps with flash and jnp attention, compiled for TPU chips.

    python -m benchmarks.attention.tpu [--generations v5e,v6e] [--tokens 1024,4096,16384]
                                       [--capacity v5e] [--max-batch 1024]

For each generation, token count (``zoo.critics.LONG_TOKENS``) and attention variant, the whole
bfloat16 WGAN-GP critic step (critic loss + penalty, value_and_grad over the parameters, Adam) of
``zoo.critics.vit_long`` is compiled for one chip from this host (``fastgp.measure``) at batch 8
(4 at 16384 tokens): peak memory, temporaries, flops and bytes, and whether the Mosaic kernels are
in the program. With ``--capacity GEN``, the largest power-of-two batch whose step compiles within
that chip's HBM (the compiler is the judge: RESOURCE_EXHAUSTED means it does not fit).

Variants: ``jnp``: the zoo's plain softmax attention (every T x T array in HBM) with fastgp's
default penalty or the ``naive`` nested-grad one; ``flash``: ``fastgp.attention`` on the Mosaic
kernels with the default penalty or ``second_order="reverse"``; ``flash-xla``: its blockwise jnp
loops; first order (no penalty): ``flash/plain`` against JAX's own Pallas ``flash_attention``
(``jax-flash/plain``), which has no second order; R1 at the reals: exact through ``flash``
(``flash/exact-r1``) against ``fastgp.approximate_r1`` through JAX's (``jax-flash/approximate-r1``,
``workloads.APPROXIMATE_SIGMA``), and through fastgp's (``flash/approximate-r1``): JAX's backward
kernels declare no cost estimate, so XLA counts no flops for them, and only fastgp's kernels give
both penalties' flops and bytes by one count. Flops and bytes of a Pallas call are its own
``pl.CostEstimate``; peak memory and capacity are measured by the compiler.

Results go to ``results/attention/attention_tpu.{json,md}``; compiled records are reused.
``--recompile VARIANT[,VARIANT]`` forgets those variants' records first (every generation, length
and batch) and compiles the same keys again, as after a kernel change.
"""

import functools
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import jax.numpy as jnp

import benchmarks
from benchmarks import capacity, harness
from benchmarks import workloads as W
from benchmarks.zoo import critics as zoo
from fastgp import attention
from fastgp import measure as cf

RESULTS = benchmarks.RESULTS / "attention"
RECORDS = RESULTS / "attention_tpu.json"


def jax_flash_attention(q, k, v, causal=False):
    """JAX's Pallas TPU flash attention in (B, T, H, D) layout (first order only)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash

    bhtd = [jnp.swapaxes(t, 1, 2) for t in (q, k, v)]
    out = jax_flash.flash_attention(*bhtd, causal=causal, sm_scale=q.shape[-1] ** -0.5)
    return jnp.swapaxes(out, 1, 2)


ATTENTION = {
    "jnp": None,
    "flash": functools.partial(attention, backend="pallas"),
    "flash-xla": functools.partial(attention, backend="xla"),
    "jax-flash": jax_flash_attention,
}
# name: (attention, critic-step variant of ``workloads``)
VARIANTS = {
    "jnp/fastgp": ("jnp", "fastgp"),
    "jnp/naive": ("jnp", "naive"),
    "flash/fastgp": ("flash", "fastgp"),
    "flash/reverse": ("flash", "fastgp-reverse"),
    "flash-xla/fastgp": ("flash-xla", "fastgp"),
    "flash/plain": ("flash", "plain"),
    "jax-flash/plain": ("jax-flash", "plain"),
    "flash/exact-r1": ("flash", "exact-r1"),
    "jax-flash/approximate-r1": ("jax-flash", "approximate-r1"),
    "flash/approximate-r1": ("flash", "approximate-r1"),
}


def _records():
    return json.loads(RECORDS.read_text()) if RECORDS.exists() else []


def _key(record):
    return tuple(record[k] for k in ("generation", "tokens", "variant", "batch"))


def _write(records):
    RESULTS.mkdir(parents=True, exist_ok=True)
    RECORDS.write_text(json.dumps(records, indent=1) + "\n")


def _save(records):
    """Write ``records``, keeping (and adding to ``records``) those another run wrote meanwhile."""
    mine = {_key(r) for r in records}
    records[:0] = [r for r in _records() if _key(r) not in mine]
    _write(records)


def forget(records, variants):
    """Remove the records of ``variants`` from ``records`` and from the file (``_save`` merges the
    file's records back in, so they must go from both); returns the removed ones."""
    removed = [r for r in records if r["variant"] in variants]
    records[:] = [r for r in records if r["variant"] not in variants]
    _write(records)
    return removed


def compile_record(records, generation, tokens, variant, batch):
    """The record of one compiled step (reused when on file): figures, or fits=False."""
    key = dict(generation=generation, tokens=tokens, variant=variant, batch=batch)
    for r in records:
        if all(r.get(k) == v for k, v in key.items()):
            return r
    attention_name, step_variant = VARIANTS[variant]
    spec = zoo.long_spec(tokens, ATTENTION[attention_name], batch=batch)
    structs = jax.eval_shape(lambda: W.inputs(spec))
    start = time.perf_counter()
    record = dict(key)
    try:
        program = cf.compile_for(
            cf.tpu_device(generation), W.critic_step(spec, step_variant), *structs
        )
    except Exception as err:  # an out-of-memory compile is a measurement here
        if not cf.is_out_of_memory(err):
            record.update(fits=False, error=f"{type(err).__name__}: {str(err)[:300]}")
        else:
            record.update(fits=False, error=str(err).strip().splitlines()[0][:300])
    else:
        record.update(fits=True, **cf.figures(program))
    record["compile_s"] = round(time.perf_counter() - start, 1)
    records.append(record)
    _save(records)
    state = "fits" if record["fits"] else record["error"][:80]
    print(f"{generation} T={tokens} {variant} B={batch}: {state} ({record['compile_s']} s)")
    return record


def largest_batch(records, generation, tokens, variant, max_batch):
    """The largest power-of-two batch that compiles within HBM (``benchmarks.capacity.search``
    from the probe batch, without bisection); 0: not even one sample fits, None: the program
    does not compile for another reason (its error is on record)."""

    def fits(batch):
        record = compile_record(records, generation, tokens, variant, batch)
        if not record["fits"] and "RESOURCE_EXHAUSTED" not in record["error"]:
            return None
        return record["fits"]

    found = capacity.search(fits, probe_batch(tokens), cap=max_batch, bisect=False)
    return found.fit if found.settled else None


def probe_batch(tokens):
    return 4 if tokens >= 16384 else 8


def _gib(n):
    return f"{n / 2**30:.2f}"


def render(records, capacity):
    lines = [
        "# Long-sequence ViT critic steps on TPU (compiled from a CPU host)",
        "",
        (
            "Written by `python -m benchmarks.attention.tpu`. ViT critic: 4x4 patches, dim 256, "
            "4 heads of 64, 2 pre-LN blocks, bfloat16; whole WGAN-GP critic step (value_and_grad "
            "over the parameters + Adam) on one chip. Peak memory (GiB) at the probe batch (8; 4 "
            "at 16384 tokens); `x` = does not compile (out of memory or no derivative rule)."
        ),
        "",
    ]
    gens = sorted({r["generation"] for r in records})
    tokens = sorted({r["tokens"] for r in records})
    for gen in gens:
        lines += [f"## {gen}: peak memory at the probe batch", ""]
        lines.append("| variant | " + " | ".join(f"T = {t}" for t in tokens) + " |")
        lines.append("|---|" + "---|" * len(tokens))
        for variant in VARIANTS:
            cells = []
            for t in tokens:
                r = next(
                    (
                        r
                        for r in records
                        if (r["generation"], r["tokens"], r["variant"], r["batch"])
                        == (gen, t, variant, probe_batch(t))
                    ),
                    None,
                )
                if r is None:
                    cells.append("")
                elif r["fits"]:
                    cells.append(_gib(r["peak"]) + (" (kernel)" if r["kernel"] else ""))
                else:
                    cells.append("x")
            if any(cells):
                lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        lines.append("")
    for gen, table in capacity.items():
        lines += [f"## {gen}: largest power-of-two batch that compiles", ""]
        lines.append("| variant | " + " | ".join(f"T = {t}" for t in tokens) + " |")
        lines.append("|---|" + "---|" * len(tokens))
        for variant in VARIANTS:
            cells = [str(table.get((variant, t), "")) for t in tokens]
            if any(cells):
                lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        lines.append("")
    errors = sorted(
        {(r["variant"], r["error"].split(":")[0]) for r in records if not r["fits"]}
        - {(v, "RESOURCE_EXHAUSTED") for v in VARIANTS}
    )
    if errors:
        lines += ["Programs that did not compile for another reason than memory:", ""]
        lines += [f"- {v}: {e}" for v, e in errors]
        lines.append("")
    (RESULTS / "attention_tpu.md").write_text("\n".join(lines))


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument("--generations", default="v5e,v6e")
    parser.add_argument("--tokens", default=",".join(map(str, zoo.LONG_TOKENS)))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--capacity", default="", help="a generation to search capacity on")
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--recompile", default="", help="variants whose records to compile again")
    args = parser.parse_args(argv)
    records = _records()
    for r in forget(records, set(filter(None, args.recompile.split(",")))):
        compile_record(records, r["generation"], r["tokens"], r["variant"], r["batch"])
    tokens = [int(t) for t in args.tokens.split(",")]
    variants = args.variants.split(",")
    for gen in args.generations.split(","):
        for t in tokens:
            for variant in variants:
                compile_record(records, gen, t, variant, probe_batch(t))
    capacity = {}
    if args.capacity:
        gen = args.capacity
        capacity[gen] = {
            (v, t): largest_batch(records, gen, t, v, args.max_batch)
            for t in tokens
            for v in variants
        }
    render(records, capacity)


if __name__ == "__main__":
    main()
