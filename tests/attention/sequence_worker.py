"""One process of a 2-process x 4-device run: the R1 step of a sequence-parallel transformer
critic, its tokens over a "seq" axis inside each process and its batch over "data" across them.

    python tests/attention/sequence_worker.py PROCESS_ID PORT   -> one JSON line on stdout
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


def main():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "seq"))

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
    params = jax.tree.map(lambda a: global_array(a, mesh, P()), critic_params())
    value, grads = step(params, global_array(tokens(), mesh, P("data", "seq")))
    local = lambda a: np.asarray(a.addressable_data(0)).tolist()
    print(json.dumps({"value": local(value), "grads": jax.tree.map(local, grads)}), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
