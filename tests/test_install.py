"""`pip install .` gives a package that runs: the wheel ships every module of the source tree, and its console
scripts (memagent-train, -evaluate, -ask, -serve) start outside the checkout, from the installed copy.

The wheel is built from a copy of the package (the checkout stays untouched) and installed, without its
dependencies, into a fresh venv that sees this interpreter's site-packages for torch and the rest. The checkout's
own editable install is not on that venv's path: a line in a .pth file adds the directory but runs none of the .pth
files inside it, so the editable finder stays off.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("memagent-train", "memagent-evaluate", "memagent-ask", "memagent-serve")

pytestmark = pytest.mark.slow  # builds a wheel and starts four interpreters that import torch


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--no-input", *args], check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the built wheel, the venv it is installed in)."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"
    shutil.copytree(ROOT / "memagent", source / "memagent", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip("wheel", "--no-index", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp / "wheels"), str(source))
    wheel = next((tmp / "wheels").glob("memagent-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    installed = next(env_dir.glob("lib/python*/site-packages"))
    (installed / "dependencies.pth").write_text(f"{site.getsitepackages()[0]}\n")
    pip("--python", str(env_dir / "bin" / "python"), "install", "--no-index", "--no-deps", "--ignore-installed",
        str(wheel))
    return wheel, env_dir


def test_the_wheel_ships_every_module_of_the_source_tree(install: tuple[Path, Path]) -> None:
    wheel, _ = install
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "memagent").rglob("*.py")}
    assert source - shipped == set(), "a directory without __init__.py is left out of the wheel"


def test_installed_console_scripts_run_outside_the_checkout(install: tuple[Path, Path], tmp_path: Path) -> None:
    _, env_dir = install
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEMAGENT_DEBUG")}
    where = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import memagent.train; print(memagent.train.__file__)"],
                           cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert Path(where.stdout.strip()).is_relative_to(env_dir), f"imported the checkout: {where.stdout}"
    for command in COMMANDS:
        proc = subprocess.run([str(env_dir / "bin" / command), "--help"], cwd=tmp_path, env=environ,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{command}: {proc.stderr[-2000:]}"
        assert proc.stdout.startswith("usage:"), f"{command}: {proc.stdout[:200]}"
