#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and JAX with CUDA already installed (no network needed):
# the GPU kernels' correctness on the device, then their bandwidth against a device-to-device
# copy and the XLA path. Takes a few minutes. Results land in ${OUT:-benchmarks/results}.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
site="$(mktemp -d)"
python3 -m pip install --quiet --no-deps --no-build-isolation --target "$site" .
export PYTHONPATH="$site"
python3 -c "import jax; print(jax.__version__, jax.devices())"
python3 -m pytest -q -p no:cacheprovider -o addopts="" --rootdir=. \
    tests/test_gpu_device.py tests/test_gpu_kernels.py 2>&1 | tee "$out/gpu_tests.log"
python3 benchmarks/gpu_bandwidth.py --out "$out/gpu_bandwidth.md"
