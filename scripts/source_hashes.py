"""Hashes of the Triton source generated for every hand-written variant of the benchmark
programs at b = 1, 8 and 16, at every setting of ``fuse_combines``, ``swap_dots`` and ``pdl`` that
the checked-out lowering knows: run it at two commits and compare the JSON to show that a change
leaves the generated code alone (``docs/benchmarks.md``, "Probes and tools", names the last commits
compared).

Usage, from the repository root of each checkout:
  PYTHONPATH=. python3 scripts/source_hashes.py [PROGRAM ...] > hashes.json
(default: every benchmark program). Keys: ``program|batch|variant|fuse_combines|swap_dots``,
with ``|pdl`` appended where pdl is on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import sys

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.lower import LowerOptions
from egraph_mirage.lower.triton_program import generate_source


def main(names: list[str]) -> dict[str, str]:
    knobs = {f.name for f in dataclasses.fields(LowerOptions)} & {"fuse_combines", "swap_dots",
                                                                  "pdl"}
    out = {}
    for name in names or em.benchmarks.names():
        for b in (1, 8, 16):
            g = em.benchmarks.get(name, b)
            for i, v in enumerate(fixtures.variants(name, g)):
                for fuse, swap, pdl in itertools.product((False, True), repeat=3):
                    opts = {"fuse_combines": fuse, "swap_dots": swap, "pdl": pdl}
                    if any(v and k not in knobs for k, v in opts.items()):
                        continue
                    src = generate_source(v, LowerOptions(**{k: v for k, v in opts.items()
                                                             if k in knobs}))
                    key = f"{name}|{b}|{i}|{fuse}|{swap}" + ("|pdl" if pdl else "")
                    out[key] = hashlib.sha256(src.encode()).hexdigest()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=0, sort_keys=True))
