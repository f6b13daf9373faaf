"""GPU probe: where a compilation's time goes, function by function. Runs an
``egraph-mirage`` command line under ``cProfile`` (in this process) and prints the functions
that take the most cumulative time among those whose qualified name matches a pattern
(default: the backend's stages, Inductor's compile, Triton's compile and the TTIR that
Inductor makes of a ``wrap_triton`` kernel to find what it writes, autotuning), with their
call counts, then the profile's top entries by cumulative time.

Usage, on the GPU machine from the repository root:
  python3 scripts/gpu_probes/compile_profile.py OUT.prof TOP -- EGRAPH_MIRAGE_ARGS...
e.g. (the cache of an earlier run of the same model, so that no search runs):
  python3 scripts/gpu_probes/compile_profile.py /tmp/c.prof 40 -- bench generate --models llama \
    --layers 8 --batch 1 --modes egraph_mirage --new-tokens 1 --repeats 1 --budget 120 \
    --cache-dir /tmp/em_work/cache --timing graph
"""
from __future__ import annotations

import cProfile
import pstats
import re
import sys

PATTERNS = (r"fx/backend.py:\d+\(_", r"fx/whole.py", r"compile_fx", r"generate_ttir",
            r"identify_accessed_tensors", r"triton/compiler/compiler.py:\d+\(compile\)",
            r"autotune", r"benchmark", r"time_graphs", r"time_inductor", r"time_against",
            r"make_inductor_launch", r"make_runner", r"partition", r"superoptimize")


def main(argv: list[str]) -> int:
    out, top = argv[0], int(argv[1])
    args = argv[argv.index("--") + 1:]
    from egraph_mirage.cli import main as cli

    profile = cProfile.Profile()
    rc = profile.runcall(cli, args)
    profile.dump_stats(out)
    stats = pstats.Stats(out)
    rows = []
    for (path, line, name), (_cc, calls, _tt, cum, _callers) in stats.stats.items():
        where = f"{path}:{line}({name})"
        if any(re.search(p, where) for p in PATTERNS):
            rows.append((cum, calls, where))
    print(f"\n{'cum s':>9} {'calls':>7}  function (matching {len(PATTERNS)} patterns)")
    for cum, calls, where in sorted(rows, reverse=True)[:top]:
        print(f"{cum:9.1f} {calls:7d}  {where[-110:]}")
    print()
    stats.sort_stats("cumulative").print_stats(top)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
