#!/usr/bin/env bash
# One device call: search the given programs at paper shapes on the GPU host's CPU cores, then
# time the search's results (each with its size variants) against the baselines and the
# hand-written reference on its GPU. Carry `.whl` (egglog 13.2 cp312 and its import deps:
# ../shared/notes/gpu.md). Usage: scripts/gpu_discovery.sh OUT BUDGET PROGRAM...
set -u
out=$1; budget=$2; shift 2
export JAX_PLATFORMS=cpu
pip install -q --no-deps --target /tmp/egg .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/egg:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
timeout $(( budget * $# + 90 )) python3 -m egraph_mirage bench search --programs "$@" \
  --budget "$budget" --workers 15 --out "$out/search" > "$out/search.txt" 2>&1
tail -15 "$out/search.txt"
timeout 400 python3 -m egraph_mirage bench gpu --batch 1 --programs "$@" \
  --mugraph-dir "$out/search" --max-candidates "${MAX_CANDIDATES:-8}" --size-variants "${SIZE_VARIANTS:-4}" --tune-top 3 \
  --markdown "$out/gpu.md" --json > "$out/gpu_rows.json" 2> "$out/gpu.err"
tail -5 "$out/gpu.err"
python3 -m egraph_mirage.bench.gpu_report "$out/gpu_rows.json" 2>/dev/null || cat "$out/gpu.md"
