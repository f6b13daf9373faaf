"""The package installs with its rule files: from a wheel, and in editable mode.

A wheel carries ``rules/*.egg`` inside the package (``egraph_mirage/_rules``, mapped onto the
top-level ``rules/`` folder by pyproject.toml) and its oracle reads them there; an editable
install reads the checkout's ``rules/`` itself, so edits to the rules take effect. Both are built
offline from a copy of the checkout (``pip --no-build-isolation --no-index``, with the setuptools
at hand) and used from a folder outside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: an oracle question whose answer needs the rules: the division moved after the matmul
CHECK = """
import sys
import egraph_mirage as em
from egraph_mirage.oracle.rules import DEFAULT_RULES_DIR

g = em.benchmarks.get("rmsnorm_linear", small=True)
oracle = em.Oracle(g)
print(em.__file__)
print(DEFAULT_RULES_DIR)
print(oracle.is_subexpr('(Div (Sum 64 (Mul (Var "v0") (Var "v1"))) (Rms 64 (Var "v0")))'))
print(oracle.is_subexpr('(Exp (Var "v0"))'))
"""


def _needs_wheel_support() -> None:
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    if (major, minor) < (70, 1):  # older setuptools build wheels through the `wheel` package
        pytest.importorskip("wheel")


def _source(tmp: Path) -> Path:
    """A copy of what a build reads from the checkout (the build writes next to it)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("egraph_mirage", "rules"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    return src


def _pip(*args: str | Path, env: dict[str, str] | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"


def _check(python: str | Path, cwd: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[-5:-1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def test_the_package_list_names_every_package() -> None:
    """pyproject.toml lists the packages by name; a new subpackage must be added there."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "egraph_mirage").rglob("__init__.py")}
    assert listed == found | {"egraph_mirage._rules"}


def test_a_wheel_carries_the_rules(tmp_path: Path) -> None:
    _needs_wheel_support()
    src = _source(tmp_path)
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, src)
    (wheel,) = wheels.glob("egraph_mirage-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    rules = sorted(p.name for p in (ROOT / "rules").glob("*.egg"))
    assert rules and {f"egraph_mirage/_rules/{n}" for n in rules} <= names
    assert "egraph_mirage/py.typed" in names
    _pip("install", "--no-deps", "--no-index", "--target", site, wheel)
    module, rules_dir, reachable, unreachable = _check(sys.executable, elsewhere,
                                                       _env(PYTHONPATH=str(site)))
    assert Path(module).is_relative_to(site)
    assert Path(rules_dir) == site / "egraph_mirage" / "_rules"
    assert (reachable, unreachable) == ("True", "False")


def test_an_editable_install_reads_the_checkout_s_rules(tmp_path: Path) -> None:
    _needs_wheel_support()
    src = _source(tmp_path)
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    done = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "-q",
                           "install", "--no-deps", "--no-build-isolation", "--no-index", "-e",
                           str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    module, rules_dir, reachable, unreachable = _check(python, elsewhere, _env())
    assert Path(module).is_relative_to(src)
    assert Path(rules_dir) == src / "rules"  # edits to the checkout's rules take effect
    assert (reachable, unreachable) == ("True", "False")


def test_the_checkout_reads_its_top_level_rules() -> None:
    from egraph_mirage.oracle.rules import DEFAULT_RULES_DIR

    assert DEFAULT_RULES_DIR == ROOT / "rules"
