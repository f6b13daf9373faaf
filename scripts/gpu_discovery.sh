#!/usr/bin/env bash
# One device call: search the given programs at paper shapes on the GPU host's CPU cores, then
# time the search's results (each with its size variants) against the baselines and the
# hand-written reference on its GPU, one program at a time (each program's rows are written as
# soon as they are measured). Carry `.whl` (egglog 13.2 cp312 and its import deps:
# ../shared/notes/gpu.md). Usage: scripts/gpu_discovery.sh OUT BUDGET PROGRAM...
# Environment: MAX_CANDIDATES (8), SIZE_VARIANTS (4), TUNE_TOP (3), BATCHES ("1"), GPU_TIMEOUT (s per program,
# 240), EXTRA_RULES (rule files or folders loaded after the shipped rules, e.g.
# rules/optional/online_softmax.egg), NO_REFERENCE (set: leave out the hand-written reference).
set -u
out=$1; budget=$2; shift 2
. "$(dirname "$0")/gpu_host.sh" "$out"
extra=()
[ -n "${EXTRA_RULES:-}" ] && extra=(--extra-rules $EXTRA_RULES)
# one search at the first batch serves every batch: bench gpu retargets its structures
b=$(echo ${BATCHES:-1} | cut -d' ' -f1)
timeout $(( budget * $# + 90 )) python3 -m egraph_mirage bench search --programs "$@" \
  --batch "$b" --budget "$budget" --workers 15 --out "$out/search" "${extra[@]}" \
  > "$out/search_b$b.txt" 2>&1
tail -$(( $# + 3 )) "$out/search_b$b.txt"
for p in "$@"; do
  timeout "${GPU_TIMEOUT:-240}" python3 -m egraph_mirage bench gpu --batch ${BATCHES:-1} \
    --programs "$p" --mugraph-dir "$out/search" --max-candidates "${MAX_CANDIDATES:-8}" \
    --size-variants "${SIZE_VARIANTS:-4}" --tune-top "${TUNE_TOP:-3}" ${NO_REFERENCE:+--no-reference} --markdown "$out/gpu_$p.md" --json \
    > "$out/gpu_rows_$p.json" 2> "$out/gpu_$p.err" || tail -3 "$out/gpu_$p.err"
done
python3 - "$out" <<'PY'
import json, pathlib, sys
from egraph_mirage.bench.gpu_report import format_table
rows = []
for f in sorted(pathlib.Path(sys.argv[1]).glob("gpu_rows_*.json")):
    try:
        rows += json.loads(f.read_text())
    except ValueError:
        print(f"{f.name}: no rows")
print(format_table(rows))
PY
