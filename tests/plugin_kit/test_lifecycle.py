"""Every hook runs when docs/plugins.md says, in that order, for a plugin under test."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from proton import Message

from scow.core import ConfigSection, QueueType, Setting, hookimpl
from scow.core.plugins import PluginError, PluginManager
from scow.core.testing import BrokerThread, broker_config, write_config
from tests.wire.helpers import connected

REGISTRATIONS = {
    "scow_register_queue_types",
    "scow_register_journals",
    "scow_register_page_stores",
    "scow_register_full_policies",
    "scow_register_protocols",
}


class Recorder:
    """A plugin implementing every hook; remembers the order they were called in."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.config: Any = None

    @hookimpl
    def scow_config_sections(self) -> list[ConfigSection]:
        self.calls.append("scow_config_sections")
        return [ConfigSection("recorder", (Setting("colour", str, "red", "A colour."),), "Test.")]

    @hookimpl
    def scow_add_commands(self, subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
        self.calls.append("scow_add_commands")
        command = subparsers.add_parser("record")
        command.set_defaults(handler=lambda args: 7)

    @hookimpl
    def scow_register_queue_types(self) -> list[QueueType]:
        self.calls.append("scow_register_queue_types")
        return []

    @hookimpl
    def scow_register_journals(self) -> list[Any]:
        self.calls.append("scow_register_journals")
        return []

    @hookimpl
    def scow_register_page_stores(self) -> list[Any]:
        self.calls.append("scow_register_page_stores")
        return []

    @hookimpl
    def scow_register_full_policies(self) -> list[Any]:
        self.calls.append("scow_register_full_policies")
        return []

    @hookimpl
    def scow_register_protocols(self) -> list[Any]:
        self.calls.append("scow_register_protocols")
        return []

    @hookimpl
    def scow_configure(self, config: Any) -> None:
        self.calls.append("scow_configure")
        self.config = config

    @hookimpl
    def scow_services(self, broker: Any) -> list[Any]:
        self.calls.append("scow_services")
        return [_Service(self)]

    @hookimpl
    def scow_broker_started(self, broker: Any) -> None:
        self.calls.append("scow_broker_started")

    @hookimpl
    def scow_connection_opened(self, info: Any) -> None:
        self.calls.append(f"scow_connection_opened:{info.protocol}")

    @hookimpl
    def scow_management_operations(self, broker: Any) -> dict[str, Any]:
        self.calls.append("scow_management_operations")
        return {"recorder": {"PING": lambda name, body, props: (200, "OK", f"pong {name}")}}

    @hookimpl
    def scow_connection_closed(self, info: Any) -> None:
        self.calls.append(f"scow_connection_closed:{info.protocol}")

    @hookimpl
    def scow_broker_stopping(self, broker: Any) -> None:
        self.calls.append("scow_broker_stopping")


class _Service:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    async def start(self) -> None:
        self.recorder.calls.append("service start")

    async def stop(self) -> None:
        self.recorder.calls.append("service stop")


def test_hooks_run_in_lifecycle_order(scow_broker):
    recorder = Recorder()
    broker = scow_broker(plugin_objects={"recorder": recorder}, sections={"recorder": {}})
    assert recorder.config.section("recorder")["colour"] == "red"  # its section, validated
    with connected(broker.url) as conn:
        replies = conn.create_receiver(None, dynamic=True)
        conn.create_sender("$management").send(
            Message(
                id="1",
                reply_to=replies.link.remote_source.address,
                properties={"operation": "PING", "type": "recorder", "name": "x"},
            )
        )
        reply = replies.receive(timeout=10)
    assert (reply.properties["statusCode"], reply.body) == (200, "pong x")
    broker.stop()
    calls = recorder.calls
    assert calls[0] == "scow_config_sections"
    assert set(calls[1:6]) == REGISTRATIONS
    assert calls[6:] == [
        "scow_configure",
        "scow_services",
        "service start",
        "scow_broker_started",
        "scow_connection_opened:amqp",
        "scow_management_operations",
        "scow_connection_closed:amqp",
        "scow_broker_stopping",
        "service stop",
    ]


def test_add_commands_gives_the_cli_a_command():
    plugins = PluginManager()
    plugins.register(Recorder(), "recorder")
    parser = argparse.ArgumentParser()
    plugins.hook.scow_add_commands(subparsers=parser.add_subparsers())
    args = parser.parse_args(["record"])
    assert args.handler(args) == 7


def test_an_unknown_config_key_of_a_plugin_section_stops_startup(tmp_path):
    config = write_config(
        tmp_path / "scow.toml",
        broker_config(tmp_path / "data", sections={"recorder": {"color": "blue"}}),
    )
    with pytest.raises(Exception, match="did you mean 'colour'"):
        BrokerThread(config, {"recorder": Recorder()}).start()


def test_a_misspelled_hook_stops_startup():
    class Misspelled:
        @hookimpl
        def scow_register_queue_type(self) -> list[Any]:
            return []

    plugins = PluginManager()
    plugins.register(Misspelled(), "misspelled")
    with pytest.raises(PluginError, match="misspelled"):
        plugins.validate()
