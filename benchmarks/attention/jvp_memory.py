"""The compiled memory of a transformer block's JVP through each attention, on CPU and for a TPU.

    python -m benchmarks.attention.jvp_memory [--tokens 1024 4096] [--generation v5e]
    -> benchmarks/results/attention/jvp_memory.json

The block is docs/recipes.md's forward-mode recipe at width 256 (4 heads of 64), causal, batch 4:
``jax.jit(lambda x, t: jax.jvp(block, (x,), (t,)))``, compiled on this host's CPU in float32 and
for one TPU chip of ``--generation`` in bfloat16 (libtpu's compile-only client). Attentions:

    fastgp     fastgp.attention (its default backend on CPU; backend="pallas" on the TPU)
    softmax    jax.nn.dot_product_attention (XLA's softmax attention)
    jax-flash  JAX's Pallas TPU flash_attention (TPU only; it has no forward-mode rule, and the
               record keeps the error it raises)

Figures: the compiler's memory analysis (temporaries; on TPU also the peak) and XLA's flops.
"""

import functools
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import jax.numpy as jnp

import benchmarks
from benchmarks import harness
from benchmarks.attention.tpu import jax_flash_attention
from benchmarks.tables import markdown_table
from fastgp import attention
from fastgp import measure as cf

RESULTS = benchmarks.RESULTS / "attention"
OUT = RESULTS / "jvp_memory.json"
WIDTH, HEADS, BATCH = 256, 4, 4


def _layer_norm(x):
    x32 = x.astype(jnp.float32)
    mean, var = x32.mean(-1, keepdims=True), x32.var(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + 1e-6)).astype(x.dtype)


def block(params, x, attention_fn):
    """docs/recipes.md's pre-LN block: (B, T, WIDTH) -> (B, T, WIDTH)."""
    b, t, d = x.shape
    q, k, v = jnp.split(_layer_norm(x) @ params["qkv"], 3, axis=-1)
    heads = lambda y: y.reshape(b, t, HEADS, d // HEADS)
    x = x + attention_fn(heads(q), heads(k), heads(v)).reshape(b, t, d) @ params["proj"]
    return x + jax.nn.gelu(_layer_norm(x) @ params["fc1"]) @ params["fc2"]


def attentions(platform: str) -> dict:
    found = {
        "fastgp": functools.partial(
            attention, is_causal=True, backend="pallas" if platform == "tpu" else "auto"
        ),
        "softmax": functools.partial(jax.nn.dot_product_attention, is_causal=True),
    }
    if platform == "tpu":
        found["jax-flash"] = functools.partial(jax_flash_attention, causal=True)
    return found


def program(attention_fn, tokens: int, dtype):
    shapes = {"qkv": (WIDTH, 3 * WIDTH), "proj": (WIDTH, WIDTH)}
    shapes.update(fc1=(WIDTH, 2 * WIDTH), fc2=(2 * WIDTH, WIDTH))
    params = {name: jax.ShapeDtypeStruct(shape, dtype) for name, shape in shapes.items()}
    x = jax.ShapeDtypeStruct((BATCH, tokens, WIDTH), dtype)

    def jvp(params, x, t):
        return jax.jvp(lambda y: block(params, y, attention_fn), (x,), (t,))

    return jvp, (params, x, x)


def measure(platform: str, generation: str, tokens: int) -> list[dict]:
    dtype = jnp.bfloat16 if platform == "tpu" else jnp.float32
    rows = []
    for name, attention_fn in attentions(platform).items():
        fn, args = program(attention_fn, tokens, dtype)
        row = dict(platform=platform, tokens=tokens, attention=name, batch=BATCH)
        row["generation"] = generation if platform == "tpu" else "cpu"
        try:
            if platform == "tpu":
                compiled = cf.compile_for(cf.tpu_device(generation), fn, *args)
            else:
                compiled = jax.jit(fn).lower(*args).compile()
        except Exception as err:  # a missing derivative rule is a measurement here
            row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"
        else:
            figures = cf.figures(compiled)
            row.update({key: figures[key] for key in ("temp", "peak", "flops", "kernel")})
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def table(result: dict) -> list[str]:
    """docs/recipes.md's table: per platform and attention, the temporaries (and the TPU's peak)
    in MiB at each token count, or the error a missing rule raised."""
    tokens = sorted({row["tokens"] for row in result["rows"]})
    cells: dict[tuple, dict] = {}
    for row in result["rows"]:
        cells.setdefault((row["generation"], row["attention"]), {})[row["tokens"]] = row

    def cell(row):
        if row is None:
            return ""
        if "error" in row:
            return "no JVP rule"
        peak = f", peak {_mib(row['peak'])}" if row["platform"] == "tpu" else ""
        return f"{_mib(row['temp'])}{peak}"

    head = ["compiled for", "attention", *(f"T = {t:,}: temporaries MiB" for t in tokens)]
    rows = [
        [where, name, *(cell(by_tokens.get(t)) for t in tokens)]
        for (where, name), by_tokens in cells.items()
    ]
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--generation", default="v5e")
    args = parser.parse_args(argv)
    rows = []
    for platform in ("cpu", "tpu"):
        for tokens in args.tokens:
            rows += measure(platform, args.generation, tokens)
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"argv": sys.argv[1:] if argv is None else list(argv), "rows": rows}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
