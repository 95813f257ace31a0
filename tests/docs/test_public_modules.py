"""fastgp.options and fastgp.measure: what they name is what the library uses, and docs/api.md
describes them."""

import pathlib

import jax
import pytest

from fastgp import _backends, measure, options

API = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()


@pytest.mark.parametrize("op", ["penalty", "attention"])
def test_auto_backend_is_what_auto_resolves_to_here(op):
    assert options.auto_backend(op, jax.default_backend()) == _backends.resolve(op, "auto")


def test_auto_backend_names_the_kernels_where_they_were_measured_faster():
    assert options.auto_backend("attention", "tpu") == "pallas"
    assert options.auto_backend("attention", "rocm") == "xla"  # timed on NVIDIA only
    assert options.auto_backend("penalty", "tpu") == "xla"
    with pytest.raises(ValueError, match="unknown op 'norm'"):
        options.auto_backend("norm", "cpu")  # type: ignore[arg-type]


def test_the_option_tuples_are_the_literal_types():
    assert set(options.KINDS) == {"wgan-gp", "wgan-lp", "r1"}
    assert "xla" in options.BACKENDS and "auto" in options.BACKENDS
    assert options.SEQUENCE_SCHEMES == ("auto", "ring", "all-to-all", "all-gather")


@pytest.mark.parametrize("module", [measure, options], ids=lambda m: m.__name__)
def test_docs_api_describes_the_module(module):
    assert f"`{module.__name__}`" in API
    for name in ("compile_for", "figures", "interleaved_times", "relative_errors", "auto_backend"):
        if name in module.__all__:
            assert f"`{name}(" in API, name
