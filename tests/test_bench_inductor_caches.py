"""Each mode of a benchmark compiled with Inductor caches of its own
(``bench.inductor_caches.own_caches``): its cache directory, and Inductor's in-process cache of
compiled kernels emptied before, so that no mode takes up another's kernels and their tuning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from egraph_mirage.bench.inductor_caches import CACHE_DIR, own_caches

async_compile = pytest.importorskip("torch._inductor.async_compile")


def test_a_mode_gets_a_directory_of_its_own_and_no_kernel_compiled_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = async_compile.CompiledTritonKernels
    monkeypatch.setattr(kernels, "_cache", {"earlier kernel": object()})
    monkeypatch.setenv(CACHE_DIR, str(tmp_path))
    with own_caches("egraph_mirage-max-autotune") as path:
        assert os.environ[CACHE_DIR] == path == str(tmp_path / "mode-egraph_mirage-max-autotune")
        assert Path(path).is_dir() and kernels._cache == {}
    assert os.environ[CACHE_DIR] == str(tmp_path)


def test_a_second_compilation_of_a_mode_may_take_up_its_own_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = async_compile.CompiledTritonKernels
    earlier = {"its kernel": object()}
    monkeypatch.setattr(kernels, "_cache", dict(earlier))
    monkeypatch.delenv(CACHE_DIR, raising=False)
    with own_caches("egraph_mirage", fresh=False) as path:
        assert os.environ[CACHE_DIR] == path and path.endswith(os.sep + "mode-egraph_mirage")
        assert kernels._cache == earlier
    assert CACHE_DIR not in os.environ  # unset again, as it was
