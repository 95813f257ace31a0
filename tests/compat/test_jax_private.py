"""fastgp's uses of JAX's private modules, all in ``fastgp._jax_private``: each resolves on this
JAX, a moved one is named, and no other module reaches into them."""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import fastgp
from fastgp import _jax_private

ROOT = Path(__file__).resolve().parents[2]
PRIVATE_IMPORT = re.compile(r"\bjax\." + r"_src\b")  # split, so that this file is no match


@pytest.mark.parametrize("name", sorted(_jax_private.USES))
def test_every_private_use_resolves_on_this_jax(name):
    use = _jax_private.USES[name]
    found = _jax_private.resolve(name)
    assert found is not None
    if use.attribute is None:
        assert found.__name__ == use.module


def test_what_fastgp_does_with_them_is_there():
    """The shapes fastgp relies on: a set of primitives, callables, the attributes tests patch."""
    resolve = _jax_private.resolve
    assert isinstance(resolve("prim_requires_devices_during_lowering"), set)
    assert callable(resolve("insert_collective_pvary"))
    assert callable(resolve("pcollectives_lowering_common"))
    assert callable(resolve("pallas_primitives").uninitialized_value)
    assert callable(resolve("tpu_interpret_utils").get_uninitialized_value)
    assert hasattr(resolve("tpu_interpret_state"), "races")
    # every attention primitive asked for its devices at lowering
    requires = resolve("prim_requires_devices_during_lowering")
    assert sum(p.name.startswith("fastgp_attention_") for p in requires) >= 6


@pytest.fixture
def moved(monkeypatch):
    """JAX as if it had moved the symbol named: the entry points at a module that is not there."""

    def move(name):
        use = _jax_private.USES[name]
        monkeypatch.setitem(
            _jax_private.USES, name, _jax_private.Use("jax._gone", use.attribute, use.purpose, "")
        )
        _jax_private.resolve.cache_clear()

    yield move
    _jax_private.resolve.cache_clear()


def test_a_moved_symbol_is_named_with_the_jax_version_and_the_way_out(moved):
    moved("insert_collective_pvary")
    with pytest.raises(_jax_private.MissingPrivateJax) as e:
        _jax_private.resolve("insert_collective_pvary")
    message = str(e.value)
    assert "jax._gone.insert_collective_pvary" in message
    assert jax.__version__ in message and "Supported JAX" in message
    assert "ring" in message  # the feature that needs it


def test_a_moved_symbol_breaks_only_what_needs_it(moved):
    """The ring needs the permute's symbols; attention on one device and the penalty do not."""
    moved("insert_collective_pvary")
    q = jnp.ones((1, 16, 2, 8))
    assert fastgp.attention(q, q, q).shape == q.shape
    assert jnp.isfinite(fastgp.gradient_penalty(lambda x: jnp.sum(x**2, -1), jnp.ones((2, 3))))
    mesh = jax.make_mesh((4,), ("seq",), axis_types=(AxisType.Explicit,))
    q = jax.device_put(jnp.ones((1, 64, 2, 8)), NamedSharding(mesh, P(None, "seq")))
    with jax.set_mesh(mesh), pytest.raises(_jax_private.MissingPrivateJax, match="ring"):
        jax.jit(lambda q: fastgp.attention(q, q, q, sequence_parallel="ring"))(q)


def test_auto_jit_attention_over_devices_names_the_missing_device_hook(moved):
    moved("prim_requires_devices_during_lowering")
    mesh = jax.make_mesh((4,), ("seq",), axis_types=(AxisType.Auto,))
    q = jax.device_put(jnp.ones((1, 64, 2, 8)), NamedSharding(mesh, P(None, "seq")))
    with pytest.raises(_jax_private.MissingPrivateJax, match="prim_requires_devices"):
        jax.jit(lambda q: fastgp.attention(q, q, q, sequence_parallel="ring"))(q)


def test_no_module_but_the_compat_one_imports_private_jax():
    allowed = ROOT / "fastgp" / "_jax_private.py"
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("fastgp", "kernels", "tests", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_IMPORT.search(line)
    ]
    assert not found, found
