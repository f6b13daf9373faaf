"""Shared test set-up: GPU tests run only where a CUDA device is present."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none present)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with no Graphviz ``dot`` on it; returns an empty folder to write into."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    out = tmp_path / "out"
    out.mkdir()
    return out


@pytest.fixture(scope="module")
def rmsnorm() -> Any:
    """RMSNorm + Linear at small shapes, the search tests' program."""
    import egraph_mirage as em

    return em.benchmarks.get("rmsnorm_linear", small=True)


@pytest.fixture
def fresh_dynamo() -> Any:
    """Dynamo's caches reset before and after the test: a compilation of one test is never
    found by another (``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``)."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
