"""Broken rule files are reported as ``RuleError("file:line: ...")``, never as egglog's own errors.

``Oracle(g, extra_rules=[path])`` loads the shipped rules and then ``path`` (a file or a folder of
``*.egg`` files), one top-level form at a time, so every problem can name the file and the line
its form starts on. A path that does not exist or a folder without rule files is reported at line
0. A valid extra rule file extends what the oracle can derive.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import egraph_mirage as em
from egraph_mirage import RuleError
from egraph_mirage.oracle import egglog_compat

VALID = "(rewrite (Mul (Num 1) a) a)  ; a valid identity not among the shipped rules\n"
HEADER = "; an extra rule file\n" + VALID  # lines 1 and 2; a broken line 3 follows

#: name -> (file text, line the error must name)
BROKEN: dict[str, tuple[str, int]] = {
    "unclosed paren": (HEADER + "(birewrite (Add a (Num 0))\n  (Add (Num 0) a)\n\n", 3),
    "unclosed paren at end of file": (HEADER + "(rule ((= e (Add a b)))\n  ((union e a))", 3),
    "close paren without open": (HEADER + ")\n", 3),
    "close paren after a form": ("; c\n" + VALID.replace(")  ;", "))  ;"), 2),
    "symbol outside a form": (HEADER + "foo\n", 3),
    "number after a form": (VALID.rstrip("\n").split(";")[0] + " 42\n", 1),
    "string outside a form": (HEADER + '"stray text"\n', 3),
    "unknown constructor in rewrite": (HEADER + "(birewrite (Foo a) (Add a a))\n", 3),
    "unknown constructor in rule": (HEADER + "\n(rule ((= e (Add a b))) ((union e (Bar a b))))\n",
                                    4),
    "i64 where an Expr is expected": (HEADER + "(birewrite (Add a 1) (Add 1 a))\n", 3),
    "unbound variable on the right": (HEADER + "(rewrite (Add a b) (Add b c))\n", 3),
    "rule without actions": (HEADER + "(rule ((= e (Add a b))))\n", 3),
    "rule whose fact is not a list": (HEADER + "(rule (= e (Add a b)) ((union e a)))\n", 3),
    "union with one argument": (HEADER + "(rule ((= e (Add a b))) ((union e)))\n", 3),
    "rewrite with one side": (HEADER + "(rewrite (Add a b))\n", 3),
    "unknown rewrite option": (HEADER + "(birewrite (Add a b) (Add b a) :bogus 3)\n", 3),
    "string not closed": (HEADER + '(birewrite (Var "x) (Var "y"))\n', 3),
    "datatype declared again": (HEADER + "(datatype Expr (Var String))\n", 3),
    "a shipped rule repeated": (HEADER + "(birewrite (Add a b) (Add b a))\n", 3),
    "a line repeated": (HEADER + VALID, 3),
    "constructor declared twice": (HEADER + "(constructor Foo (Expr) Expr)\n"
                                   "(constructor Foo (Expr) Expr)\n", 4),
}
#: cases on which egglog panics (Rust writes the panic, and a backtrace, to descriptor 2)
PANICS = ("a shipped rule repeated", "a line repeated")


@pytest.fixture(scope="module")
def target() -> em.KernelGraph:
    return em.benchmarks.get("rmsnorm_linear", small=True)


def expect_rule_error(target: em.KernelGraph, extra: Path, path: Path, line: int) -> RuleError:
    """Build an oracle with ``extra`` and check it fails with a RuleError naming ``path:line``."""
    with pytest.raises(RuleError) as info:
        em.Oracle(target, extra_rules=[extra])
    err = info.value
    assert type(err) is RuleError
    assert not isinstance(err, egglog_compat.egglog_error_types()) and err.__cause__ is None
    assert str(err).startswith(f"{path}:{line}:"), str(err)
    assert (err.path, err.line) == (str(path), line)
    assert err.detail.strip(), "the message says what is wrong"
    return err


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_file_names_file_and_line(target: em.KernelGraph, tmp_path: Path, case: str) -> None:
    text, line = BROKEN[case]
    path = tmp_path / "broken.egg"
    path.write_text(text)
    expect_rule_error(target, path, path, line)


@pytest.mark.parametrize("case", [*PANICS, "constructor declared twice", "datatype declared again"])
def test_egglog_panics_leave_stderr_clean(target: em.KernelGraph, tmp_path: Path, case: str,
                                          capfd: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """egglog's own output (a Rust panic message and backtrace) is captured: the error is one
    line naming file and line, with egglog's reason, and nothing reaches stderr."""
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    text, line = BROKEN[case]
    path = tmp_path / "dup.egg"
    path.write_text(text)
    capfd.readouterr()
    err = expect_rule_error(target, path, path, line)
    out = capfd.readouterr()
    assert out.err == "" and out.out == "", out.err[:500]
    assert "\n" not in str(err)
    if case in PANICS:
        assert "already present" in err.detail, err.detail
    em.Oracle(target)  # descriptor 2 is restored: later oracles still build


def test_meaningful_line_of_a_panic() -> None:
    panic = ("\nthread '<unnamed>' panicked at src/lib.rs:995:29:\nRule 'r' was already present\n"
             "stack backtrace:\n   0: rust_begin_unwind\n             at panicking.rs:697:5\n"
             "note: Some details are omitted\n")
    assert egglog_compat.meaningful_line(panic) == "Rule 'r' was already present"
    assert egglog_compat.failure_message(RuntimeError(""), panic) == "Rule 'r' was already present"
    assert egglog_compat.meaningful_line("stack backtrace:\n") == ""


def test_unknown_constructor_message(target: em.KernelGraph, tmp_path: Path) -> None:
    """egglog's complaint is kept in the message, after the file and line."""
    path = tmp_path / "foo.egg"
    path.write_text(BROKEN["unknown constructor in rewrite"][0])
    assert "Foo" in expect_rule_error(target, path, path, 3).detail


def test_error_in_a_folder_names_the_file(target: em.KernelGraph, tmp_path: Path) -> None:
    """A folder's files load in name order; the error names the file that is broken."""
    (tmp_path / "10_ok.egg").write_text(HEADER)
    (tmp_path / "20_bad.egg").write_text("; fine\n\n(rewrite (Baz a) a)\n")
    expect_rule_error(target, tmp_path, tmp_path / "20_bad.egg", 3)


def test_missing_path(target: em.KernelGraph, tmp_path: Path) -> None:
    missing = tmp_path / "no_such_rules.egg"
    expect_rule_error(target, missing, missing, 0)


def test_empty_folder(target: em.KernelGraph, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a rule file")
    expect_rule_error(target, tmp_path, tmp_path, 0)


def test_valid_extra_rule_extends_reachability(tmp_path: Path) -> None:
    """A new identity in an extra file loads and makes a term reachable that was not before."""
    g = em.new_kernel_graph()
    X = g.new_input((4, 8))
    Y = g.new_input((4, 8))
    g.mark_output(g.exp(g.add(X, Y)))
    query = '(Mul (Exp (Var "v0")) (Exp (Var "v1")))'
    before = em.Oracle(g)
    assert before.complete and not before.is_subexpr(query)

    extra = tmp_path / "50_exp.egg"
    extra.write_text("; exp turns sums into products\n"
                     "(birewrite (Exp (Add a b)) (Mul (Exp a) (Exp b)))  ; exp of a sum\n")
    after = em.Oracle(g, extra_rules=[extra])
    assert after.rule_paths[-1] == extra
    assert after.is_subexpr(query)
    assert after.is_subexpr('(Exp (Add (Var "v0") (Var "v1")))')  # the target itself still is
    assert after.answer(query) is em.Reachability.REACHABLE
