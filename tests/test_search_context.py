"""What a search depends on: its seed and its rules, never a context left by an earlier search.

Tasks share a ``Context`` (target, verifier, kernel shapes, the block search's memo) built from
the search's payload. Two searches in one process with another seed or other rules must each get
their own; ``superoptimize(rules=, extra_rules=)`` takes the rules as ``Oracle`` does, worker
processes search under the same rules, and a checkpoint made under other rules is refused.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
from search_space import TINY
from search_space import texts as _texts

import egraph_mirage as em
from egraph_mirage.oracle.prelude import prelude_text
from egraph_mirage.oracle.rules import DEFAULT_RULES_DIR, rules_digest
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchError, SearchResult
from egraph_mirage.search.prepare import prepare
from egraph_mirage.search.tasks import context

#: the identity the one-kernel RMSNorm + Linear with the division after the matmul needs
NUMERATOR = "(birewrite (Mul a (Div b c)) (Div (Mul a b) c))"


@pytest.fixture(scope="module")
def fewer_rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shipped rules without the identity that moves a factor into a numerator."""
    folder = tmp_path_factory.mktemp("rules") / "rules"
    shutil.copytree(DEFAULT_RULES_DIR, folder)
    (path,) = [p for p in folder.glob("*.egg") if NUMERATOR in p.read_text()]
    path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                            if not line.startswith(NUMERATOR)))
    return folder


def _moved_division(r: SearchResult) -> bool:
    """The paper's form: one kernel that divides after the matmul."""
    ops = [b.op for t in r.graph.operators for b in t.params["kernel"].tb.tensors]
    return "div" in ops and "matmul" in ops and ops.index("div") > ops.index("matmul")


def test_each_seed_gets_its_own_context(rmsnorm: em.KernelGraph) -> None:
    zero, one = prepare(rmsnorm, TINY, seed=0), prepare(rmsnorm, TINY, seed=1)
    assert zero.key != one.key
    assert context(one) is not context(zero)
    assert context(one).payload.seed == 1 and context(zero).payload.seed == 0
    assert context(prepare(rmsnorm, TINY, seed=1)) is context(one)  # equal payloads share one


def test_a_second_search_verifies_with_its_own_seed(rmsnorm: em.KernelGraph,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two searches in one process, seeds 0 then 1: the second builds a verifier of seed 1."""
    verify = importlib.import_module("egraph_mirage.verify")  # em.verify is the function
    seeds: list[int] = []

    class Recording(verify.Verifier):
        def __init__(self, *args, seed: int = 0, **kwargs) -> None:
            seeds.append(seed)
            super().__init__(*args, seed=seed, **kwargs)

    monkeypatch.setattr(verify, "Verifier", Recording)
    first = superoptimize(rmsnorm, TINY, workers=1, seed=0, progress=False)
    second = superoptimize(rmsnorm, TINY, workers=1, seed=1, progress=False)
    assert seeds == [0, 1]
    assert _texts(first) == _texts(second)


def test_other_rules_give_another_search(rmsnorm: em.KernelGraph, fewer_rules: Path) -> None:
    """Without the numerator identity the division cannot move after the matmul: the e-graph
    prunes it, whichever search ran first in the process."""
    full = superoptimize(rmsnorm, TINY, workers=1, progress=False)
    fewer = superoptimize(rmsnorm, TINY, workers=1, progress=False, rules=[fewer_rules])
    again = superoptimize(rmsnorm, TINY, workers=1, progress=False)
    assert any(map(_moved_division, full)) and not any(map(_moved_division, fewer))
    assert set(_texts(fewer)) < set(_texts(full))
    assert fewer.stats.pruned_by_oracle != full.stats.pruned_by_oracle
    assert _texts(again) == _texts(full) and again.stats.states == full.stats.states
    a, b = prepare(rmsnorm, TINY), prepare(rmsnorm, TINY, rules=fewer_rules)
    assert a.rules != b.rules and a.key != b.key
    assert a.rules == rules_digest([DEFAULT_RULES_DIR], prelude_text())  # the prelude counts
    assert context(b).payload.reach is b.reach and context(a).payload.reach is a.reach


def test_worker_processes_search_under_the_same_rules(rmsnorm: em.KernelGraph,
                                                      fewer_rules: Path) -> None:
    one = superoptimize(rmsnorm, TINY, workers=1, progress=False, rules=[fewer_rules])
    two = superoptimize(rmsnorm, TINY, workers=2, progress=False, rules=fewer_rules)
    assert one and _texts(two) == _texts(one)


def test_extra_rules_are_loaded_after_the_rules(rmsnorm: em.KernelGraph, fewer_rules: Path,
                                                tmp_path: Path) -> None:
    """The identity left out, given back as an extra file, restores the full search."""
    extra = tmp_path / "50_numerator.egg"
    extra.write_text(NUMERATOR + "  ; a factor moves into a numerator\n")
    full = superoptimize(rmsnorm, TINY, workers=1, progress=False)
    restored = superoptimize(rmsnorm, TINY, workers=1, progress=False, rules=[fewer_rules],
                             extra_rules=[extra])
    assert _texts(restored) == _texts(full)


def test_bad_rule_paths_are_clear_errors(rmsnorm: em.KernelGraph, tmp_path: Path) -> None:
    with pytest.raises(em.RuleError, match="no such rule file"):
        superoptimize(rmsnorm, TINY, workers=1, rules=[tmp_path / "missing"])
    with pytest.raises(SearchError, match="extra_rules"):
        superoptimize(rmsnorm, TINY, workers=1, extra_rules=[3])


def test_a_checkpoint_of_other_rules_is_refused(rmsnorm: em.KernelGraph, fewer_rules: Path,
                                                tmp_path: Path) -> None:
    path = tmp_path / "search.ckpt"
    superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    with pytest.raises(SearchError, match="rule set"):
        superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False,
                      rules=[fewer_rules])
    extra = tmp_path / "50_one.egg"
    extra.write_text("(rewrite (Mul (Num 1) a) a)  ; one is the unit of mul\n")
    with pytest.raises(SearchError, match="rule set"):
        superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False,
                      extra_rules=[extra])
    copy = tmp_path / "copy"
    shutil.copytree(DEFAULT_RULES_DIR, copy)  # the same rules elsewhere: resumed
    again = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False,
                          rules=[copy])
    assert again.stats.resumed_tasks == again.stats.tasks_total


def test_rules_digest(tmp_path: Path, fewer_rules: Path) -> None:
    files = sorted(DEFAULT_RULES_DIR.glob("*.egg"))
    digest = rules_digest([DEFAULT_RULES_DIR])
    assert len(digest) == 64 and digest == rules_digest(files)
    assert rules_digest([fewer_rules]) != digest
    assert rules_digest(files[::-1]) != digest  # the order of loading counts
    assert rules_digest([DEFAULT_RULES_DIR], prelude="(relation R (i64))") != digest
    assert rules_digest([DEFAULT_RULES_DIR], prelude="") == digest
    with pytest.raises(em.RuleError):
        rules_digest([tmp_path / "missing.egg"])
