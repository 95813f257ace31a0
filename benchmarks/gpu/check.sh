#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and JAX with CUDA already installed (no network needed):
# the GPU kernels' correctness on the device (the penalty's and attention's), the penalty kernel's
# bandwidth against a device-to-device copy and the XLA path, then the long ViT critic's penalty
# steps through each attention (time, peak memory, largest batch; stops at its 300 s budget).
# Under 8 minutes on one H200. Results land in ${OUT:-benchmarks/results/gpu}.
# fastgp is installed into a temporary directory and imported from there: python -P keeps the
# source tree's fastgp/ (which lacks fastgp.kernels) off the path, and pytest's pythonpath is
# emptied for the same reason; benchmarks/ is found through PYTHONPATH after it.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results/gpu}"
mkdir -p "$out"
site="$(mktemp -d)"
python3 -m pip install --quiet --no-deps --no-build-isolation --target "$site" .
export PYTHONPATH="$site"
python3 -P -c "import jax; print(jax.__version__, jax.devices())"
python3 -P -m pytest -q -p no:cacheprovider -o addopts="" -o pythonpath="" --rootdir=. \
    tests/penalty/test_gpu_device.py tests/penalty/test_gpu_kernels.py \
    tests/attention/test_attention_gpu_device.py 2>&1 | tee "$out/gpu_tests.log"
PYTHONPATH="$site:$PWD" python3 -P -m benchmarks.gpu.bandwidth --out "$out/gpu_bandwidth.md"
PYTHONPATH="$site:$PWD" python3 -P -m benchmarks.gpu.attention --out "$out/attention_gpu"
