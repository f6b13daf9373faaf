"""The backend's disk cache (``fx.cache``): hits, misses, corrupt entries, keys that must miss,
concurrent writers in real processes, and a writer killed half-way."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

import egraph_mirage as em
from egraph_mirage.fx.cache import (
    FORMAT_VERSION,
    CacheError,
    CacheKey,
    CacheWarning,
    SearchCache,
    default_cache_dir,
)


def _key(program: Any = None, **kw: Any) -> CacheKey:
    g = program if program is not None else em.benchmarks.get("rmsnorm_linear", small=True)
    kw = {"rules": "r" * 64, "device": "cpu", "lowering": "l" * 16, **kw}
    return CacheKey.of(g, **kw)


RECORD = {"decision": "replace", "mugraph": '{"format": "egraph-mirage/mugraph"}',
          "num_kernels": 1, "grids": [[4, 1, 1]], "ours_us": None}


def test_miss_then_hit(tmp_path: Path) -> None:
    cache = SearchCache(tmp_path)
    key = _key()
    assert cache.get(key) is None
    path = cache.put(key, RECORD)
    assert path.parent.parent == tmp_path / "fx" and path.name == f"{key.digest()}.json"
    assert cache.get(key) == RECORD
    assert (cache.hits, cache.misses, cache.writes) == (1, 1, 1)
    assert SearchCache(tmp_path).get(key) == RECORD  # another object, the same files
    assert len(cache) == 1


def test_key_holds_operators_shapes_dtypes_and_program() -> None:
    key = _key()
    assert key.operators == ("rms_norm", "matmul")
    assert key.shapes == ((2, 64), (64, 96)) and key.dtypes == ("float16", "float16")
    assert key.program == em.to_json(em.benchmarks.get("rmsnorm_linear", small=True))
    assert key.version == FORMAT_VERSION
    assert _key().digest() == key.digest()  # deterministic


@pytest.mark.parametrize("change", [{"rules": "x" * 64}, {"device": "NVIDIA H100"},
                                    {"lowering": "0" * 16}, {"search": {"max_tasks": 3}}])
def test_other_rules_device_lowering_or_search_miss(tmp_path: Path,
                                                    change: dict[str, Any]) -> None:
    cache = SearchCache(tmp_path)
    cache.put(_key(), RECORD)
    assert cache.get(_key(**change)) is None
    assert cache.get(_key()) == RECORD


def test_a_key_made_by_another_search_misses(tmp_path: Path) -> None:
    """The key holds the search's fingerprint (the source of the search, its pipeline, the
    μGraphs, oracle and verifier): a decision cached by another version of the search (one
    that found nothing where this one reaches deeper) is a miss, not reused."""
    from dataclasses import replace

    from egraph_mirage.fx.cache import search_fingerprint

    cache = SearchCache(tmp_path)
    key = _key()
    assert key.code == search_fingerprint() and len(key.code) == 16
    cache.put(replace(key, code="0" * 16), RECORD)
    assert cache.get(key) is None
    cache.put(key, RECORD)
    assert cache.get(key) == RECORD


def test_other_program_or_shape_misses(tmp_path: Path) -> None:
    cache = SearchCache(tmp_path)
    cache.put(_key(), RECORD)
    g = em.new_kernel_graph()
    x = g.new_input((4, 64), dtype=em.float16)
    w = g.new_input((64, 96), dtype=em.float16)
    g.mark_output(g.matmul(g.rms_norm(x, (64,)), w))
    assert cache.get(_key(g)) is None


def test_format_version_misses(tmp_path: Path) -> None:
    cache = SearchCache(tmp_path)
    key = _key()
    path = cache.put(key, RECORD)
    entry = json.loads(path.read_text())
    entry["version"] = FORMAT_VERSION + 1
    path.write_text(json.dumps(entry))
    assert cache.get(key) is None


@pytest.mark.parametrize("damage", ["truncate", "garbage", "checksum", "not-an-entry"])
def test_corrupt_entry_is_a_miss_with_a_warning_and_is_replaced(tmp_path: Path,
                                                                damage: str) -> None:
    cache = SearchCache(tmp_path)
    key = _key()
    path = cache.put(key, RECORD)
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff" * 10)
    elif damage == "checksum":
        entry = json.loads(text)
        entry["record"]["num_kernels"] = 2
        path.write_text(json.dumps(entry))
    else:
        path.write_text("[1, 2, 3]")
    with pytest.warns(CacheWarning, match="treated as a miss"):
        assert cache.get(key) is None
    cache.put(key, RECORD)
    assert cache.get(key) == RECORD


def test_records_must_be_json_able(tmp_path: Path) -> None:
    cache = SearchCache(tmp_path)
    with pytest.raises(CacheError, match="JSON-able"):
        cache.put(_key(), {"x": object()})
    with pytest.raises(CacheError, match="mapping"):
        cache.put(_key(), [1, 2])  # type: ignore[arg-type]
    with pytest.raises(CacheError, match="CacheKey"):
        cache.get("abc")  # type: ignore[arg-type]


def test_default_directory_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EGRAPH_MIRAGE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "egraph-mirage"
    assert SearchCache().dir == tmp_path / "xdg" / "egraph-mirage" / "fx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "egraph-mirage"
    monkeypatch.setenv("EGRAPH_MIRAGE_CACHE", str(tmp_path / "own"))
    assert default_cache_dir() == tmp_path / "own"


def test_leftover_temporary_file_is_ignored_and_pruned(tmp_path: Path) -> None:
    """A writer killed between writing its temporary file and the rename leaves only that
    file: readers never open it, the next put succeeds, pruning removes it once old."""
    cache = SearchCache(tmp_path)
    key = _key()
    final = cache.path(key)
    final.parent.mkdir(parents=True)
    tmp = final.parent / f"{final.name}.dead0001.tmp"
    tmp.write_text(json.dumps({"format": "egraph-mirage/fx-cache"})[:20])  # half an entry
    assert cache.get(key) is None and len(cache) == 0
    cache.put(key, RECORD)
    assert cache.get(key) == RECORD
    assert cache.prune_temporary(older_than_s=3600) == 0  # young: may be a live writer's
    old = time.time() - 7200
    os.utime(tmp, (old, old))
    assert cache.prune_temporary(older_than_s=3600) == 1 and not tmp.exists()
    assert cache.get(key) == RECORD


def _writer(root: str, tag: int, rounds: int, start: Any) -> None:
    cache = SearchCache(root)
    key = _key(rules="r" * 64)
    start.wait()
    for i in range(rounds):
        cache.put(key, {"writer": tag, "round": i, "payload": [tag] * 5000})


def _killed_writer(root: str, ready: Any) -> None:
    """Writes its entry's temporary file, then waits to be killed before the rename."""
    import egraph_mirage.files as files

    def stall(src: str, dst: str) -> None:
        ready.set()
        time.sleep(60)

    files.os.replace = stall  # type: ignore[assignment]  # this process only
    SearchCache(root).put(_key(), {"writer": "killed", "payload": [0] * 5000})


def test_two_processes_write_one_key_concurrently(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), tag, 40, start)) for tag in (1, 2)]
    for p in procs:
        p.start()
    start.set()
    cache = SearchCache(tmp_path)
    key = _key()
    seen = set()
    while any(p.is_alive() for p in procs):
        record = cache.get(key)  # a reader meanwhile: never a partial entry (no warning)
        if record is not None:
            assert record["payload"] == [record["writer"]] * 5000
            seen.add(record["writer"])
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    final = cache.get(key)
    assert final is not None and final["writer"] in (1, 2) and final["round"] == 39
    assert final["payload"] == [final["writer"]] * 5000
    assert not list(cache.dir.glob("*/*.tmp"))  # every temporary file was renamed


def test_writer_killed_midway_leaves_no_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_killed_writer, args=(str(tmp_path), ready))
    p.start()
    assert ready.wait(60)
    p.kill()
    p.join(10)
    cache = SearchCache(tmp_path)
    assert len(list(cache.dir.glob("*/*.tmp"))) == 1  # its temporary file, written and synced
    assert cache.get(_key()) is None  # ... and never read
    cache.put(_key(), RECORD)
    assert cache.get(_key()) == RECORD


#: records as the backend has cached them (``fx.decision``): a timed winner, one whose CUDA
#: graph could not be captured, one timed before plain launches were also timed after an L2
#: flush (an earlier version), nothing found, and a winner found without a GPU
DECISIONS = [
    {"decision": "replace", "reason": "", "mugraph": '{"a": 1}', "knobs": {"k": 2},
     "created": 1.5, "search_seconds": 2.0, "num_kernels": 1, "grids": [[4, 1, 1]],
     "estimated_us": 3.0, "ours_us": 5.0, "inductor_us": 6.0, "ours_plain_us": 10.0,
     "inductor_plain_us": 12.0, "ours_flushed_us": 9.0, "inductor_flushed_us": 11.0,
     "ours_synced_us": 9.0, "inductor_synced_us": 11.0},
    {"decision": "replace", "reason": "", "mugraph": '{"a": 1}', "knobs": None, "created": 1.5,
     "search_seconds": 2.0, "num_kernels": 1, "grids": [[4, 1, 1]], "estimated_us": 3.0,
     "ours_us": None, "inductor_us": 6.0, "ours_plain_us": 1.0, "inductor_plain_us": 9.0,
     "ours_flushed_us": 1.0, "inductor_flushed_us": 9.0,
     "ours_synced_us": 1.0, "inductor_synced_us": 9.0},
    {"decision": "replace", "reason": "", "mugraph": '{"a": 1}', "knobs": {}, "created": 1.5,
     "search_seconds": 2.0, "num_kernels": 2, "grids": [[4, 1, 1], [1, 1, 1]],
     "estimated_us": 3.0, "ours_us": 5.0, "inductor_us": 6.0, "ours_plain_us": 1.0,
     "inductor_plain_us": 9.0},
    {"decision": "keep", "reason": "no μGraph found: none found", "mugraph": None,
     "knobs": None, "created": 1.5, "search_seconds": 2.0},
    {"decision": "replace", "reason": "", "mugraph": "{}", "knobs": None, "created": 1.5,
     "search_seconds": 0.5, "num_kernels": 1, "grids": [], "estimated_us": 3.0},
]


@pytest.mark.parametrize("record", DECISIONS)
def test_a_piece_decision_reads_and_writes_the_records_the_cache_holds(
        tmp_path: Path, record: dict[str, Any]) -> None:
    """``PieceDecision`` reads a cached record and writes it back key for key (existing caches
    still hit), an earlier version's included; the report and the timing rule read it."""
    from egraph_mirage.fx.decision import PieceDecision, slower
    from egraph_mirage.fx.report import KEPT, REPLACED, PieceReport

    cache = SearchCache(tmp_path)
    decision = PieceDecision.from_record(record)
    assert decision.to_record() == record
    cache.put(_key(), decision.to_record())
    assert PieceDecision.from_record(cache.get(_key()) or {}) == decision
    out = PieceReport(0, "egm_0")
    decision.fill(out)
    assert out.status == (REPLACED if record["decision"] == "replace" else KEPT)
    assert out.num_kernels == record.get("num_kernels") and bool(out.winner) == bool(
        record["mugraph"])
    assert (out.ours_us, out.inductor_plain_us) == (record.get("ours_us"),
                                                    record.get("inductor_plain_us"))
    why = {"both": decision.why_not_used("both"), "graph": decision.why_not_used("graph")}
    if record is DECISIONS[1]:  # not captured, faster launched plainly: the graph judges it
        assert why == {"both": "", "graph": "could not be timed under CUDA-graph replay"}
    else:  # faster replayed (or not timed)
        assert why == {"both": "", "graph": ""}
    if record is DECISIONS[2]:  # an earlier version's times: the whole graph's rule says so
        assert "cached by an earlier version" in slower(decision.times, "both")


def test_a_pieces_key_records_the_budget_and_how_it_was_timed() -> None:
    from egraph_mirage.fx.cache import piece_key
    from egraph_mirage.fx.inductor_timing import key_settings

    g = em.benchmarks.get("rmsnorm_linear", small=True)
    key = piece_key(g, {"budget": 60.0}, key_settings(None))
    assert key.search == {"budget": 60.0, "inductor_mode": "default",
                          "plain_timing": key_settings(None)["plain_timing"],
                          "graph_timing": key_settings(None)["graph_timing"]}
    assert key == CacheKey.of(g, search=key.search)
    assert piece_key(g, {"budget": 60.0}).digest() != key.digest()
    assert piece_key(g, {"budget": 30.0}).digest() != piece_key(g, {"budget": 60.0}).digest()
