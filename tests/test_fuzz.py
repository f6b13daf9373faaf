"""Fuzzing the public builders and readers: every input builds (loads) or raises an ``EMError``.

Seeded generators make thousands of cases: kernel graphs from random operator names, operand
counts, shapes and parameters (mostly plausible, some garbage); thread-block graphs with random
grids, maps, accumulators and outputs; μGraph JSON text (``em.loads``) mutated from valid files
(deleted keys, values of the wrong type, huge numbers, duplicated entries, truncated or garbled
text); and checkpoint files (``search.checkpoint.Checkpoint.open``) mutated the same way. Any
exception that is not an ``EMError`` fails the test with the case's seed, so it can be rerun on
its own; so does a case that takes longer than ``SLOW`` seconds (a hang is stopped by an alarm).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import random
import signal
import time
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.errors import EMError
from egraph_mirage.search.checkpoint import Checkpoint, fingerprint
from egraph_mirage.search.tasks import TaskResult

SEED = 20261123
SLOW = 2.0  # seconds one case may take
#: values of the wrong type, or out of range, for any field
GARBAGE: list[Any] = [None, True, -1, 0, 2**70, 10**400, 1.5, float("inf"), float("nan"), "",
                      "x", [], [1], [-1, -1, -1], [1, 2, 3, 4], {}, {"a": 1}, [[0]], "float16"]


class Hang(Exception):
    """A case ran past its alarm."""


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise ``Hang`` in the main thread after ``seconds`` (POSIX); elsewhere only timed."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def ring(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def fuzz(cases: int, case: Callable[[random.Random], object], salt: int) -> int:
    """Run ``case`` on ``cases`` seeded generators; returns how many built without an error."""
    built = 0
    for i in range(cases):
        seed = SEED + 100_000 * salt + i
        t0 = time.perf_counter()
        try:
            with alarm(10 * SLOW):
                case(random.Random(seed))
            built += 1
        except EMError:
            pass
        except Exception as exc:  # the failure this test looks for
            where = traceback.extract_tb(exc.__traceback__)[-1]
            pytest.fail(f"case random.Random({seed}) raised {type(exc).__name__}: {exc!s:.300} "
                        f"at {where.filename}:{where.lineno}")
        took = time.perf_counter() - t0
        assert took < SLOW, f"case random.Random({seed}) took {took:.1f} s"
    return built


# --- kernel graphs -------------------------------------------------------------------------
OPS = [op for op in em.OPS if op != "customized"]


def some(r: random.Random, plausible: Callable[[], Any], garbage: float = 0.08) -> Any:
    return copy.deepcopy(r.choice(GARBAGE)) if r.random() < garbage else plausible()


def dims(r: random.Random) -> Any:
    if r.random() < 0.06:
        return r.choice([8, None, "ab", 3.0, [2, [3]], {"a": 1}, (2**40, 2**40), b"ab",
                         np.int64(4), (np.int64(2), 4), range(3), (0,), (-2, 4), (2, True)])
    return tuple(r.choice([1, 2, 4, 8]) for _ in range(r.randint(1, 3)))


def param(r: random.Random, name: str, shape: tuple[int, ...]) -> Any:
    plausible = {"dim": lambda: r.randint(-3, 3), "scalar": lambda: r.choice([0.5, 2, -1.0]),
                 "count": lambda: r.choice([1, 4, 64]),
                 "normalized_shape": lambda: r.choice([shape[-1:], shape[-2:], 4, (8,)]),
                 "kernel": lambda: None, "output": lambda: 0,
                 "dtype": lambda: r.choice(["float16", "bfloat16", "float32", em.float16])}
    return some(r, plausible.get(name, lambda: None), 0.1)


def kernel_graph(r: random.Random) -> em.KernelGraph:
    g = em.new_kernel_graph()
    ts: list[Any] = []
    for _ in range(r.randint(1, 3)):
        ts.append(g.new_input(dims(r), some(r, lambda: em.float16, 0.03)))
    foreign = em.new_kernel_graph().new_input((2, 2))
    for _ in range(r.randint(0, 6)):
        op = r.choice(OPS) if r.random() < 0.95 else r.choice(["foo", "", 3, None, "customized"])
        spec = em.OPS.get(op) if isinstance(op, str) else None
        lo, hi = spec.num_inputs if spec else (1, 2)
        operands = [r.choice(ts) if r.random() < 0.95 else r.choice([foreign, 3, None, "t"])
                    for _ in range(max(0, r.randint(lo - 1, hi + 1) if r.random() < 0.1
                                       else r.randint(lo, hi)))]
        shape = next((t.dims for t in operands if isinstance(t, em.Tensor)), (4,))
        names = list(spec.params) if spec else []
        if r.random() < 0.05:
            names.append("bogus")
        params = {k: param(r, k, shape) for k in names}
        method = getattr(g, op, None) if isinstance(op, str) and op in em.OPS else None
        try:
            bound = inspect.signature(method).bind(*operands, **params) if method else None
        except TypeError:
            bound = None
        if bound is not None and r.random() < 0.5:
            ts.append(method(*bound.args, **bound.kwargs))
        else:
            ts.append(g.apply(op, operands, **params))
        if r.random() < 0.3:
            g.mark_output(r.choice(ts))
    for t in ts:
        em.abstract_expr(t)
    if sum(int(np.prod(t.dims)) for t in g.tensors) < 50_000:
        with np.errstate(all="ignore"):  # sqrt of negatives, division by zero: NaN is fine here
            g.evaluate([np.random.default_rng(0).standard_normal(t.dims) for t in g.inputs])
    if g.outputs:
        em.loads(em.to_json(g))
    return g


def test_kernel_graph_builder() -> None:
    assert fuzz(3000, kernel_graph, 1) > 300  # plenty of cases build whole programs


# --- thread-block graphs -------------------------------------------------------------------
def block_graph(r: random.Random) -> em.KernelGraph:
    """X @ W as one kernel (a plain or split grid, a for-loop over the contraction, an
    element-wise operator before or after, an rms denominator), each choice sometimes garbage,
    and now and then a random operator on random tiles."""
    m, k, n = r.choice([2, 4]), r.choice([2, 4, 8]), r.choice([2, 4, 8])
    g = em.new_kernel_graph()
    X, W = g.new_input((m, k)), g.new_input((k, n))
    gx, loop = r.choice([1, 2]), r.choice([1, 2])
    split = (1, -1, -1) if gx == 2 else (-1, -1, -1)
    tb = em.new_threadblock_graph(grid_dim=some(r, lambda: (gx, 1, 1), 0.03),
                                  forloop_range=some(r, lambda: loop, 0.03),
                                  **({"block_dim": some(r, lambda: (128, 1, 1), 0.5)}
                                     if r.random() < 0.05 else {}))
    x = tb.new_input(X, some(r, lambda: (-1, -1, -1), 0.03), some(r, lambda: 1, 0.03))
    w = tb.new_input(W, some(r, lambda: split, 0.03), some(r, lambda: 0, 0.03))
    tiles = [x, w]

    def unary(t: Any) -> Any:
        return tb.apply(r.choice(["exp", "square", "silu", "relu", "sqrt"]), [t])

    def wild() -> None:  # a random operator, accumulator or running max on random tiles
        c = r.random()
        if c < 0.6:
            op = r.choice([o for o in OPS if o != "rms_norm"])
            spec = em.OPS[op]
            args = [r.choice(tiles) for _ in range(spec.num_inputs[1])]
            tiles.append(tb.apply(op, args, **{p: param(r, p, args[0].dims)
                                               for p in spec.params}))
        elif c < 0.85:
            acc = some(r, lambda: r.choice([None, "sum", "mean", "rms", "sum_todimx", "max"]))
            tiles.append(tb.forloop_accum(r.choice(tiles), acc,
                                          **({"rescale": r.choice(tiles)} if r.random() < 0.2
                                             else {})))
        else:
            tiles.append(tb.forloop_max(r.choice(tiles)))

    a = unary(x) if r.random() < 0.3 else x
    y = tb.forloop_accum(tb.matmul(a, w), some(r, lambda: r.choice([None, "sum"]), 0.05))
    if r.random() < 0.4:
        y = tb.div(y, tb.forloop_accum(x, "rms"))
    if r.random() < 0.3:
        y = unary(y)
    tiles.append(y)
    while r.random() < 0.15:
        wild()
    out = tiles[-1] if r.random() < 0.2 else y
    tb.new_output(out, some(r, lambda: split, 0.05))
    outs = g.customized(some(r, lambda: [X, W], 0.03), tb)
    for o in outs:
        g.mark_output(o)
    em.loads(em.to_json(g))
    return g


def test_thread_block_graph_builder() -> None:
    assert fuzz(2000, block_graph, 2) > 500


# --- μGraph JSON ---------------------------------------------------------------------------
def valid_files() -> list[str]:
    texts = []
    for name in em.benchmarks.names():
        g = em.benchmarks.get(name, small=True)
        texts += [em.to_json(g), em.to_json(fixtures.fused(name, g))]
    texts.append(em.to_json(fixtures.flash_attention(em.benchmarks.get("mha", small=True))))
    return texts


def _nodes(x: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield path, x
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _nodes(v, (*path, i))


def mutated_json(r: random.Random, doc: Any, extra: list[Any]) -> str:
    """``doc`` with 1-3 random edits: a key deleted, a value replaced by one of another type or
    a huge number, an entry duplicated, a number shifted, a key added."""
    doc = copy.deepcopy(doc)
    for _ in range(r.randint(1, 3)):
        path, node = r.choice(list(_nodes(doc)))
        if not path:
            continue
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        key, c = path[-1], r.random()
        if c < 0.25:
            del parent[key]
        elif c < 0.7:
            parent[key] = copy.deepcopy(r.choice(GARBAGE + extra))
        elif c < 0.8 and isinstance(parent, list):
            parent.insert(r.randrange(len(parent) + 1), copy.deepcopy(node))
        elif isinstance(node, int) and not isinstance(node, bool):
            parent[key] = node + r.choice([-1, 1, 2, 10**6, -(10**6), 2**62])
        elif isinstance(parent, dict):
            parent[f"{key}_extra"] = 1
    return json.dumps(doc)


def mutated_text(r: random.Random, text: str) -> str:
    """``text`` truncated, with a token spliced in (a 5000-digit number, 1e400, NaN, a quote),
    deeply nested, or with one character changed."""
    c, i = r.random(), r.randrange(len(text))
    if c < 0.4:
        return text[:i]
    if c < 0.75:
        return text[:i] + r.choice(["9" * 5000, "1e400", "-", "{", "]", "NaN", "Infinity", '"',
                                    "\\u0000", "\x00", "1" * 30]) + text[i + 1:]
    if c < 0.8:
        return "[" * 50_000 + "]" * 50_000
    return text[:i] + chr(r.randrange(32, 127)) + text[i + 1:]


def test_mugraph_json_loader() -> None:
    texts = valid_files()
    docs = [json.loads(t) for t in texts]
    extra = ["input", "customized", "matmul", "forloop_accum", "rms", "exp", 7, 2**31,
             {"op": "exp", "operands": [0], "params": {}}]

    def case(r: random.Random) -> object:
        k = r.randrange(len(docs))
        text = mutated_json(r, docs[k], extra) if r.random() < 0.7 else mutated_text(r, texts[k])
        return em.loads(text)

    assert fuzz(3000, case, 3) > 30  # some mutations keep a valid μGraph


# --- checkpoint files ----------------------------------------------------------------------
def test_checkpoint_reader(tmp_path: Path) -> None:
    payload = types.SimpleNamespace(target_json="{}", config="config", rules="rules")
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    stored = em.to_json(fixtures.fused("rmsnorm_linear", g))
    ck = Checkpoint(tmp_path / "base.ckpt", fingerprint(payload, 0))  # type: ignore[arg-type]
    ck.record(TaskResult("k1", [(stored, 1, 1e-5, 1e-10, 2, 1e-3, 0.5)], {"states": 10},
                         {"enumerate": 0.1}))
    ck.record(TaskResult("k2", [], {"states": 0}, {"enumerate": 0.0}))
    text = (tmp_path / "base.ckpt").read_text()
    doc = json.loads(text)
    path = tmp_path / "fuzzed.ckpt"

    def case(r: random.Random) -> object:
        path.write_text(mutated_json(r, doc, [[stored] * 7, ["x", 1, 2, 3, 4, 5, 6]])
                        if r.random() < 0.7 else mutated_text(r, text))
        return Checkpoint.open(path, payload, 0)  # type: ignore[arg-type]

    assert fuzz(2000, case, 4) > 100
