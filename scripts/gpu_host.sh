# Sourced by the device-call scripts (gpu_discovery.sh, gpu_torch.sh, gpu_generate.sh) with OUT as
# its argument: egglog and its import deps from the carried `.whl/` (../shared/notes/gpu.md) on
# the path for the search, JAX on the CPU, OUT made, and the GPU's name written to OUT/device.txt;
# `work`, the folder for everything else a script writes (logs, caches, search folders: WORK,
# default OUT/../em_work), since a device call brings back only a few files of OUT (at most 8);
# then gpu_plan and gpu_spread, which spread a script's items over the host's GPUs, and
# gpu_bring_back, which gathers logs into one file of OUT.
export JAX_PLATFORMS=cpu
# once per machine: scripts started side by side must not install over each other
[ -d /tmp/egg/egglog ] || pip install -q --no-deps --target /tmp/egg .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/egg:$PWD
mkdir -p "$1"
work=${WORK:-$(dirname "$1")/em_work}
mkdir -p "$work"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$1/device.txt"

# gpu_bring_back NAME FILE...: the FILEs that exist, each under a line naming it, in OUT/NAME
gpu_bring_back() {
  local name=$1 f; shift
  for f in "$@"; do
    [ -f "$f" ] && { echo "== $(basename "$f")"; cat "$f"; }
  done > "$out/$name"
}

# gpu_plan N: how many GPUs N items are spread over (`gpus`: GPUS or every GPU, at most N) and
# how many search processes each item gets (`workers`: WORKERS, or the GPU's share of the host's
# cores less one; on a host of one GPU, every core less one); on a host of several GPUs,
# `host_lock`: the bench commands' --host-lock option (HOST_LOCK, default one file in /tmp for
# every script of the host: each compiles holding it shared and times holding it alone, so
# that no plain launches are timed beside another GPU's compilation; bench.host_lock).
gpu_plan() {
  host_gpus=$(nvidia-smi -L | wc -l)
  host_lock=""
  (( host_gpus > 1 )) && host_lock="--host-lock ${HOST_LOCK:-/tmp/egraph-mirage-bench.lock}"
  gpus=${GPUS:-$host_gpus}
  (( gpus > $1 )) && gpus=$1
  share=$(( $(nproc) / host_gpus ))
  (( host_gpus > 1 )) && workers=${WORKERS:-$(( share - 1 ))} || workers=${WORKERS:-$(( $(nproc) - 1 ))}
  (( workers < 1 )) && workers=1
}

# gpu_spread ITEM...: item i on GPU FIRST_GPU + i mod gpus (`one ITEM SLOT`, a function of the
# calling script), each GPU's items one after another, the GPUs side by side; on a host of several
# GPUs each one's work is pinned to its share of the host's cores, so that host-bound plain launches
# on one GPU do not wait on the searches and compilations of another. Returns when all are done.
gpu_spread() {
  local items=("$@") g i first
  for (( g = 0; g < gpus; g++ )); do
    (
      export CUDA_VISIBLE_DEVICES=$(( ${FIRST_GPU:-0} + g ))
      first=$(( (${FIRST_GPU:-0} + g) * share ))
      (( host_gpus > 1 && share > 0 )) && taskset -pc "$first-$(( first + share - 1 ))" $BASHPID >/dev/null
      for (( i = g; i < ${#items[@]}; i += gpus )); do one "${items[$i]}" "$g"; done
    ) &
  done
  wait
}
