# Sourced by the device-call scripts (gpu_discovery.sh, gpu_torch.sh) with OUT as its argument:
# egglog and its import deps from the carried `.whl/` (../shared/notes/gpu.md) on the path for
# the search, JAX on the CPU, OUT made, and the GPU's name written to OUT/device.txt.
export JAX_PLATFORMS=cpu
# once per machine: scripts started side by side must not install over each other
[ -d /tmp/egg/egglog ] || pip install -q --no-deps --target /tmp/egg .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/egg:$PWD
mkdir -p "$1"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$1/device.txt"
