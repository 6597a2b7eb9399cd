"""The plugin template installs into a fresh venv (no system site-packages) with Scow and
passes its own tests there: what a third-party author starting from it would get."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "plugin-template"
#: What building the scow distribution needs of the checkout.
SCOW_SOURCES = ("pyproject.toml", "README.md", "core", "plugins", "protocols", "config")


def _copy(source: Path, target: Path, names: tuple[str, ...]) -> Path:
    """Copy `names` of `source`: pip builds in the source tree, and the checkout must
    stay untouched (others build and test in it at the same time)."""
    target.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".venv", "data")
    for name in names:
        path = source / name
        if path.is_dir():
            shutil.copytree(path, target / name, ignore=ignore)
        else:
            shutil.copy2(path, target / name)
    return target


def _pytest_pin() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(r for r in project["optional-dependencies"]["test"] if r.startswith("pytest"))


def _run(
    *command: object, cwd: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    if check:
        assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result


def test_the_template_passes_its_tests_in_a_fresh_venv(tmp_path):
    scow = _copy(ROOT, tmp_path / "scow", SCOW_SOURCES)
    template = _copy(
        TEMPLATE, tmp_path / "template", ("pyproject.toml", "scow_example_policy", "tests")
    )
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    # this environment's pip installs into the new venv (no pip bootstrap there); scow's
    # pinned dependencies come from the index and pip's wheel cache
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        scow,
        template,
        _pytest_pin(),
    )
    where = _run(python, "-c", "import scow.core, scow_example_policy; print(scow.core.__file__)")
    assert where.stdout.startswith(str(venv)), where.stdout  # not this checkout's sources
    result = _run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=template, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and "failed" not in result.stdout, result.stdout
