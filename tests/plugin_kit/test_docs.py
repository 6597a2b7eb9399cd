"""docs/plugins.md documents every hook, public name and config key, and is current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import scow.core
from scow.core.address_settings import ADDRESS_SETTING_DOCS
from scow.core.config import QUEUE_SETTINGS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location(
        "generate_plugins", ROOT / "docs/generate_plugins.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def text(generator):
    return generator.render()


def test_plugins_md_is_current(generator, text):
    assert (ROOT / "docs/plugins.md").read_text() == text, (
        "docs/plugins.md is stale: run `python docs/generate_plugins.py`"
    )


def test_every_hook_is_documented_in_lifecycle_order(generator, text):
    hooks = generator.hooks()
    assert len(hooks) >= 14
    positions = []
    for hook in hooks:
        assert (hook.__doc__ or "").strip(), f"hook {hook.__name__} has no docstring"
        heading = f"### `{hook.__name__}`"
        assert heading in text, f"hook {hook.__name__} is missing from docs/plugins.md"
        positions.append(text.index(heading))
    assert positions == sorted(positions)


def test_every_hook_is_exercised_by_a_test(generator):
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    untested = [h.__name__ for h in generator.hooks() if h.__name__ not in tests]
    assert not untested, f"hooks no test names: {untested}"


def test_every_config_key_is_documented(generator, text):
    sections = generator.builtin_sections()
    assert {"broker", "amqp", "paging", "journal"} <= {s.name for _, s in sections}
    for owner, section in sections:
        assert section.doc.strip(), f"[{section.name}] ({owner}) has no description"
        for setting in section.settings:
            where = f"[{section.name}] {setting.name} ({owner})"
            assert setting.doc.strip(), f"{where} has no documentation"
            assert f"| `{setting.name}` |" in text, f"{where} is missing from docs/plugins.md"
    for name, doc in [
        *ADDRESS_SETTING_DOCS.items(),
        *((s.name, s.doc) for s in QUEUE_SETTINGS.settings),
    ]:
        assert doc.strip(), f"setting {name} has no documentation"
        assert f"| `{name}` |" in text, f"setting {name} is missing from docs/plugins.md"


def test_every_public_name_is_described(generator, text):
    for name in scow.core.__all__:
        line = generator._one_line(getattr(scow.core, name), name)
        assert line, f"scow.core.{name} has no docstring (or CONSTANT_DOCS entry)"
        assert f"| `{name}` |" in text
