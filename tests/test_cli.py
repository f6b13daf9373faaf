"""The ``egraph-mirage`` command, run in-process."""

from __future__ import annotations

import json
import re

import pytest
from cli_runs import run_cli

from egraph_mirage import benchmarks
from egraph_mirage.bench import KEYS
from egraph_mirage.cli import _parser

REQUIRED = {"target", "saturate_s", "enodes", "eclasses", "complete", "op_queries_per_s",
            "term_queries_per_s"}




def test_bench_oracle_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "bench", "oracle", "--small", "--json", "--targets", "gqa",
                          "lora")
    assert code == 0, err
    rows = json.loads(out)
    assert isinstance(rows, list) and [r["target"] for r in rows] == ["gqa", "lora"]
    assert set(KEYS) == REQUIRED
    for r in rows:
        assert REQUIRED <= set(r) <= REQUIRED | {"term_nodes_mean"}
        assert r["complete"] is True and r["enodes"] > 0 and r["eclasses"] > 0
        assert 0 < r["saturate_s"] < 10
        assert r["op_queries_per_s"] > 1000 and r["term_queries_per_s"] > 100


def test_bench_oracle_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "bench", "oracle", "--small", "--targets", "rmsnorm_linear",
                        "--seconds", "0.02", "--repeats", "1")
    assert code == 0
    head, row = out.strip().splitlines()
    for col in ("target", "saturate ms", "e-nodes", "e-classes", "complete", "op queries/s",
                "term queries/s"):
        assert col in head
    assert row.startswith("rmsnorm_linear") and len(row) == len(head)


def test_oracle_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "oracle", "rmsnorm_linear", "--small")
    assert code == 0, err
    assert '(Sum 64 (Mul (Div (Var "v0") (Rms 64 (Var "v0"))) (Var "v1")))' in out
    assert "KernelGraph(2 inputs, 2 operators)" in out
    assert "complete True" in out and " NO" not in out
    assert "unreachable" in out and "reachable " in out  # derived questions of both kinds
    assert "swapped" in out


def test_oracle_queries(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "oracle", "gqa", "--small", "--batch", "2", "--query",
                        '(Sum 64 (Exp (Sum 16 (Mul (Var "v0") (Var "v1")))))',
                        '(Exp (Var "v2"))')
    assert code == 0
    lines = out.splitlines()
    assert any(l.split()[:1] == ["reachable"] and "(Sum 64 (Exp" in l for l in lines)
    assert any(l.split()[:1] == ["unreachable"] and "(Exp (Var" in l for l in lines)
    assert "(4, 16, 16)" in out  # batch 2: 2b heads


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    lines = out.strip().splitlines()
    assert [l.split()[0] for l in lines] == benchmarks.names(unseen=True)
    assert benchmarks.describe("lora") in out
    outside = [l.split()[0] for l in lines if "outside the paper's eight" in l]
    assert outside == list(benchmarks.UNSEEN)


@pytest.mark.parametrize("argv,needle", [
    (["oracle", "nosuch"], "nosuch"),
    (["oracle", "gqa", "--small", "--query", "(Sum 64"], "missing ')'"),
    (["oracle", "gqa", "--batch", "0"], "batch"),
    (["bench", "oracle", "--targets", "nosuch"], "nosuch"),
])
def test_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                             needle: str) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.startswith("error:") and needle in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err + out


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys)
    assert code == 2 and "usage" in err
    code, _, err = run_cli(capsys, "bench")
    assert code == 2
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "oracle" in out


def test_svg(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    pytest.importorskip("egraph_mirage.viz")
    import shutil

    if shutil.which("dot") is None:
        pytest.skip("graphviz 'dot' not installed")
    path = tmp_path / "eg.svg"
    code, _, err = run_cli(capsys, "oracle", "gated_mlp", "--small", "--svg", str(path))
    assert code == 0, err
    assert path.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_optimize_writes_the_best_mugraph(tmp_path, capsys):
    from egraph_mirage.cli import main

    code = main(["optimize", "rmsnorm_linear", "--small", "--workers", "1", "--max-results", "1",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "best: 1 kernel(s)" in out
    assert (tmp_path / "best.json").exists() and (tmp_path / "search.ckpt").exists()


def test_optimize_names_a_missing_program(capsys):
    from egraph_mirage.cli import main

    assert main(["optimize", "no_such_program"]) == 2
    assert "neither a benchmark" in capsys.readouterr().err


@pytest.mark.parametrize("argv, option", [
    (["--budget", "nan"], "--budget"),
    (["--budget=-inf"], "--budget"),
    (["--budget", "0"], "--budget"),
    (["--budget", "-5"], "--budget"),
    (["--max-results", "-1"], "--max-results"),
    (["--max-results", "0"], "--max-results"),
    (["--max-tasks", "0"], "--max-tasks"),
    (["--workers", "0"], "--workers"),
    (["--progress-interval", "-1"], "--progress-interval"),
    (["--progress-interval", "nan"], "--progress-interval"),
])
def test_optimize_refuses_budgets_that_cannot_be_meant(capsys: pytest.CaptureFixture[str],
                                                       tmp_path, argv: list[str],
                                                       option: str) -> None:
    code, out, err = run_cli(capsys, "optimize", "rmsnorm_linear", "--small", "--out",
                          str(tmp_path / "out"), *argv)
    assert code == 2
    assert err.startswith(f"error: {option} must be") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err + out and not (tmp_path / "out").exists()


@pytest.mark.parametrize("budget", ["nan", "0", "-1"])
def test_bench_search_refuses_a_budget_that_cannot_be_meant(capsys: pytest.CaptureFixture[str],
                                                            budget: str) -> None:
    code, _, err = run_cli(capsys, "bench", "search", "--small", "--programs", "ntrans",
                        f"--budget={budget}")
    assert code == 2 and err.startswith("error: --budget must be")


def test_optimize_with_a_task_budget_and_rules(capsys: pytest.CaptureFixture[str],
                                               tmp_path) -> None:
    """--max-tasks bounds the search by work; --rules and --extra-rules (several files, or the
    option repeated) reach the oracle, and the checkpoint records them."""
    import shutil

    from egraph_mirage.oracle.rules import DEFAULT_RULES_DIR

    rules = tmp_path / "rules"
    shutil.copytree(DEFAULT_RULES_DIR, rules)
    one, two = tmp_path / "50_one.egg", tmp_path / "51_zero.egg"
    one.write_text("(rewrite (Mul (Num 1) a) a)  ; one is the unit of mul\n")
    two.write_text("(rewrite (Add (Num 0) a) a)  ; zero is the unit of add\n")
    out = tmp_path / "out"
    common = ["optimize", "rmsnorm_linear", "--small", "--workers", "1", "--max-tasks", "3",
              "--out", str(out)]
    code, text, err = run_cli(capsys, *common, "--rules", str(rules), "--extra-rules", str(one),
                           str(two))
    assert code == 1, err  # three tasks find nothing at small shapes
    assert re.search(r" 3/\d+ tasks \(task budget reached\)", text), text
    assert re.search(r"task budget \(max_tasks 3\) was reached at 3/\d+ tasks", text), text
    code, text, err = run_cli(capsys, *common, "--rules", str(rules), "--extra-rules", str(one),
                           "--extra-rules", str(two))
    assert code == 1, err  # the same rules: resumed from the checkpoint
    assert "resumed 3 task(s) from" in text and "resumed from" in err, text + err
    code, _, err = run_cli(capsys, *common, "--extra-rules", str(one))
    assert code == 2 and "rule set" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, *common, "--rules", str(tmp_path / "missing"))
    assert code == 2 and "no such rule file" in err


def test_rules_lists_the_files_and_prints_the_generated_prelude(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "rules")
    assert code == 0 and "10_algebra.egg" in out and "digest " in out
    code, out, _ = run_cli(capsys, "rules", "--prelude")
    assert code == 0 and out.startswith("; The term language")
    assert "(datatype Expr" in out and "(rule ((Reach (Exp a0))) ((Reach a0)))" in out
    code, _, err = run_cli(capsys, "rules", "--rules", "no/such/folder")
    assert code == 2 and err.startswith("error: no/such/folder")


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_an_unwritable_out_folder_is_a_one_line_error(capsys: pytest.CaptureFixture[str],
                                                      tmp_path, where: str) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    out = f if where == "file" else f / "sub"
    code, _, err = run_cli(capsys, "optimize", "rmsnorm_linear", "--small", "--max-tasks", "1",
                        "--workers", "1", "--out", str(out))
    assert code == 2 and err.startswith(f"error: --out {out}: cannot write there")
    assert len(err.strip().splitlines()) == 1


def test_a_failing_build_function_is_a_one_line_error(capsys: pytest.CaptureFixture[str],
                                                      tmp_path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text("def build():\n    raise RuntimeError('boom')\n")
    code, _, err = run_cli(capsys, "optimize", str(prog), "--max-tasks", "1", "--out",
                        str(tmp_path / "out"))
    assert code == 2 and err.strip() == f"error: {prog}: build() failed: RuntimeError: boom"


@pytest.mark.parametrize("command", [["bench", "search"], ["bench", "gpu"],
                                     ["bench", "gpu", "--from-search"]])
def test_bench_dtype_flag(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    """``--dtype`` of ``bench search`` and ``bench gpu``: float16 unless given, bfloat16 on
    request, nothing else (``tests/test_search_bench.py`` and ``tests/test_gpu_bench.py``
    follow it to the rows and the folders)."""
    assert _parser().parse_args(command).dtype == "float16"
    assert _parser().parse_args([*command, "--dtype", "bfloat16"]).dtype == "bfloat16"
    code, _, err = run_cli(capsys, *command, "--dtype", "float32")
    assert code == 2 and "--dtype: invalid choice: 'float32'" in err


def test_log_prints_the_packages_records_of_that_level(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """``--log info`` (before the command) prints the package's INFO records to stderr (the
    torch backend's compile stages as they end), once however often the CLI runs in a
    process; by default only warnings reach stderr."""
    import logging

    logger = logging.getLogger("egraph_mirage")
    level, handlers = logger.level, list(logger.handlers)
    try:
        for _ in range(2):
            code, _, _ = run_cli(capsys, "--log", "info", "list")
            assert code == 0
        logging.getLogger("egraph_mirage.fx").info("egraph-mirage: graph 0: partition 0.1 s")
        err = capsys.readouterr().err
        assert err.count("egraph-mirage: graph 0: partition 0.1 s") == 1
        assert len(logger.handlers) == len(handlers) + 1
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers
    code, _, err = run_cli(capsys, "--log", "loud", "list")
    assert code == 2 and "--log" in err
