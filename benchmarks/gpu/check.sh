#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and JAX with CUDA already installed (no network needed):
# the GPU kernels' correctness on the device (the penalty's and attention's), the kernels' launch
# settings swept (gpu_tuned.json, installed for the later stages), the penalty kernel's bandwidth
# against a device-to-device copy and the XLA path, attention's reverse-over-reverse step beside
# its peers (FLASHBACK=MODULE:FUNCTION adds flashback's, built there; see benchmarks/gpu/peers.py),
# then the long ViT critic's penalty steps through each attention (time, peak memory, largest
# batch). Under 10 minutes on one H200:
# every stage has its own time limit, and a stage that fails or runs out of time does not stop
# the next. Results and each stage's log land in ${OUT:-benchmarks/results/gpu}; the exit status
# is 1 when any stage failed.
#
#   benchmarks/gpu/check.sh              # on the GPU machine
#   benchmarks/gpu/check.sh --capacity   # there: only the largest batches, with 8 minutes of its own
#   benchmarks/gpu/check.sh --smoke      # here, on CPU: the script itself, not the figures
#
# fastgp is imported as installed, with kernels/ as fastgp.kernels (pyproject's package-dir),
# through a tree of links in a temporary directory, so no build backend is needed. python -P keeps
# the source tree's fastgp/ (which lacks fastgp.kernels) off the path, and pytest's pythonpath is
# emptied for the same reason; benchmarks/ is found through PYTHONPATH after it.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results/gpu}"
python="${PYTHON:-python3}"
smoke=()
platform=cuda
mode="${1:-}"
case "$mode" in
    "" | --capacity) ;;
    --smoke)
        smoke=(--smoke)
        platform=cpu
        ;;
    *)
        echo "usage: $0 [--capacity | --smoke]" >&2
        exit 2
        ;;
esac
# tests/conftest.py makes CPU the default platform unless one is named.
export JAX_PLATFORMS="${JAX_PLATFORMS:-$platform}"
mkdir -p "$out"
site="$(mktemp -d)"
mkdir "$site/fastgp"
ln -s "$PWD"/fastgp/* "$site/fastgp/"
ln -s "$PWD/kernels" "$site/fastgp/kernels"
export PYTHONPATH="$site:$PWD"
export PYTHONUNBUFFERED=1

failed=()
# stage NAME SECONDS COMMAND...: runs COMMAND under a time limit, its output to NAME.log too.
stage() {
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "== $name (limit ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$out/$name.log"
    [[ $rc == 0 ]] || failed+=("$name")
}

stage gpu_devices 30 "$python" -P -c \
    "import jax; print('JAX', jax.__version__, jax.devices()); print(jax.devices()[0].memory_stats())"
if [[ "$mode" == --capacity ]]; then
    stage attention_gpu_capacity 540 "$python" -P -m benchmarks.gpu.attention --capacity-only \
        --budget-s 480 --out "$out/attention_gpu_capacity"
else
    stage gpu_tests 120 "$python" -P -m pytest -q -p no:cacheprovider -o addopts="-ra" \
        -o pythonpath="" --rootdir=. \
        tests/penalty/test_gpu_device.py tests/attention/test_attention_gpu_device.py
    stage gpu_sweep 150 "$python" -P -m benchmarks.gpu.sweep "${smoke[@]}" --budget-s 120 \
        --out "$out"
    if [[ -s "$out/gpu_tuned.json" ]]; then  # the later stages run the swept launches
        rm "$site/fastgp/tuned"
        mkdir "$site/fastgp/tuned"
        cp "$out/gpu_tuned.json" "$site/fastgp/tuned/gpu.json"
    fi
    if [[ ${#smoke[@]} -eq 0 ]]; then
        stage gpu_bandwidth 60 "$python" -P -m benchmarks.gpu.bandwidth \
            --out "$out/gpu_bandwidth.md"
    fi
    peers=(--out "$out/gpu_peers")
    [[ -n "${FLASHBACK:-}" ]] && peers+=(--flashback "$FLASHBACK")
    stage gpu_peers 60 "$python" -P -m benchmarks.gpu.peers "${smoke[@]}" --budget-s 45 \
        "${peers[@]}"
    stage attention_gpu_run 180 "$python" -P -m benchmarks.gpu.attention "${smoke[@]}" \
        --budget-s 150 --out "$out/attention_gpu"
fi

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
echo "every stage passed"
