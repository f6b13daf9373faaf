#!/usr/bin/env bash
# One device call: `bench torch` (a Llama decoder layer's decode step through eager,
# torch.compile default and max-autotune, and the egraph_mirage backend) at the given batch
# sizes (each batch's rows are written as soon as they are measured), then with AGAIN set, the
# backend once more at the first batch from the same cache (a second compile searches nothing).
# On a host of several GPUs the batches run side by side, batch i on GPU i mod N (each GPU's
# batches one after another), the CPU cores shared out among their searches. Carry `.whl`
# (egglog 13.2 cp312 and its import deps: ../shared/notes/gpu.md).
# Usage: scripts/gpu_torch.sh OUT BUDGET BATCH...   (BUDGET: search seconds per piece)
# Environment: MODELS ("llama hf"), MODES (default all), PRESET (llama3_8b), TIMEOUT (s per batch,
# 420), TIMING (the backend's timing option, default both), CACHE (the backend's cache, default
# OUT/cache), AGAIN, GPUS (how many GPUs to use, default every one), FIRST_GPU (the first of them, 0),
# WORKERS (search processes per batch, default the cores shared out).
set -u
out=$1; budget=$2; shift 2
. "$(dirname "$0")/gpu_host.sh" "$out"
python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1
gpu_plan $#

one() {  # one batch on the GPU this subshell sees
  local b=$1
  timeout "${TIMEOUT:-420}" python3 -m egraph_mirage bench torch --batch "$b" \
    --models ${MODELS:-llama hf} ${MODES:+--modes $MODES} --preset "${PRESET:-llama3_8b}" \
    --budget "$budget" --workers "$workers" --cache-dir "${CACHE:-$out/cache}" \
    --timing "${TIMING:-both}" --out "$out/bench_torch_b$b.json" \
    > "$out/bench_torch_b$b.txt" 2> "$out/bench_torch_b$b.err"
  echo "b=$b rc=$?"; tail -4 "$out/bench_torch_b$b.err"
}

gpu_spread "$@"
for b in "$@"; do cat "$out/bench_torch_b$b.txt"; done
[ -z "${AGAIN:-}" ] && exit 0
b=$1
timeout 300 python3 -m egraph_mirage bench torch --batch "$b" --models ${MODELS:-llama hf} \
  --preset "${PRESET:-llama3_8b}" --modes egraph_mirage --budget "$budget" \
  --workers "$(( $(nproc) - 1 ))" --cache-dir "${CACHE:-$out/cache}" --timing "${TIMING:-both}" --out "$out/bench_torch_again_b$b.json" \
  > "$out/bench_torch_again_b$b.txt" 2> "$out/bench_torch_again_b$b.err"
echo "again b=$b rc=$?"; cat "$out/bench_torch_again_b$b.txt"
