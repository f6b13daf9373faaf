"""A disk cache of the ``torch.compile`` backend's decisions, one JSON file per subprogram.

For each piece of a model the backend searches for a μGraph, compiles it and decides whether to
use it (``fx.backend``). That work is keyed by what decides its outcome (``CacheKey``): the
piece's program as canonical μGraph JSON (``mugraph.serialize.dumps``, which holds its operators,
shapes and dtypes), the rules' digest (``oracle.rules.rules_digest`` of the shipped rules and the
generated prelude), the lowering's fingerprint (``gpu.tune.lowering_fingerprint``), the
search's (``search_fingerprint``: a search changed since a piece was found nothing for, one that
now reaches deeper, searches it again), the device's name, the search settings and
``FORMAT_VERSION`` (``piece_key``; ``whole_key`` for the check of
a whole graph with its pieces replaced). A record is any JSON-able mapping; the backend stores a
piece's decision (``fx.decision.PieceDecision.to_record``: the winner's μGraph JSON text, its
statistics and times, the decision) and a whole graph's times.

Layout: ``<root>/fx/<first two hex digits>/<sha256 of the key>.json``, each file one object
``{"format", "version", "key", "record", "checksum"}`` where ``checksum`` is the SHA-256 of the
record's canonical JSON. The key is stored whole: a file whose key differs from the one asked
(a hash collision, a hand-copied file) is a miss.

Concurrency and crashes: a writer writes a temporary file in the entry's folder, fsyncs it and
renames it over the entry (``files.write_atomic``; ``os.replace`` is atomic on POSIX), so a
reader needs no lock and sees either the old entry, the new one, or none. Two writers of one key
both succeed and the entry is one of theirs, whole. A killed writer leaves at most a temporary
file (``*.tmp``), which no reader opens and ``prune_temporary`` removes. A file that is truncated
or corrupt anyway (a disk fault, a hand edit) is a miss with a ``CacheWarning``, and the next
``put`` of its key replaces it.

The root folder is, in order: the ``directory`` given, ``$EGRAPH_MIRAGE_CACHE`` (as for the
GPU tuner's trials), ``$XDG_CACHE_HOME/egraph-mirage``, ``~/.cache/egraph-mirage``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EMError
from ..files import write_atomic
from ..graph import KernelGraph
from ..mugraph.serialize import dumps

#: the layout of an entry and of its key; a new version misses every older entry
FORMAT_VERSION = 1
FORMAT = "egraph-mirage/fx-cache"


class CacheError(EMError, ValueError):
    """A cache was used wrongly: a record that is not JSON-able, a key of the wrong type."""


class CacheWarning(UserWarning):
    """An entry was unreadable (truncated, corrupt, of another format) and counts as a miss."""


def default_cache_dir() -> Path:
    """The cache's root folder when none is given (see the module's docstring)."""
    if os.environ.get("EGRAPH_MIRAGE_CACHE"):
        return Path(os.environ["EGRAPH_MIRAGE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "egraph-mirage"


def device_name() -> str:
    """The name of the device the kernels run on: the CUDA GPU's, or "cpu" (Triton's
    interpreter)."""
    import torch

    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name())
    return "cpu"


def default_rules_digest() -> str:
    """The digest of the rules the search uses by default: the shipped rule files and the
    generated prelude, as ``superoptimize`` computes it."""
    from ..oracle.prelude import prelude_text
    from ..oracle.rules import DEFAULT_RULES_DIR, rules_digest

    return rules_digest([DEFAULT_RULES_DIR], prelude_text())


def lowering_fingerprint() -> str:
    """The code generator's fingerprint (``gpu.tune.lowering_fingerprint``): a changed lowering
    invalidates cached timings and decisions."""
    from ..gpu.tune import lowering_fingerprint as fingerprint

    return fingerprint()


@functools.cache
def search_fingerprint() -> str:
    """Hash of the source files that decide what a search finds and how it is checked (the
    search, the pipeline that runs it, the μGraphs, the oracle, the verifier, the ranking and
    extraction): a changed search invalidates cached decisions. Computed once per process (the
    files do not change under a running process), as every key asks for it."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for folder in ("search", "pipeline", "mugraph", "oracle", "verify", "rank", "extract"):
        for path in sorted((root / folder).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class CacheKey:
    """What decides a cached outcome. ``program`` is the canonical μGraph JSON of the piece
    (``mugraph.serialize.dumps``); ``operators``, ``shapes`` and ``dtypes`` repeat its
    operators and its inputs' shapes and dtypes in readable form (for listing entries);
    ``search`` holds the settings that change what the search finds (budget, task budget)."""

    program: str
    operators: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    rules: str
    device: str
    lowering: str = ""
    search: Mapping[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    #: the search's fingerprint (``search_fingerprint``)
    code: str = ""

    @classmethod
    def of(cls, graph: KernelGraph, *, rules: str | None = None, device: str | None = None,
           lowering: str | None = None, search: Mapping[str, Any] | None = None) -> CacheKey:
        """The key of ``graph``; ``rules`` defaults to ``default_rules_digest()``, ``device`` to
        ``device_name()``, ``lowering`` to ``lowering_fingerprint()``."""
        if not isinstance(graph, KernelGraph):
            raise CacheError(f"CacheKey.of: expected a KernelGraph, got {type(graph).__name__}")
        return cls(program=dumps(graph),
                   operators=tuple(t.op for t in graph.operators),
                   shapes=tuple(tuple(t.dims) for t in graph.inputs),
                   dtypes=tuple(t.dtype.value for t in graph.inputs),
                   rules=default_rules_digest() if rules is None else rules,
                   device=device_name() if device is None else device,
                   lowering=lowering_fingerprint() if lowering is None else lowering,
                   search=dict(search or {}), code=search_fingerprint())

    def as_dict(self) -> dict[str, Any]:
        """The key as JSON-able data (tuples as lists), as stored in an entry."""
        return json.loads(json.dumps(asdict(self), sort_keys=True))

    def digest(self) -> str:
        """SHA-256 hex digest of the key's canonical JSON: the entry's file name."""
        return hashlib.sha256(_canonical(self.as_dict()).encode()).hexdigest()


def piece_key(graph: KernelGraph, settings: Mapping[str, Any],
              timed: Mapping[str, Any] | None = None) -> CacheKey:
    """The key of a piece's decision (``fx.decision``): its program (``CacheKey.of``) and the
    search settings, with, where its winner is timed against Inductor, how it is timed
    (``timed``: ``fx.inductor_timing.key_settings``; times measured otherwise miss)."""
    return CacheKey.of(graph, search={**settings, **(timed or {})})


def whole_key(gm: Any, example_inputs: Sequence[Any], replaced: Sequence[Sequence[str]],
              launch: str, settings: Mapping[str, Any], timed: Mapping[str, Any],
              modes: Sequence[str | None] = ()) -> CacheKey:
    """The key of a whole-graph check (``fx.backend``): Dynamo's graph ``gm`` (its code), its
    inputs' shapes, strides and dtypes, the ``replaced`` pieces (each ``[name, winner]``, the
    winner's digest) and who launches their kernels (``launch``), the rules, lowering and
    device (``CacheKey``'s defaults), the search settings and how the graphs are timed
    (``timed``); with ``modes``, the check of Inductor's code for ``gm`` in those modes
    (``fx.whole``)."""
    import torch

    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    layout = [[list(x.shape), list(x.stride()), str(x.dtype).removeprefix("torch.")]
              for x in tensors]
    program = json.dumps({"code": gm.code, "inputs": layout,
                          "replaced": [list(r) for r in replaced], "launch": launch,
                          **({"modes": [m or "default" for m in modes]} if modes else {})},
                         sort_keys=True)
    return CacheKey(program=hashlib.sha256(program.encode()).hexdigest(),
                    operators=("whole graph",), shapes=tuple(tuple(s) for s, _, _ in layout),
                    dtypes=tuple(d for _, _, d in layout), rules=default_rules_digest(),
                    device=device_name(), lowering=lowering_fingerprint(),
                    search={**settings, **timed}, code=search_fingerprint())


def graph_key(gm: Any, example_inputs: Sequence[Any], settings: Mapping[str, Any],
              timed: Mapping[str, Any]) -> CacheKey:
    """The key of a graph's compilation record (``fx.backend``: the pieces its compilation
    left unsearched for want of time, which a compilation of the same graph with the same
    settings does not search either): ``whole_key``'s, with no pieces replaced."""
    return whole_key(gm, example_inputs, [], "", settings, {**timed, "record": "compilation"})


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


class SearchCache:
    """Entries under ``<directory>/fx/`` (``directory`` default: ``default_cache_dir()``).

    ``get(key)`` returns the stored record or None (a miss, also for an unreadable entry, with a
    ``CacheWarning``); ``put(key, record)`` stores a JSON-able mapping atomically. Safe for
    concurrent processes without locks (module docstring). ``hits``, ``misses`` and ``writes``
    count this object's calls."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(directory) if directory is not None else default_cache_dir()
        self.dir = self.root / "fx"
        self.hits = 0
        self.misses = 0
        self.writes = 0

    def path(self, key: CacheKey) -> Path:
        """The entry's file (which may not exist)."""
        digest = _digest_of(key)
        return self.dir / digest[:2] / f"{digest}.json"

    def get(self, key: CacheKey) -> dict[str, Any] | None:
        record = self._read(key)
        if record is None:
            self.misses += 1
        else:
            self.hits += 1
        return record

    def _read(self, key: CacheKey) -> dict[str, Any] | None:
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            return _unreadable(path, f"cannot be read ({e})")
        try:
            entry = json.loads(data.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is one too
            return _unreadable(path, f"is not valid JSON ({len(data)} bytes: truncated or "
                                     "corrupt)")
        if not isinstance(entry, dict) or entry.get("format") != FORMAT:
            return _unreadable(path, "is not an egraph-mirage cache entry")
        if entry.get("version") != FORMAT_VERSION:
            return None  # an entry of another format version: a plain miss
        if entry.get("key") != key.as_dict():
            return None  # another key with the same digest (or a copied file): a plain miss
        record = entry.get("record")
        if not isinstance(record, dict) or entry.get("checksum") != _checksum(record):
            return _unreadable(path, "fails its checksum (corrupt)")
        return record

    def put(self, key: CacheKey, record: Mapping[str, Any]) -> Path:
        """Store ``record`` under ``key`` (replacing any entry, readable or not); returns the
        entry's path."""
        if not isinstance(record, Mapping):
            raise CacheError(f"SearchCache.put: a record is a mapping, got "
                             f"{type(record).__name__}")
        try:
            data = json.loads(_canonical(dict(record)))
        except (TypeError, ValueError) as e:
            raise CacheError(f"SearchCache.put: the record is not JSON-able: {e}") from None
        entry = {"format": FORMAT, "version": FORMAT_VERSION, "key": key.as_dict(),
                 "record": data, "checksum": _checksum(data)}
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(entry, sort_keys=True, indent=1))
        _fsync_dir(path.parent)
        self.writes += 1
        return path

    def prune_temporary(self, older_than_s: float = 3600.0) -> int:
        """Remove temporary files left by killed writers, older than ``older_than_s`` seconds
        (a younger one may belong to a writer still at work); returns how many."""
        if not self.dir.is_dir():
            return 0
        limit = time.time() - older_than_s
        removed = 0
        for tmp in self.dir.glob("*/*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < limit:
                    tmp.unlink()
                    removed += 1
        return removed

    def __len__(self) -> int:
        """The number of entries (complete files; temporary ones are not counted)."""
        return sum(1 for _ in self.dir.glob("*/*.json")) if self.dir.is_dir() else 0


def _digest_of(key: CacheKey) -> str:
    if not isinstance(key, CacheKey):
        raise CacheError(f"SearchCache: a key is a CacheKey, got {type(key).__name__}")
    return key.digest()


def _checksum(record: Any) -> str:
    return hashlib.sha256(_canonical(record).encode()).hexdigest()


def _unreadable(path: Path, why: str) -> None:
    warnings.warn(f"egraph-mirage cache entry {path} {why}; treated as a miss and replaced on "
                  "the next write", CacheWarning, stacklevel=3)
    return None


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (best effort: some file systems refuse to open a folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["FORMAT_VERSION", "CacheError", "CacheKey", "CacheWarning", "SearchCache",
           "default_cache_dir", "default_rules_digest", "device_name", "lowering_fingerprint",
           "piece_key", "whole_key"]
