#!/usr/bin/env bash
# One device call: `bench generate` (a whole transformers model's generate() with a static cache:
# decode tokens/s of eager, torch.compile with CUDA graphs in its default and max-autotune modes,
# and the egraph_mirage backend) at the given batch sizes, each batch's rows appended to
# OUT/bench_generate_b<B>.jsonl once its modes are measured (a run cut short by TIMEOUT keeps them),
# the table of every row printed last. With WARM_LAYERS set, each batch first compiles the backend
# on a model of that many layers into the same cache (2 cover every distinct piece: the first
# layer's, an interior one's, the last's), so that the measured model's identical layers are all
# found there and the search budget is not shared out over every layer's pieces. On a host of
# several GPUs the batches run side by side, batch i on GPU i mod N, the CPU cores shared out
# among their searches. Carry `.whl` (egglog 13.2 cp312 and its import deps:
# ../shared/notes/gpu.md).
# Usage: scripts/gpu_generate.sh OUT BUDGET BATCH...   (BUDGET: search seconds per compilation,
# its pieces sharing them, or "none" with MAX_TASKS)
# Environment: MODELS ("llama qwen3"; a call per model fits the time better), LAYERS (32), MODES
# (default eager compile max-autotune egraph_mirage), DTYPE (float16), NEW_TOKENS (128),
# PROMPT_LEN (128), MAX_CACHE_LEN (1024), REPEATS (3), MAX_TASKS, TIMING (the backend's timing
# option, default both), CACHE (the backend's cache, default WORK/cache), WARM_LAYERS, AGAIN (the
# backend compiled a second time from the cache: --again), TIMEOUT (s per batch, 540), GPUS,
# FIRST_GPU, WORKERS (as in gpu_torch.sh), EXTRA (more `bench generate` options). The backend's
# log (`--log info`: each compile stage as it ends, each compilation's report) is in logs.txt.
#
# An 8-layer model of Llama-3-8B's layer sizes at b = 1 on one H200 (the rows of
# docs/results/generate_h200.json; ~5 min: ~1 min per compiled mode, the backend's 150 s of
# search; TIMING=graph: a decode loop under CUDA graphs):
#   MODELS=llama LAYERS=8 TIMING=graph NEW_TOKENS=64 REPEATS=2 TIMEOUT=560 \
#     bash scripts/gpu_generate.sh "$OUT" 150 1
# 32 layers, b = 1 and 8 on two GPUs (compiling 32 layers takes minutes in each mode,
# max-autotune's most; not yet timed on a lent host):
#   MODELS=llama WARM_LAYERS=2 AGAIN=1 TIMEOUT=570 bash scripts/gpu_generate.sh "$OUT" 120 1 8
set -u
out=$1; budget=$2; shift 2
. "$(dirname "$0")/gpu_host.sh" "$out"
python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1
gpu_plan $#

common() {  # the options every run of one batch shares
  echo --dtype "${DTYPE:-float16}" --prompt-len "${PROMPT_LEN:-128}" \
    --max-cache-len "${MAX_CACHE_LEN:-1024}" --budget "$budget" ${MAX_TASKS:+--max-tasks $MAX_TASKS} \
    --workers "$workers" --cache-dir "${CACHE:-$work/cache}" --timing "${TIMING:-both}" $host_lock ${EXTRA:-}
}

one() {  # one batch on the GPU this subshell sees
  local b=$1 models=${MODELS:-llama qwen3}
  if [ -n "${WARM_LAYERS:-}" ]; then
    timeout "${TIMEOUT:-540}" python3 -m egraph_mirage --log info bench generate --batch "$b" \
      --models $models --layers "$WARM_LAYERS" --modes egraph_mirage --new-tokens 1 --repeats 1 \
      $(common) --out "$work/bench_generate_warm_b$b.jsonl" \
      > "$work/bench_generate_warm_b$b.txt" 2> "$work/bench_generate_warm_b$b.err"
    echo "warm b=$b rc=$?"; grep -v 'egraph-mirage' "$work/bench_generate_warm_b$b.err" | tail -3
  fi
  timeout "${TIMEOUT:-540}" python3 -m egraph_mirage --log info bench generate --batch "$b" \
    --models $models --layers "${LAYERS:-32}" ${MODES:+--modes $MODES} \
    --new-tokens "${NEW_TOKENS:-128}" --repeats "${REPEATS:-3}" ${AGAIN:+--again} $(common) \
    --out "$out/bench_generate_b$b.jsonl" \
    > "$work/bench_generate_b$b.txt" 2> "$work/bench_generate_b$b.err"
  echo "b=$b rc=$?"; grep -v 'egraph-mirage' "$work/bench_generate_b$b.err" | tail -4
  grep 'time:' "$work/bench_generate_b$b.err" | tail -3  # where each compilation's time went
}

gpu_spread "$@"
# last: one table of every row written, finished or cut short
files=(); for b in "$@"; do files+=("$out/bench_generate_b$b.jsonl"); done
python3 -m egraph_mirage bench generate --table-of "${files[@]}"
# the logs in one file of OUT (a device call brings back at most 8): warm-ups, runs, errors
gpu_bring_back logs.txt "$work"/bench_generate_*.txt "$work"/bench_generate_*.err
