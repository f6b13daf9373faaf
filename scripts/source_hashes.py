"""Hashes of the Triton source generated for every hand-written variant of the benchmark
programs at b = 1, 8 and 16, at every setting of ``fuse_combines`` and ``swap_dots`` that the
checked-out lowering knows: run it at two commits and compare the JSON to show that a change
leaves the generated code alone (``docs/benchmarks.md`` says which commits were compared).

Usage, from the repository root of each checkout:
  PYTHONPATH=. python3 scripts/source_hashes.py [PROGRAM ...] > hashes.json
(default: every benchmark program). Keys: ``program|batch|variant|fuse_combines|swap_dots``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import sys

import egraph_mirage as em
from egraph_mirage.lower import LowerOptions
from egraph_mirage.lower.program import generate_source


def main(names: list[str]) -> dict[str, str]:
    has_swap = "swap_dots" in {f.name for f in dataclasses.fields(LowerOptions)}
    out = {}
    for name in names or em.benchmarks.names():
        for b in (1, 8, 16):
            g = em.benchmarks.get(name, b)
            for i, v in enumerate(em.handwritten.variants(name, g)):
                for fuse, swap in itertools.product((False, True), (False, True)):
                    if swap and not has_swap:
                        continue
                    opts = {"fuse_combines": fuse} | ({"swap_dots": swap} if swap else {})
                    src = generate_source(v, LowerOptions(**opts))
                    out[f"{name}|{b}|{i}|{fuse}|{swap}"] = hashlib.sha256(src.encode()).hexdigest()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=0, sort_keys=True))
