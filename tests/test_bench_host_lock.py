"""Benchmarks sharing a host take turns at timing (``bench.host_lock``): compilations hold the
lock file shared, timings hold it alone, so that plain launches (bound by the host) are never
timed beside another GPU's compilation. The lock's state is read with non-blocking ``flock``
attempts: nothing here waits."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from egraph_mirage.bench import torch_bench as tb
from egraph_mirage.bench.host_lock import HostLock


def _can(path: Path, how: int) -> bool:
    """Whether another holder could take the lock ``how`` now."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_compilations_share_the_lock_and_a_timing_holds_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "host.lock"
    lock, other = HostLock(str(path)), HostLock(str(path))
    with lock.compiling():
        assert _can(path, fcntl.LOCK_SH) and not _can(path, fcntl.LOCK_EX)
        with other.compiling():  # another benchmark's compilation runs beside it
            assert not _can(path, fcntl.LOCK_EX)
    assert _can(path, fcntl.LOCK_EX)
    with lock.timing():
        assert not _can(path, fcntl.LOCK_SH) and not _can(path, fcntl.LOCK_EX)
    assert _can(path, fcntl.LOCK_EX)  # released, also after an error:
    with pytest.raises(RuntimeError), lock.timing():
        raise RuntimeError("timing failed")
    assert _can(path, fcntl.LOCK_EX)


def test_without_a_path_nothing_is_locked() -> None:
    with HostLock().timing(), HostLock().compiling():
        pass


def test_bench_torch_compiles_holding_the_lock_shared_and_times_holding_it_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "host.lock"
    held: list[tuple[str, bool, bool]] = []
    prepare, time = tb._prepare, tb._time

    def prepared(row: dict[str, Any], *args: Any) -> None:
        held.append(("compile", _can(path, fcntl.LOCK_SH), _can(path, fcntl.LOCK_EX)))
        prepare(row, *args)

    def timed(*args: Any) -> None:
        held.append(("time", _can(path, fcntl.LOCK_SH), _can(path, fcntl.LOCK_EX)))
        time(*args)

    monkeypatch.setattr(tb, "_compiled", lambda module, mode, cfg: (module, None))
    monkeypatch.setattr(tb, "_prepare", prepared)
    monkeypatch.setattr(tb, "_time", timed)
    cfg = tb.TorchBenchConfig(models=("llama",), batches=(2,), preset="small",
                              modes=("eager", "compile"), rest="eager", device="cpu",
                              cache_dir=str(tmp_path), host_lock=str(path))
    rows = tb.bench_torch(cfg, timer=tb.CpuTimer(repeats=1), log=lambda _: None)
    assert all(r["error"] is None for r in rows)
    assert held == [("compile", True, False), ("compile", True, False), ("time", False, False)]
    assert _can(path, fcntl.LOCK_EX)


def test_the_bench_commands_take_the_lock_file_as_an_option() -> None:
    import argparse

    from egraph_mirage.bench import generate_bench as gb

    for add in (tb.add_arguments, gb.add_arguments):
        p = argparse.ArgumentParser()
        add(p)
        assert p.parse_args(["--host-lock", "/tmp/x.lock"]).host_lock == "/tmp/x.lock"
        assert p.parse_args([]).host_lock is None
