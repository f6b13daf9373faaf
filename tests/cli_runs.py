"""What the command-line tests share: one call of ``egraph-mirage``'s ``main`` and what it
printed."""

from __future__ import annotations

import pytest

from egraph_mirage.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``egraph-mirage ARGV...`` in this process: its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
