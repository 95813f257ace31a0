"""Does XLA:CPU's collective rendezvous abort under load? A data-parallel loop with no fastgp in it.

    python -m benchmarks.training.rendezvous [--devices 8] [--steps 200] [--load 2] [--repeats 3]
        [--sync] [--xla-flags "..."]
    -> one JSON line per repeat: completed or aborted, seconds, the rendezvous message if any

Each repeat is a fresh process: ``jax.shard_map`` over ``--devices`` simulated CPU devices, a
two-layer MLP critic on a batch split over them, its loss a global mean (``lax.psum``) plus an
R1-style penalty taken with nested ``jax.grad``, Adam by hand, jitted once and called ``--steps``
times with asynchronous dispatch (``--sync`` blocks on every step). ``--load`` busy-loop processes
keep the cores busy meanwhile. XLA:CPU aborts a collective whose participants do not all arrive
within its rendezvous timeout with "Expected N threads to join the rendezvous, but only M of
them arrived"; this script shows whether that happens without any fastgp code.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import time

from benchmarks import harness

CHILD = r"""
import os, sys, time
devices = int(sys.argv[1]); steps = int(sys.argv[2]); sync = sys.argv[3] == "1"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={devices}")
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((devices,), ("data",))
k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
params = {"w1": jax.random.normal(k1, (64, 256)) / 8, "w2": jax.random.normal(k2, (256, 1)) / 16}
x = jax.device_put(jax.random.normal(k3, (8 * devices, 64)), NamedSharding(mesh, P("data")))

def critic(p, x):
    return (jax.nn.gelu(x @ p["w1"]) @ p["w2"])[:, 0]

def loss(p, x):
    scores = critic(p, x)
    grads = jax.grad(lambda y: jnp.sum(critic(p, y)))(x)
    penalty = jnp.sum(grads**2, axis=1)
    total = jax.lax.psum(jnp.sum(scores + 10.0 * penalty), "data")
    return total / jax.lax.psum(x.shape[0], "data")

def local_step(p, m, x):
    varying = lambda q: jax.tree.map(lambda a: jax.lax.pcast(a, "data", to="varying"), q)
    value, g = jax.value_and_grad(lambda q: loss(varying(q), x))(p)
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    return jax.tree.map(lambda a, m: a - 1e-3 * m, p, m), m, value

step = jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P(), P("data")),
                             out_specs=(P(), P(), P()), check_vma=True))
moments = jax.tree.map(jnp.zeros_like, params)
start = time.perf_counter()
for _ in range(steps):
    params, moments, value = step(params, moments, x)
    if sync:
        jax.block_until_ready(value)
jax.block_until_ready(params)
print(time.perf_counter() - start, flush=True)
"""


def _busy() -> None:
    while True:
        pass


def repeat(devices: int, steps: int, sync: bool, xla_flags: str, timeout: float) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags}
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(devices), str(steps), "1" if sync else "0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"outcome": "timed out", "seconds": round(time.perf_counter() - start, 1)}
    seconds = round(time.perf_counter() - start, 1)
    lines = [line for line in proc.stderr.splitlines() if "rendezvous" in line]
    if proc.returncode == 0:
        return {"outcome": "completed", "seconds": seconds}
    return {
        "outcome": "aborted",
        "returncode": proc.returncode,
        "seconds": seconds,
        "message": (lines[0] if lines else proc.stderr.strip().splitlines()[-1])[-300:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes meanwhile")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sync", action="store_true", help="block on every step")
    parser.add_argument("--xla-flags", default="", help="XLA_FLAGS of the child processes")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for p in busy:
        p.start()
    try:
        for _ in range(args.repeats):
            outcome = repeat(args.devices, args.steps, args.sync, args.xla_flags, args.timeout)
            print(json.dumps({**vars(args), **outcome}), flush=True)
    finally:
        for p in busy:
            p.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
