"""Every use of JAX's private modules (``jax._src``) by fastgp and its tests, in one place.

    resolve(name)   the private object ``name`` (a key of ``USES``), or a fastgp error naming it
    USES            name -> where JAX keeps it, what fastgp does with it, what would retire it

JAX may move or drop anything under ``jax._src`` in any release. Each use is resolved here by
name, when first needed, so that a JAX that moved one breaks only the feature that needs it, with
an error naming the missing symbol, JAX's version and the way out, never ``import fastgp``.
``tests/test_jax_private.py`` resolves every entry on each supported JAX, and docs/development.md
lists them with the upstream change that would retire each.
"""

import dataclasses
import functools
import importlib
from typing import Any


@dataclasses.dataclass(frozen=True)
class Use:
    """A private JAX object: ``module.attribute`` (the module itself where ``attribute`` is
    None), what fastgp needs it for, and the public spelling that would retire it."""

    module: str
    attribute: str | None
    purpose: str
    retired_by: str


USES: dict[str, Use] = {
    "prim_requires_devices_during_lowering": Use(
        "jax._src.dispatch",
        "prim_requires_devices_during_lowering",
        "the attention primitives' Auto-jit lowering hands the devices to its custom "
        "partitioning (fastgp._attention.rules)",
        "a public way for a jax.extend Primitive to ask for the device assignment at lowering",
    ),
    "insert_collective_pvary": Use(
        "jax._src.lax.parallel",
        "insert_collective_pvary",
        "the ring's permute marks its operand varying over the ring's axes as lax.ppermute "
        "does (fastgp._attention.permute)",
        "a channel_id (or unique-channel) option on jax.lax.ppermute, retiring the whole "
        "permute primitive",
    ),
    "pcollectives_lowering_common": Use(
        "jax._src.lax.parallel",
        "_pcollectives_lowering_common",
        "the ring's permute lowers to the device pairs lax.ppermute would, with a channel of "
        "its own (fastgp._attention.permute)",
        "a channel_id (or unique-channel) option on jax.lax.ppermute",
    ),
    "pallas_primitives": Use(
        "jax._src.pallas.primitives",
        None,
        "tests: out-of-bounds block contents made finite, to show masking (not NaN) keeps them "
        "out of the kernels' sums",
        "a public setting for interpret mode's uninitialized value",
    ),
    "tpu_interpret_utils": Use(
        "jax._src.pallas.mosaic.interpret.utils",
        None,
        "tests: as pallas_primitives, for TPU interpret mode",
        "a public setting for TPU interpret mode's uninitialized value",
    ),
    "tpu_interpret_state": Use(
        "jax._src.pallas.mosaic.interpret.interpret_pallas_call",
        None,
        "tests: whether TPU interpret mode's race detection found a race",
        "a public result of pltpu.InterpretParams(detect_races=True)",
    ),
}


class MissingPrivateJax(ImportError):
    """A private JAX object fastgp needs is not where this JAX keeps it."""


@functools.cache
def resolve(name: str) -> Any:
    """The private object ``name`` of :data:`USES`.

    Raises:
        MissingPrivateJax: this JAX has no such module or attribute; the message names it, the
            feature that needs it and the JAX versions fastgp is tested on.
    """
    use = USES[name]
    where = use.module + ("" if use.attribute is None else f".{use.attribute}")
    try:
        module = importlib.import_module(use.module)
        return module if use.attribute is None else getattr(module, use.attribute)
    except (ImportError, AttributeError) as e:
        import jax

        raise MissingPrivateJax(
            f"fastgp needs {where} from JAX's private modules for {use.purpose}, and JAX "
            f"{jax.__version__} has no such symbol. The JAX versions fastgp is tested on are in "
            'docs/development.md ("Supported JAX"); install one of them, or report the JAX '
            "version at fastgp's issue tracker."
        ) from e


__all__ = ["USES", "MissingPrivateJax", "Use", "resolve"]
