"""The kernel's own promises: its boundary, its packaging and its documented hooks."""

from __future__ import annotations

import ast
import inspect
import tomllib
from pathlib import Path

import pluggy
import pytest

from scow.core import hookimpl, hookspecs
from scow.core.plugins import PluginError, PluginManager, installed_plugins

ROOT = Path(__file__).resolve().parents[2]


def test_kernel_never_imports_a_plugin_or_protocol():
    offenders = []
    for path in (ROOT / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith(("scow.plugins", "scow.protocols", "core.", "plugins.")):
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def test_every_package_directory_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    # a directory mapped to a package of its own (pyspark_scow under plugins/spark) is it
    mapped = {ROOT / directory: package for package, directory in setuptools["package-dir"].items()}
    found = set()
    for top in ("core", "plugins", "protocols", "config"):
        for init in (ROOT / top).rglob("__init__.py"):
            directory = init.parent
            owner = next(d for d in (directory, *directory.parents) if d in mapped)
            rel = directory.relative_to(owner).parts
            found.add(".".join((mapped[owner], *rel)))
    assert "pyspark_scow" in found
    assert found - listed == set()


def test_every_hookspec_is_documented_and_typed():
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction):
        if not name.startswith("scow_"):
            continue
        assert fn.__doc__ and len(fn.__doc__.strip()) > 20, name
        assert "return" in fn.__annotations__, name


def test_builtin_plugins_are_installed_as_entry_points():
    assert {"amqp", "memory-journal", "standard-queues", "full-policies"} <= set(
        installed_plugins()
    )


def test_unknown_plugin_name_suggests_the_close_one():
    with pytest.raises(PluginError, match="unknown plugin 'amqq'; did you mean 'amqp'"):
        PluginManager().load(["amqq"])


def test_misspelled_hook_is_refused():
    class Typo:
        @hookimpl
        def scow_register_queue_type(self):  # missing the final s
            return []

    manager = PluginManager()
    manager.register(Typo(), "typo")
    with pytest.raises(PluginError, match="scow_register_queue_type"):
        manager.validate()


def test_async_hook_implementation_is_refused():
    class Async:
        @hookimpl
        async def scow_broker_started(self, broker):
            pass

    with pytest.raises(PluginError, match="async"):
        PluginManager().register(Async(), "async")


def test_same_plugin_name_twice_is_refused():
    manager = PluginManager()
    manager.register(object(), "x")
    with pytest.raises(PluginError, match="registered twice"):
        manager.register(object(), "x")


def test_hook_tracing_is_switched_on_by_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("SCOW_TRACE_PLUGINS", "1")
    manager = PluginManager()
    manager.load(["standard-queues"])
    manager.hook.scow_register_queue_types()
    assert "scow_register_queue_types" in capsys.readouterr().err
    assert isinstance(manager.pm, pluggy.PluginManager)
