"""One process of a 2-process x 4-device run: the R1 step of a sequence-parallel transformer
critic in each layout of ``LAYOUTS``, its batch over "data" and its tokens over "seq".

    python tests/attention/sequence_worker.py PROCESS_ID PORT   -> one JSON line on stdout:
        {layout: {"value": ..., "grads": {...}}}
"""

import json
import sys
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", num_processes=2, process_id=int(sys.argv[1]))

# The imports below come after JAX's set-up (E402).
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
from test_sequence_parallel import critic_params, tokens, transformer_critic  # noqa: E402

import fastgp  # noqa: E402


def global_array(value, mesh, spec):
    value = np.asarray(value)
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


# layout: (the 8 devices of both processes as the (data, seq) mesh, attention heads). Process 0
# holds devices 0-3, process 1 devices 4-7.
LAYOUTS = {
    # the tokens inside each process, the batch across them; 2 heads over 4: the ring
    "tokens within, ring": ([[0, 1, 2, 3], [4, 5, 6, 7]], 2),
    # each sample's tokens over both processes: the ring's hops 1 -> 4 and 5 -> 0 cross them
    "tokens across, ring": ([[0, 1, 4, 5], [2, 3, 6, 7]], 2),
    # 4 heads over 4: the all-to-all, trading between the processes
    "tokens across, all-to-all": ([[0, 1, 4, 5], [2, 3, 6, 7]], 4),
}


def r1_step(mesh, heads):
    """R1 and its parameter gradients on ``mesh``, in shard_map."""

    def r1_and_grads(params, x):
        r1 = lambda p: fastgp.gradient_penalty(
            lambda y: transformer_critic(p, y, "seq"),
            x,
            kind="r1",
            axis_name="data",
            sample_axis_name="seq",
        )
        return jax.value_and_grad(r1)(params)

    step = jax.jit(
        jax.shard_map(r1_and_grads, mesh=mesh, in_specs=(P(), P("data", "seq")), out_specs=P())
    )
    params = jax.tree.map(lambda a: global_array(a, mesh, P()), critic_params(heads))
    return step(params, global_array(tokens(), mesh, P("data", "seq")))


def main():
    devices = np.array(jax.devices())
    local = lambda a: np.asarray(a.addressable_data(0)).tolist()
    results = {}
    for layout, (grid, heads) in LAYOUTS.items():
        value, grads = r1_step(Mesh(devices[np.array(grid)], ("data", "seq")), heads)
        results[layout] = {"value": local(value), "grads": jax.tree.map(local, grads)}
    print(json.dumps(results), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
