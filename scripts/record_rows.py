"""Record a GPU run's rows in a rows file of docs/results/, then regenerate the tables.

The rows a bench command wrote (``bench torch --out``: a JSON list; ``bench generate --out``:
JSON lines) take the place of the file's rows of the same group: the same key
(``results_tables.KEYS``) but for the mode, so that a run's modes replace every mode of the
earlier run, none left behind from another commit. The rows they replace go to
``docs/results/archive.json`` under the family (``torch``, ``generate``, ...). Each new row
gets its provenance: ``commit``, ``origin`` (the command that measured it, and where),
``recorded_in`` and ``recorded_on``.

Usage, from the repository root:
  python3 scripts/record_rows.py torch_h200 OUT/bench_torch_b1.json --commit 143d0fc \
      --origin "MODELS=... bash scripts/gpu_torch.sh OUT 120 1 (one H200 ...)" \
      --recorded-in "session of ... (issue 35)"
then ``python3 scripts/results_tables.py`` rewrites the tables (this script does it last).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_tables as rt

Row = dict[str, Any]


def read_rows(path: Path) -> list[Row]:
    """The rows of a bench command's output: a JSON list or JSON lines."""
    text = path.read_text()
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(rows, dict):
        rows = [rows]
    if not all(isinstance(r, dict) for r in rows):
        raise SystemExit(f"record_rows: {path}: not a list of rows")
    return rows


def group(family: str, row: Row) -> tuple[Any, ...]:
    """A row's key without its mode: the rows one run measured together."""
    return tuple(row.get(k) for k in rt.KEYS[family] if k != "mode")


def record(stem: str, new: list[Row], provenance: Row) -> tuple[int, int]:
    """``new`` in the rows file ``stem`` in place of its rows of the same groups; returns how
    many rows were written and how many archived."""
    family = stem.split("_")[0]
    if family not in rt.KEYS:
        raise SystemExit(f"record_rows: {stem}: no family of {', '.join(rt.KEYS)}")
    path = rt.RESULTS / f"{stem}.json"
    rows: list[Row] = json.loads(path.read_text()) if path.exists() else []
    groups = {group(family, r) for r in new}
    kept = [r for r in rows if group(family, r) not in groups]
    replaced = [r for r in rows if group(family, r) in groups]
    for r in new:
        r.update(provenance)
    archive_path = rt.RESULTS / "archive.json"
    archive = json.loads(archive_path.read_text())
    archive.setdefault(family, []).extend(replaced)
    path.write_text(json.dumps(kept + new, indent=1, ensure_ascii=False) + "\n")
    archive_path.write_text(json.dumps(archive, indent=1, ensure_ascii=False) + "\n")
    return len(new), len(replaced)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stem", help="the rows file's stem in docs/results/ (torch_h200, ...)")
    p.add_argument("rows", nargs="+", type=Path, help="the bench command's output files")
    p.add_argument("--commit", required=True)
    p.add_argument("--origin", required=True, help="the command that measured them, and where")
    p.add_argument("--recorded-in", required=True)
    args = p.parse_args(argv)
    new = [r for path in args.rows for r in read_rows(path)]
    provenance = {"commit": args.commit, "origin": args.origin,
                  "recorded_in": args.recorded_in,
                  "recorded_on": datetime.date.today().isoformat()}
    written, archived = record(args.stem, new, provenance)
    print(f"{args.stem}: {written} row(s) written, {archived} archived")
    return rt.main([])


if __name__ == "__main__":
    sys.exit(main())
