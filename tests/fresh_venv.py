"""Scow installed from this checkout into a fresh venv: what `pip install scow` gives a user."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What building the scow distribution needs of the checkout.
SCOW_SOURCES = ("pyproject.toml", "README.md", "core", "plugins", "protocols", "config")


def copy_tree(source: Path, target: Path, names: tuple[str, ...]) -> Path:
    """Copy `names` of `source`: pip builds in the source tree, and the checkout must
    stay untouched (others build and test in it at the same time)."""
    target.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".venv", "data", "*.so")
    for name in names:
        path = source / name
        if path.is_dir():
            shutil.copytree(path, target / name, ignore=ignore)
        else:
            shutil.copy2(path, target / name)
    return target


def run(
    *command: object, cwd: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    if check:
        assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result


def pip_install(venv: Path, *requirements: object) -> None:
    """This environment's pip installs into `venv` (no pip bootstrap there); pinned
    dependencies come from the index and pip's wheel cache."""
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "-q",
        *requirements,
    )


def make_venv(directory: Path) -> Path:
    """A venv under `directory` with Scow from this checkout, no extras; returns the venv."""
    scow = copy_tree(ROOT, directory / "scow", SCOW_SOURCES)
    venv = directory / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    pip_install(venv, scow)
    where = run(venv / "bin" / "python", "-c", "import scow.core; print(scow.core.__file__)")
    assert where.stdout.startswith(str(venv)), where.stdout  # not this checkout's sources
    return venv
