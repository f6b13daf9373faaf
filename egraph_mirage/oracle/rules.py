"""Loading ``rules/*.egg``: each top-level form is run on its own so errors name file and line."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RuleError
from . import egglog_compat as eg


def _default_rules_dir() -> Path:
    """The rule files that ship with egraph-mirage.

    An installed wheel carries them inside the package (``egraph_mirage/_rules``, which
    pyproject.toml maps onto the repository's top-level ``rules/`` folder); a source checkout
    or an editable install has no such folder and reads the top-level ``rules/`` itself, so
    edits to it take effect at once.
    """
    package = Path(__file__).resolve().parents[1]
    shipped = package / "_rules"
    if shipped.is_dir():
        return shipped
    return package.parent / "rules"


#: The folder of rule files an ``Oracle`` loads unless told otherwise (see ``_default_rules_dir``).
DEFAULT_RULES_DIR = _default_rules_dir()


@dataclass(frozen=True)
class Form:
    """One top-level s-expression of a rule file."""

    path: str
    line: int
    text: str


def split_forms(text: str, path: str) -> list[Form]:
    """Top-level forms of ``text`` with the line each starts on; unbalanced parens are a
    RuleError."""
    forms: list[Form] = []
    depth, start, start_line, line = 0, -1, 0, 1
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c == ";":
            while i + 1 < n and text[i + 1] != "\n":
                i += 1
        elif c == '"' and depth > 0:
            j = i + 1
            while j < n and text[j] != '"':
                if text[j] == "\n":
                    raise RuleError(path, line, "string not closed on its line")
                j += 2 if text[j] == "\\" else 1
            i = j
        elif c == "(":
            if depth == 0:
                start, start_line = i, line
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                raise RuleError(path, line, "')' without a matching '('")
            if depth == 0:
                forms.append(Form(path, start_line, text[start : i + 1]))
        elif depth == 0 and not c.isspace():
            raise RuleError(path, line, f"text outside a form: {text[i:].split()[0]!r}")
        i += 1
    if depth > 0:
        raise RuleError(path, start_line, "'(' not closed before the end of the file")
    return forms


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand folders to their ``*.egg`` files (sorted by name); missing paths are a RuleError."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(p.glob("*.egg"))
            if not files:
                raise RuleError(str(p), 0, "folder holds no .egg rule files")
            out.extend(files)
        elif p.is_file():
            out.append(p)
        else:
            raise RuleError(str(p), 0, "no such rule file or folder")
    return out


def rules_digest(paths: Iterable[str | Path], prelude: str = "") -> str:
    """A SHA-256 hex digest of the rules an oracle loads from ``paths``, in loading order.

    ``prelude`` (egglog text run before the files) is hashed first, then the contents of every
    rule file (folders expanded as ``rule_files`` does); file names and locations do not count,
    so a copy of a folder has the digest of its original. Checkpoints record it, so a search
    made under other rules is not resumed.
    """
    h = hashlib.sha256()

    def part(data: bytes) -> None:  # length-prefixed: no two sequences of parts collide
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(prelude.encode())
    for f in rule_files(paths):
        try:
            part(f.read_bytes())
        except OSError as exc:
            raise RuleError(str(f), 0, f"cannot read: {exc}") from None
    return h.hexdigest()


def load_rules(egraph: Any, paths: Sequence[str | Path]) -> list[Form]:
    """Run every form of every rule file on ``egraph``; returns the forms that were run.

    A form egglog refuses, or on which it panics (a rule given twice), is a ``RuleError`` naming
    the file and line, with egglog's one-line reason; egglog's native output (a panic message,
    a Rust backtrace) is captured, not printed.
    """
    loaded: list[Form] = []
    for f in rule_files(paths):
        try:
            text = f.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise RuleError(str(f), 0, f"cannot read: {exc}") from None
        loaded += run_forms(egraph, split_forms(text, str(f)))
    return loaded


def run_forms(egraph: Any, forms: Sequence[Form]) -> list[Form]:
    """Run ``forms`` on ``egraph`` one at a time; a form egglog refuses or panics on is a
    ``RuleError`` naming its file and line, with egglog's native output captured."""
    for form in forms:
        err = eg.NativeStderr()
        try:
            with err:
                eg.run_text(egraph, form.text)
        except BaseException as exc:  # egglog's errors, and its panics (PanicException)
            if eg.is_interrupt(exc):
                raise
            raise RuleError(form.path, form.line, eg.failure_message(exc, err.text)) from None
    return list(forms)
