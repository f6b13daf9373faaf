"""Every notebook under notebooks/ runs without a cell error, and is committed small and
widget-free."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import find_kernel_specs
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
MAX_BYTES = 1_000_000
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="session")
def python3_kernel() -> str:
    """Make sure a ``python3`` Jupyter kernel spec exists (install ipykernel's if it does not)."""
    if "python3" not in find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user",
                        "--name", "python3"], check=True, capture_output=True)
    assert "python3" in find_kernel_specs()
    return "python3"


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, python3_kernel: str) -> None:
    nb = nbformat.read(path, as_version=4)  # an in-memory copy: the file is not rewritten
    before = path.read_bytes()
    client = NotebookClient(nb, timeout=300, kernel_name=python3_kernel, allow_errors=False,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    assert path.read_bytes() == before


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_small_and_widget_free(path: Path) -> None:
    size = path.stat().st_size
    assert size < MAX_BYTES, f"{path.name} is {size} bytes; clear large outputs"
    nb = json.loads(path.read_text(encoding="utf-8"))
    nbformat.validate(nbformat.reads(json.dumps(nb), as_version=4))
    mimes = {m for c in nb["cells"] for o in c.get("outputs", []) for m in o.get("data", {})}
    assert WIDGET_MIME not in mimes
    assert "widgets" not in nb.get("metadata", {})
    assert "vnd.jupyter.widget" not in path.read_text(encoding="utf-8")
