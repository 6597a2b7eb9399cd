"""The plugin template installs into a fresh venv (no system site-packages) with Scow and
passes its own tests there: what a third-party author starting from it would get."""

from __future__ import annotations

import tomllib

from tests.fresh_venv import ROOT, copy_tree, pip_install, run

TEMPLATE = ROOT / "examples" / "plugin-template"


def _pytest_pin() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(r for r in project["optional-dependencies"]["test"] if r.startswith("pytest"))


def test_the_template_passes_its_tests_in_a_fresh_venv(fresh_venv, tmp_path):
    template = copy_tree(
        TEMPLATE, tmp_path / "template", ("pyproject.toml", "scow_example_policy", "tests")
    )
    pip_install(fresh_venv, template, _pytest_pin())
    python = fresh_venv / "bin" / "python"
    where = run(python, "-c", "import scow_example_policy; print(scow_example_policy.__file__)")
    assert where.stdout.startswith(str(fresh_venv)), where.stdout
    result = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=template, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and "failed" not in result.stdout, result.stdout
