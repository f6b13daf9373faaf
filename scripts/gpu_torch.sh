#!/usr/bin/env bash
# One device call: `bench torch` (a decoder layer's decode step through eager, torch.compile
# default and max-autotune, and the egraph_mirage backend) at the given batch sizes, each batch's
# rows written to OUT/bench_torch_b<B>.json as soon as each model and dtype is measured (a run
# cut short by TIMEOUT keeps them; the logs gathered in OUT/logs.txt, the rest in WORK), the
# table of every row printed last; then with AGAIN set, the backend once more at the first batch
# from the same cache (a second compile searches nothing). On a host of several GPUs the batches run side by side, batch i on GPU i mod N (each
# GPU's batches one after another), the CPU cores shared out among their searches. Carry `.whl`
# (egglog 13.2 cp312 and its import deps: ../shared/notes/gpu.md).
# Usage: scripts/gpu_torch.sh OUT BUDGET BATCH...   (BUDGET: search seconds per compilation,
# its pieces sharing them)
# Environment: MODELS ("llama hf"; also hf-qwen3, hf-static, hf-qwen3-static), DTYPES (float16;
# a comma-separated list gives rows per dtype), MODES (default: all but max-autotune-timed), PRESET (llama3_8b), ROUNDS
# (timing rounds, default 5), TIMEOUT (s per batch, 420), TIMING (the backend's timing option,
# default both), CACHE (the backend's cache, default WORK/cache: outside OUT, whose files a
# device call brings back, at most 8), AGAIN, GPUS (how many GPUs to use,
# default every one), FIRST_GPU (the first of them, 0), WORKERS (search processes per batch,
# default the cores shared out), EXTRA (more `bench torch` options, e.g. "--kv-len 8192").
#
# transformers' Llama and Qwen3 layers at b = 1, fp16 and bf16, with the backend, in one call
# of one GPU (expected ≈ 7–8 min: ≈ 1 min to start and install the wheels, then per model and
# dtype ≈ 5 s of `compile`, the backend's 60 s of search plus ≈ 30–45 s of timing its winners
# against Inductor and compiling, and ≈ 15 s of 3 timing rounds; fp16 first, so that a run cut
# at TIMEOUT keeps both models' fp16 rows):
#   MODELS="hf hf-qwen3" DTYPES=float16,bfloat16 MODES="eager compile egraph_mirage" ROUNDS=3 \
#     TIMEOUT=530 bash scripts/gpu_torch.sh "$OUT" 60 1
set -u
out=$1; budget=$2; shift 2
. "$(dirname "$0")/gpu_host.sh" "$out"
python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1
gpu_plan $#

one() {  # one batch on the GPU this subshell sees
  local b=$1
  timeout "${TIMEOUT:-420}" python3 -m egraph_mirage bench torch --batch "$b" \
    --models ${MODELS:-llama hf} ${MODES:+--modes $MODES} --preset "${PRESET:-llama3_8b}" \
    --dtype "${DTYPES:-float16}" ${ROUNDS:+--rounds $ROUNDS} \
    --budget "$budget" --workers "$workers" --cache-dir "${CACHE:-$work/cache}" \
    --timing "${TIMING:-both}" --out "$out/bench_torch_b$b.json" $host_lock ${EXTRA:-} \
    > "$work/bench_torch_b$b.txt" 2> "$work/bench_torch_b$b.err"
  echo "b=$b rc=$?"; grep -v '^{' "$work/bench_torch_b$b.err" | tail -4
}

gpu_spread "$@"
if [ -n "${AGAIN:-}" ]; then
  b=$1
  timeout 300 python3 -m egraph_mirage bench torch --batch "$b" --models ${MODELS:-llama hf} \
    --preset "${PRESET:-llama3_8b}" --dtype "${DTYPES:-float16}" --modes egraph_mirage \
    --budget "$budget" --workers "$(( $(nproc) - 1 ))" --cache-dir "${CACHE:-$work/cache}" \
    --timing "${TIMING:-both}" --out "$out/bench_torch_again_b$b.json" $host_lock ${EXTRA:-} \
    > "$work/bench_torch_again_b$b.txt" 2> "$work/bench_torch_again_b$b.err"
  echo "again b=$b rc=$?"; cat "$work/bench_torch_again_b$b.txt"
fi
# last: one table of every row written, finished or cut short
files=(); for b in "$@"; do files+=("$out/bench_torch_b$b.json"); done
python3 -m egraph_mirage bench torch --table-of "${files[@]}"
# the logs in one file of OUT (a device call brings back at most 8 files)
gpu_bring_back logs.txt "$work"/bench_torch_*.txt "$work"/bench_torch_*.err
