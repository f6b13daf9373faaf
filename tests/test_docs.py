"""The README's examples run as written, its links and the docs' lead somewhere, and the code
stays within the style budget."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_has_examples() -> None:
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples may write files
    monkeypatch.setenv("EGRAPH_MIRAGE_CACHE", str(tmp_path / "cache"))  # and fill caches
    exec(compile(SNIPPETS[index], f"README.md example {index}", "exec"), {})


def test_the_readme_is_short_and_starts_with_the_set_up_commands() -> None:
    """The two commands CI and the issue name, within the first screen; the rest in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines: move reference to docs/"
    first_screen = "\n".join(lines[:40])
    for command in ("bash scripts/setup.sh && python3 -m egraph_mirage optimize rmsnorm_linear "
                    "--budget 60", "bash scripts/setup.sh --dev && python3 -m pytest -q -n 2"):
        assert command in first_screen, command


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", ["README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_lead_somewhere(doc: str) -> None:
    """Every relative link of the README and docs/ names a file that exists, and an anchor
    names a heading of it."""
    path = ROOT / doc
    text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", path.read_text(), flags=re.S))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", dest.read_text(), re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{doc}: broken links {broken}"


def test_modules_stay_under_800_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "egraph_mirage").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 800}
    assert not long, f"modules over 800 lines: {long}"


def test_ruff_clean() -> None:
    """ruff is a dev dependency (pip install -e '.[dev]')."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "egraph_mirage", "tests"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_operator_is_listed_in_the_expressions_doc() -> None:
    """docs/expressions.md names each op-table entry (a graph-defined kernel is no expression)."""
    from egraph_mirage.ops import OPS

    text = (Path(__file__).resolve().parents[1] / "docs" / "expressions.md").read_text()
    missing = [n for n in OPS if n != "customized" and f"`{n}`" not in text
               and f"`{n}(" not in text]
    assert not missing, f"docs/expressions.md does not list {missing}"
