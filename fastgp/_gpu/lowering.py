"""Programs traced and lowered for an NVIDIA GPU from a host with none (``jax.export`` with
``platforms=["cuda"]``, as the GPU tests do on CPU).

    gpu_mesh(mesh=None, device=H100) -> jax.sharding.AbstractMesh: ``mesh``'s axes (none by
                                        default) on an abstract GPU
    for_gpu(mesh=None, device=H100)  -> context manager: trace and lower for that GPU

Pallas's GPU lowerings read the target GPU from the abstract mesh's device: from JAX 0.11 the
Triton lowering raises "No supported GPU devices found, please specify an abstract GPU device
using AbstractDevice" on a host with no GPU unless one is set (JAX 0.10.2 assumed an sm_90 GPU),
and Mosaic GPU's lowering assumes sm_90 for a device that names no compute capability. fastgp
reads the same device (``fastgp._backends.traced_device``): inside :func:`for_gpu`, ``"auto"``
chooses as on that GPU and the tuned launch settings are that GPU's. Every JAX fastgp supports
(0.10.2 on) has ``jax.sharding.AbstractDevice`` and ``use_abstract_mesh``, so the same program is
traced on each.

A sharded program's operands are placed on the abstract mesh too: ``NamedSharding(gpu_mesh(mesh),
spec)`` for their ``jax.ShapeDtypeStruct``, ``jax.shard_map(..., mesh=gpu_mesh(mesh))``, and
:func:`for_gpu` with that mesh around the export.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import jax
from jax.sharding import AbstractDevice, AbstractMesh

H100 = AbstractDevice(device_kind="NVIDIA H100", num_cores=132, platform="gpu")


def gpu_mesh(
    mesh: jax.sharding.Mesh | AbstractMesh | None = None, device: AbstractDevice = H100
) -> AbstractMesh:
    """``mesh``'s axis sizes, names and types on ``device`` (no axes: one device)."""
    if mesh is None:
        return AbstractMesh((), (), abstract_device=device)
    return AbstractMesh(mesh.axis_sizes, mesh.axis_names, mesh.axis_types, abstract_device=device)


@contextmanager
def for_gpu(
    mesh: jax.sharding.Mesh | AbstractMesh | None = None, device: AbstractDevice = H100
) -> Iterator[AbstractMesh]:
    """Trace and lower inside this block for ``device`` (an H100 by default), on ``mesh``'s axes
    (``gpu_mesh``); yields that abstract mesh."""
    abstract = gpu_mesh(mesh, device)
    with jax.sharding.use_abstract_mesh(abstract):
        yield abstract


__all__ = ["H100", "for_gpu", "gpu_mesh"]
