"""Which GPU kernels run under this JAX, and what fastgp does where Pallas's Triton backend is gone.

JAX deprecates Pallas Triton since 0.11 and will remove it. fastgp imports its Triton kernels on
first use, so ``import fastgp`` survives the removal: a child process with
``jax.experimental.pallas.triton`` made unimportable runs both ops on CPU with every backend that
needs no Triton, and, lowering for an abstract H100, ``backend="auto"`` runs XLA's attention with
one warning, ``"pallas"`` attention and ``"gpu-interpret"`` raise errors that name what is missing,
and the penalty's ``"pallas"`` runs the Mosaic GPU kernel where this JAX has it (an sm_80 GPU,
which Mosaic GPU does not target, is refused by name). JAX's deprecation warning, where it warns,
is shown once, not at every lowering of a fastgp Triton kernel, and no other warning is hidden.
"""

import json
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from fastgp import _backends as backends
from fastgp import penalty
from fastgp._gpu import pallas as pallas_gpu
from fastgp._gpu.lowering import for_gpu

TRITON = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")

WITHOUT_TRITON = r"""
import importlib.abc, json, sys, warnings


class NoTriton(importlib.abc.MetaPathFinder):  # as in a JAX that no longer ships the backend
    def find_spec(self, name, path=None, target=None):
        if name.endswith(".pallas.triton") or ".pallas.triton." in name:
            raise ImportError(f"No module named {name!r}")


sys.meta_path.insert(0, NoTriton())

import jax, jax.numpy as jnp, numpy as np
import fastgp
from fastgp import _backends as backends
from fastgp._gpu import pallas as pallas_gpu
from fastgp._gpu.lowering import for_gpu

out = {"has_triton": pallas_gpu.has_triton(), "has_mosaic_gpu": pallas_gpu.has_mosaic_gpu()}
k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
w = jax.random.normal(k1, (48, 4))
x = jax.random.normal(k2, (6, 48))
critic = lambda y: jnp.sum(jnp.tanh(y @ w), axis=1)
naive = float(fastgp.naive_gradient_penalty(critic, x))
q = jax.random.normal(k3, (2, 32, 2, 16))
naive_o = fastgp.naive_attention(q, q, q, is_causal=True)
out["penalty"], out["attention"], out["errors"] = {}, {}, {}
for backend in ("auto", "xla", "interpret", "tpu-interpret"):
    value = float(fastgp.gradient_penalty(critic, x, backend=backend))
    out["penalty"][backend] = abs(value - naive) / naive
for backend in ("auto", "xla", "interpret"):
    o = fastgp.attention(q, q, q, is_causal=True, backend=backend)
    out["attention"][backend] = float(jnp.max(jnp.abs(o - naive_o)) / jnp.max(jnp.abs(naive_o)))

def error(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None

out["errors"]["penalty gpu-interpret"] = error(
    lambda: fastgp.gradient_penalty(critic, x, backend="gpu-interpret")
)
out["errors"]["attention gpu-interpret"] = error(
    lambda: fastgp.attention(q, q, q, backend="gpu-interpret")
)

def export(fn, *args):
    with for_gpu():
        return jax.export.export(jax.jit(fn), platforms=["cuda"])(*args).mlir_module()

s = jax.ShapeDtypeStruct((2, 64, 2, 16), jnp.bfloat16)
with warnings.catch_warnings(record=True) as log:
    warnings.simplefilter("always")
    texts = [export(lambda q: fastgp.attention(q, q, q, backend="auto"), s),
             export(lambda q: fastgp.attention(q, q, q, is_causal=True, backend="auto"), s)]
out["auto warnings"] = [str(w.message) for w in log if "fastgp" in str(w.message)]
out["auto kernel calls"] = sum(t.count("fastgp_attention") for t in texts)
out["errors"]["attention pallas"] = error(
    lambda: export(lambda q: fastgp.attention(q, q, q, backend="pallas"), s)
)
g = jax.ShapeDtypeStruct((8, 300), jnp.float32)
norms = lambda g: fastgp.grad_norms(g, backend="pallas")
out["penalty pallas on an H100"] = error(lambda: out.__setitem__("h100", export(norms, g)))
mosaic = "mosaic_gpu_v2" in out.pop("h100", "")
out["penalty kernel on an H100"] = "mosaic_gpu_v2" if mosaic else None

class A100:
    platform, device_kind, compute_capability = "gpu", "NVIDIA A100-SXM4-80GB", "8.0"

backends.traced_device = lambda: A100()
jax.clear_caches()  # the program traced for the H100 is not reused
out["errors"]["penalty pallas on an A100"] = error(lambda: export(norms, g))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def without_triton(child_env):
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRITON],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_without_triton_fastgp_imports_and_runs_on_cpu(without_triton):
    """Against the naive penalty and naive attention (float32: 1e-5)."""
    assert not without_triton["has_triton"]
    assert set(without_triton["penalty"]) == {"auto", "xla", "interpret", "tpu-interpret"}
    assert all(err < 1e-5 for err in without_triton["penalty"].values()), without_triton
    assert set(without_triton["attention"]) == {"auto", "xla", "interpret"}
    assert all(err < 1e-5 for err in without_triton["attention"].values()), without_triton


def test_without_triton_auto_on_a_gpu_runs_xla_and_says_so_once(without_triton):
    assert without_triton["auto kernel calls"] == 0
    [note] = without_triton["auto warnings"]
    assert "backend='auto' runs XLA" in note and "jax.experimental.pallas.triton" in note


@pytest.mark.parametrize(
    "case", ["attention pallas", "penalty gpu-interpret", "attention gpu-interpret"]
)
def test_without_triton_the_kernel_backends_name_what_is_missing(without_triton, case):
    message = without_triton["errors"][case]
    assert message is not None, case
    assert "jax.experimental.pallas.triton does not import" in message
    assert "or a JAX that still ships jax.experimental.pallas.triton" in message
    way_out = "'xla'" if case.endswith("pallas") else "'tpu-interpret'"
    assert way_out in message


def test_without_triton_the_penalty_runs_mosaic_gpu_on_hopper_and_refuses_older_gpus(
    without_triton,
):
    if without_triton["has_mosaic_gpu"]:
        assert without_triton["penalty pallas on an H100"] is None
        assert without_triton["penalty kernel on an H100"] == "mosaic_gpu_v2"
    else:
        assert "Triton" in without_triton["penalty pallas on an H100"]
    message = without_triton["errors"]["penalty pallas on an A100"]
    assert "Hopper or newer" in message and "jax.experimental.pallas.triton" in message


@pytest.mark.parametrize("kind, platform", [("NVIDIA H100", "cuda"), ("gfx942", "rocm")])
def test_an_abstract_gpu_is_the_platform_traced_for(kind, platform):
    """Traced for an abstract GPU (no client to ask its stack): named by its kind, as JAX's GPU
    lowerings name it; attention's "auto" then chooses as on that GPU."""
    device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=8, platform="gpu")
    kernels = backends.AUTO["attention"].get(platform, "xla") if pallas_gpu.has_triton() else "xla"
    assert backends.platform() == "cpu"
    with for_gpu(device=device):
        assert backends.platform() == platform
        assert backends.resolve("attention", "auto") == kernels
        assert backends.resolve("penalty", "auto") == "xla"


def test_auto_falls_back_once_per_process(monkeypatch):
    """In this process: with Triton reported missing and the platform a GPU, "auto" resolves to
    XLA with one warning however often it is resolved; an explicit backend is kept."""
    monkeypatch.setattr(pallas_gpu, "has_triton", lambda: False)
    monkeypatch.setattr(backends, "platform", lambda: "cuda")
    pallas_gpu.note_auto_without_triton.cache_clear()
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        chosen = [backends.resolve("attention", "auto") for _ in range(3)]
        assert backends.resolve("attention", "pallas") == "pallas"
    pallas_gpu.note_auto_without_triton.cache_clear()
    assert chosen == ["xla"] * 3
    assert [type(w.message) for w in log] == [UserWarning]
    monkeypatch.setattr(pallas_gpu, "has_triton", lambda: True)
    assert backends.resolve("attention", "auto") == "pallas"


def test_the_mosaic_gpu_kernel_is_refused_by_name_on_a_jax_without_its_api(monkeypatch):
    monkeypatch.setattr(pallas_gpu, "has_mosaic_gpu", lambda: False)
    with pytest.raises(ValueError, match=r"Mosaic GPU kernel needs.*JAX 0\.11 or later"):
        pallas_gpu.mosaic_penalty()


def _user_triton_kernel(x):
    """A Triton kernel of the caller's own, beside fastgp's."""
    from jax.experimental.pallas import triton as plgpu

    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    return pl.pallas_call(
        double,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=plgpu.CompilerParams(),
    )(x)


@pytest.mark.skipif(not pallas_gpu.has_triton(), reason="this JAX ships no Pallas Triton")
def test_jax_triton_deprecation_is_shown_once_and_no_other_warning_is_hidden(monkeypatch):
    """With every warning shown (as pytest shows them), lowering fastgp's Triton kernel three
    times and the caller's own once shows JAX's deprecation once where this JAX warns (0.11 and
    later; 0.10.2 does not), while another DeprecationWarning still shows at each call."""
    monkeypatch.setattr(pallas_gpu, "penalty_kernel", lambda device: "triton")
    x = jax.ShapeDtypeStruct((128,), jnp.float32)
    g = jax.ShapeDtypeStruct((8, 300), jnp.float32)
    with warnings.catch_warnings(record=True) as before:
        warnings.simplefilter("always")
        with for_gpu():
            for _ in range(2):
                jax.export.export(
                    jax.jit(_user_triton_kernel), platforms=["cuda"], disabled_checks=[TRITON]
                )(x)
    jax_warns = any(pallas_gpu.JAX_TRITON_DEPRECATION in str(w.message) for w in before)
    jax.clear_caches()
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        with for_gpu():
            for scale in (1.0, 2.0, 3.0):
                fn = lambda g, s=scale: penalty.grad_norms(g * s, backend="pallas")
                jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=[TRITON])(g)
            jax.export.export(
                jax.jit(_user_triton_kernel), platforms=["cuda"], disabled_checks=[TRITON]
            )(x)
        for _ in range(2):
            warnings.warn("another deprecation", DeprecationWarning, stacklevel=1)
    shown = [str(w.message) for w in log]
    deprecations = [m for m in shown if pallas_gpu.JAX_TRITON_DEPRECATION in m]
    jax.clear_caches()
    assert len(deprecations) == (1 if jax_warns else 0)
    assert shown.count("another deprecation") == 2
