#!/usr/bin/env bash
# One device call: search the given programs at paper shapes on the GPU host's CPU cores, then
# time the search's results (each with its size variants) against the baselines and the
# hand-written reference on its GPU (each program's rows are written as soon as they are
# measured). On a host of several GPUs the programs are spread over them: program i runs on GPU
# i mod N, each GPU's programs one after another, the GPUs side by side, the CPU cores shared out
# among the searches running at once. Carry `.whl` (egglog 13.2 cp312 and its import deps:
# ../shared/notes/gpu.md). OUT gets what a device call brings back: rows.json (every row),
# reports.md, search_logs.txt, gpu_logs.txt and device.txt; the searches' folders, tuning caches
# and per-program files stay in the work folder (WORK, default OUT/../em_work).
# Usage: scripts/gpu_discovery.sh OUT BUDGET PROGRAM...
# Environment: MAX_CANDIDATES (8), SIZE_VARIANTS (4), TUNE_TOP (3), BATCHES ("1"), GPU_TIMEOUT (s per program,
# 240), EXTRA_RULES (rule files or folders loaded after the shipped rules, e.g.
# rules/optional/online_softmax.egg), NO_REFERENCE (set: leave out the hand-written reference),
# MAX_AUTOTUNE (set: torch.compile in max-autotune mode as a second compiled baseline), GPUS (how
# many GPUs to use, default every one), FIRST_GPU (the first of them, 0), WORKERS (search
# processes per program, default the cores shared out), DTYPE (float16 or bfloat16, default
# float16: passed as --dtype to both commands; a bfloat16 search is written to
# WORK/search/<name>_b<B>_bf16/, and the rows record their dtype).
set -u
out=$1; budget=$2; shift 2
. "$(dirname "$0")/gpu_host.sh" "$out"
extra=()
[ -n "${EXTRA_RULES:-}" ] && extra=(--extra-rules $EXTRA_RULES)
gpu_plan $#
# one search at the first batch serves every batch: bench gpu retargets its structures
b=$(echo ${BATCHES:-1} | cut -d' ' -f1)

one() {  # one program on GPU $2: its search, then its timings (in the work folder)
  local p=$1
  timeout $(( budget + 90 )) python3 -m egraph_mirage bench search --programs "$p" \
    --batch "$b" --budget "$budget" --workers "$workers" --out "$work/search" --progress "${extra[@]}" \
    --dtype "${DTYPE:-float16}" \
    > "$work/search_$p.txt" 2>&1
  tail -1 "$work/search_$p.txt"
  timeout "${GPU_TIMEOUT:-240}" python3 -m egraph_mirage bench gpu --batch ${BATCHES:-1} \
    --programs "$p" --mugraph-dir "$work/search" --max-candidates "${MAX_CANDIDATES:-8}" \
    --size-variants "${SIZE_VARIANTS:-4}" --tune-top "${TUNE_TOP:-3}" --dtype "${DTYPE:-float16}" \
    ${NO_REFERENCE:+--no-reference} ${MAX_AUTOTUNE:+--max-autotune} \
    --cache-dir "$work/tune_cache_$2" --markdown "$work/gpu_$p.md" --rows "$work/rows_$p.jsonl" \
    --json > "$work/gpu_rows_$p.json" 2> "$work/gpu_$p.err" || tail -3 "$work/gpu_$p.err"
}

gpu_spread "$@"
# what comes back (OUT holds 5 files): every row, the reports, the searches' and timings' logs
python3 - "$work" "$out" <<'PY'
import json, pathlib, sys
from egraph_mirage.bench.gpu_report import format_table
rows = []  # every row measured, also those of a bench gpu stopped by its timeout
for f in sorted(pathlib.Path(sys.argv[1]).glob("rows_*.jsonl")):
    rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
pathlib.Path(sys.argv[2], "rows.json").write_text(json.dumps(rows, indent=1))
print(format_table(rows))
PY
gpu_bring_back reports.md "$work"/gpu_*.md
gpu_bring_back search_logs.txt "$work"/search_*.txt
gpu_bring_back gpu_logs.txt "$work"/gpu_*.err
