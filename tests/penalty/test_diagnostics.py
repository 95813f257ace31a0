"""fastgp.diagnostics: each device's norm statistics against numpy on the slices it holds.

The norms come from ``gradient_penalty_and_norms`` on 8 CPU devices, with NaN and inf planted in
chosen samples; the oracle is numpy's mean, min and max over each device's finite norms.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import fastgp
from fastgp.diagnostics import norm_stats, per_device

B = 16


def critic(x):
    return jnp.sum(jnp.sin(x) * jnp.arange(1.0, 4.0), axis=1)


def batch():
    """(B, 3) inputs whose norms all differ; sample 5 is NaN, sample 14 inf; samples 8-11 (the
    third of four slices) are all NaN."""
    x = jax.random.normal(jax.random.PRNGKey(0), (B, 3))
    return x.at[5].set(jnp.nan).at[14, 0].set(jnp.inf).at[8:12].set(jnp.nan)


def oracle(norms, devices):
    """numpy statistics of each of ``devices`` contiguous slices' finite norms."""
    out: dict[str, list[float]] = {
        k: [] for k in ("norm_mean", "norm_min", "norm_max", "nonfinite")
    }
    for part in np.split(np.asarray(norms, np.float64), devices):
        finite = part[np.isfinite(part)]
        some = finite.size > 0
        out["norm_mean"].append(finite.mean() if some else np.nan)
        out["norm_min"].append(finite.min() if some else np.nan)
        out["norm_max"].append(finite.max() if some else np.nan)
        out["nonfinite"].append(part.size - finite.size)
    return {k: np.asarray(v) for k, v in out.items()}


def assert_stats(got, want):
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(got[name]), value, rtol=1e-6, err_msg=name)
    assert got["nonfinite"].dtype == jnp.int32 and got["norm_mean"].dtype == jnp.float32


def one_device_norms(x):
    return fastgp.gradient_penalty_and_norms(critic, x)[1]


@pytest.mark.parametrize("axes", [("data",), ("data", "fsdp")])
def test_each_device_s_statistics_in_shard_map(axes):
    """4 devices along one batch axis, or 2 x 2 along two (entry i: the device at linear index
    i, which holds the i-th slice of the batch), identical on every device."""
    x = batch()
    shape = (4,) if len(axes) == 1 else (2, 2)
    mesh = jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes))
    axis = axes if len(axes) > 1 else axes[0]

    def local(x):
        _, norms = fastgp.gradient_penalty_and_norms(critic, x, axis_name=axis)
        return norm_stats(norms, axis)

    got = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(axis), out_specs=P()))(x)
    assert_stats(got, oracle(one_device_norms(x), 4))
    assert got["nonfinite"].tolist() == [0, 1, 4, 1]


def test_the_whole_batch_in_slices_under_jit():
    x = batch()
    norms = one_device_norms(x)
    assert_stats(jax.jit(lambda n: norm_stats(n, shards=4))(norms), oracle(norms, 4))
    assert_stats(norm_stats(norms), oracle(norms, 1))
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Explicit,))
    sharded = jax.device_put(x, NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):  # explicit axes: the norms a batch-sharded global array
        got = jax.jit(lambda x: norm_stats(one_device_norms(x), shards=4))(sharded)
    assert_stats(got, oracle(norms, 4))
    with pytest.raises(ValueError, match="shards=3 must divide the batch of 16"):
        norm_stats(norms, shards=3)
    with pytest.raises(ValueError, match=r"norms must be per sample, \(B,\); got shape \(16, 1\)"):
        norm_stats(norms[:, None])


def test_a_batch_axis_left_unnamed_is_named():
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
    local = lambda n: norm_stats(n)["norm_mean"]
    run = jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    with pytest.raises(ValueError, match=r"mesh axes \('data',\).*axis_name='data'"):
        jax.jit(run)(jnp.ones(B))


def test_per_device_gathers_every_value_exactly_in_one_collective():
    """Mixed dtypes and shapes, a NaN on one device only: each comes back exact, in its own
    entry, from one all-reduce."""
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))

    def local(n):
        i = jax.lax.axis_index("data")
        values = {"count": i.astype(jnp.int32) * 7, "pair": jnp.stack([n[0], -n[1]])}
        values["poisoned"] = jnp.where(i == 2, jnp.nan, n[0])
        return per_device(values, "data")

    n = jnp.arange(8.0) + 0.5
    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P()))
    got = fn(n)
    assert got["count"].dtype == jnp.int32 and got["count"].tolist() == [0, 7, 14, 21]
    np.testing.assert_array_equal(got["pair"], [[0.5, 2.5, 4.5, 6.5], [-1.5, -3.5, -5.5, -7.5]])
    np.testing.assert_array_equal(got["poisoned"], [0.5, 2.5, np.nan, 6.5])
    text = fn.lower(n).compile().as_text() or ""
    assert text.count(" all-reduce(") + text.count(" all-reduce-start(") == 1
    with pytest.raises(ValueError, match="name the mesh axes"):
        per_device({"a": n}, None)
