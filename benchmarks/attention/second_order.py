"""The penalty's second order through attention as kernels: the WGAN-GP step before and after.

Reads the long ViT critic's compiled steps (``python -m benchmarks.attention.tpu``):
``attention_tpu.json`` now, and ``attention_tpu_before.json``, the same steps compiled before the
second-order passes were kernels (its ``commit``), when ``backend="pallas"`` ran the first-order
passes on Mosaic kernels and the second-order terms as JAX's JVP of the blockwise XLA loops.

XLA's cost analysis counts a while loop's body once, so a program with loops has flops and bytes
that are lower bounds (marked >=); a program without them has its Mosaic calls' cost estimates,
derived from their loop counts, plus XLA's own count of the rest.
"""

from benchmarks.attention.tpu import probe_batch
from benchmarks.tables import markdown_table

STEPS = ("flash/fastgp", "flash/reverse", "flash/exact-r1")


def _index(records: list[dict]) -> dict[tuple, dict]:
    return {
        (r["generation"], r["tokens"], r["variant"], r["batch"]): r
        for r in records
        if r.get("fits")
    }


def _per_sample(record: dict, key: str, unit: float) -> str:
    bound = ">= " if record.get("loops", 1) else ""
    return f"{bound}{record[key] / record['batch'] / unit:.3g}"


def rows(now: list[dict], before: list[dict]) -> list[dict]:
    """One row per step compiled both before and now (the WGAN-GP step at every batch, the others
    at the probe batch), with the plain step at the same batch."""
    old, new = _index(before), _index(now)
    out = []
    chips = {g: i for i, g in enumerate(("v5e", "v6e", "v5p", "7x"))}
    for key in sorted(new, key=lambda k: (chips.get(k[0], 9), k[2], k[1], k[3])):
        generation, tokens, variant, batch = key
        probe = batch == probe_batch(tokens)
        if variant not in STEPS or key not in old or not (probe or variant == "flash/fastgp"):
            continue
        plain = new.get((generation, tokens, "flash/plain", batch))
        out.append(dict(key=key, before=old[key], now=new[key], plain=plain))
    return out


def table(now: list[dict], before: list[dict]) -> list[str]:
    """docs/performance.md's table: XLA loops, per-sample flops and bytes, peak memory."""
    body = []
    for row in rows(now, before):
        generation, tokens, variant, batch = row["key"]
        b, n, plain = row["before"], row["now"], row["plain"]
        over_plain = (
            f"{n['flops'] / plain['flops']:.2f}x, {n['bytes'] / plain['bytes']:.2f}x"
            if plain
            else "n/a"
        )
        body.append(
            [
                f"{generation}, T = {tokens:,}, {variant} (batch {batch})",
                f"{b.get('loops', '?')} → {n['loops']}",
                f"{_per_sample(b, 'flops', 1e12)} → {_per_sample(n, 'flops', 1e12)}",
                f"{_per_sample(b, 'bytes', 1e9)} → {_per_sample(n, 'bytes', 1e9)}",
                f"{b['peak'] / 2**30:.2f} → {n['peak'] / 2**30:.2f} ({n['peak'] / b['peak']:.2f}x)",
                over_plain,
            ]
        )
    head = [
        "chip, tokens, step",
        "XLA loops",
        "TFLOP / sample",
        "GB / sample",
        "peak GiB",
        "now / plain step (flops, bytes)",
    ]
    return markdown_table(head, body)


__all__ = ["rows", "table"]
