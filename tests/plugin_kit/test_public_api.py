"""The public plugin API (`scow.core`) and the hook API version."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

import scow.core
from scow.core.hookspecs import HOOK_API_VERSION
from scow.core.plugins import PluginError, PluginManager, api_supported
from scow.core.testing import BrokerThread, broker_config, write_config

ROOT = Path(__file__).resolve().parents[2]

#: What plugins of each kind import; a name dropped from `scow.core` fails here first.
NEEDED = {
    # every plugin
    "hookimpl", "HOOK_API_VERSION", "ConfigSection", "Setting", "Config", "Broker",
    "BrokerError", "InvalidField", "NotFound", "NotAllowed", "ResourceLimitExceeded",
    "ResourceLocked", "Unauthorized", "Principal", "PERMISSIONS", "command_group",
    # registration
    "QueueType", "JournalBackend", "PageStoreBackend", "FullPolicyType", "ProtocolType",
    # storage backends
    "Journal", "LoadResult", "RecordInfo", "PreparedTransaction", "Completion", "PageStore",
    "frame_all", "iter_frames", "valid_length",
    # queues and policies
    "Queue", "QueueSpec", "Consumer", "Cursor", "Pager", "FullPolicy", "AddressInfo",
    "Entry", "Message", "MessageRef", "RoutingType", "RouteStatus",
    # protocols and services
    "ProtocolServer", "Service", "MessageFormat", "ConnectionInfo", "Transaction",
    "parse_host_port", "ManagementOperation",
}  # fmt: skip


def test_every_name_a_plugin_needs_is_public():
    assert set(scow.core.__all__) >= NEEDED, sorted(NEEDED - set(scow.core.__all__))


def test_every_public_name_resolves():
    for name in scow.core.__all__:
        assert getattr(scow.core, name) is not None, name


def _scow_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [m for m in found if m == "scow" or m.startswith("scow.")]


#: Modules a third-party plugin's tests may import besides the API: the testing kit.
TEST_KIT = {
    "scow.core.testing",
    "scow.core.conformance.journal",
    "scow.core.conformance.page_store",
    "scow.core.conformance.queue_type",
    "scow.core.conformance.full_policy",
    "scow.core.conformance.protocol",
}


@pytest.mark.parametrize("example", ["scow-stomp", "plugin-template"])
def test_the_examples_import_only_the_public_api(example):
    files = sorted((ROOT / "examples" / example).rglob("*.py"))
    assert files
    for path in files:
        allowed = {"scow.core"} | (TEST_KIT if "tests" in path.parts else set())
        private = [m for m in _scow_imports(path) if m not in allowed]
        assert not private, f"{path.relative_to(ROOT)} imports private modules {private}"


def _plugin(declared: str) -> types.ModuleType:
    module = types.ModuleType("future_plugin")
    module.SCOW_HOOK_API = declared  # type: ignore[attr-defined]
    return module


def test_a_plugin_for_another_hook_api_is_refused_naming_both_versions(tmp_path):
    config = write_config(tmp_path / "scow.toml", broker_config(tmp_path / "data"))
    with pytest.raises(PluginError) as refused:
        BrokerThread(config, {"future": _plugin(">=2.0,<3")}).start()
    message = str(refused.value)
    assert "plugin 'future'" in message
    assert ">=2.0,<3" in message and f"hook API {HOOK_API_VERSION}" in message


def test_a_plugin_in_range_or_declaring_nothing_is_loaded():
    plugins = PluginManager()
    plugins.register(
        _plugin(f">={HOOK_API_VERSION},<{int(HOOK_API_VERSION.split('.')[0]) + 1}"), "ok"
    )
    plugins.register(types.ModuleType("silent"), "silent")
    assert {"ok", "silent"} <= set(plugins.names())


def test_an_unreadable_range_is_refused_saying_what_is_accepted():
    with pytest.raises(PluginError, match=r"cannot read '~=1.0'.*operators"):
        PluginManager().register(_plugin("~=1.0"), "odd")


@pytest.mark.parametrize(
    ("declared", "version", "supported"),
    [
        (">=1.0,<2", "1.0", True),
        (">=1.0,<2", "1.7", True),
        (">=1.0,<2", "2.0", False),
        (">1.1", "1.1", False),
        ("==1", "1.0", True),
        ("!=1.3", "1.3", False),
        ("<=1.2", "1.10", False),  # versions compare as numbers, not text
    ],
)
def test_version_ranges(declared, version, supported):
    assert api_supported(declared, version) is supported
