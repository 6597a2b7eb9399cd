"""The AMQP 1.0 protocol plugin: its config section, listener and `scow perf client`."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from scow.core import hookimpl
from scow.core.config import ConfigSection, Setting
from scow.core.descriptors import ProtocolType
from scow.core.large_messages import DEFAULT_MIN_LARGE_MESSAGE_SIZE
from scow.protocols.amqp.format import AMQP_FORMAT
from scow.protocols.amqp.sasl import MECHANISMS

SECTION = ConfigSection(
    "amqp",
    (
        Setting(
            "listen",
            list,
            ["localhost:5672"],
            "Addresses to accept AMQP connections on; a host name binds every address "
            "it resolves to, port 0 picks a free port.",
            kind="host-port-list",
        ),
        Setting(
            "listen-tls",
            list,
            [],
            "Addresses to accept AMQP over TLS on (amqps; its usual port is 5671), with "
            "the certificate of the [tls] section.",
            kind="host-port-list",
        ),
        Setting(
            "idle-timeout",
            int,
            60000,
            "Close connections silent for this long (ms); 0 turns it off.",
            kind="duration-ms",
            minimum=0,
        ),
        Setting(
            "handshake-timeout",
            int,
            10000,
            "Close a connection whose AMQP open has not come this long (ms) after it "
            "connected: one that sends nothing, or stops during SASL, would hold its "
            "socket for ever (Artemis's handshake-timeout). 0 turns it off.",
            kind="duration-ms",
            minimum=0,
        ),
        Setting(
            "min-peer-idle-timeout",
            int,
            100,
            "A client whose open asks for an idle-time-out below this (ms) is refused "
            "(amqp:invalid-field): the broker would owe it a frame every half of it (1 ms: "
            "2,000 a second), so a few such clients would take a core. Clients built on "
            "proton ask for half their heartbeat setting (1 s asks for 500 ms). 0 turns "
            "it off.",
            kind="duration-ms",
            minimum=0,
        ),
        Setting(
            "max-frame-size",
            int,
            131072,
            "Largest frame accepted; a bigger one closes the connection (framing-error).",
            kind="size",
            minimum=512,
        ),
        Setting(
            "sasl-mechanisms",
            list,
            ["ANONYMOUS", "PLAIN", "SCRAM-SHA-256", "EXTERNAL"],
            "SASL mechanisms offered: ANONYMOUS only while [security] allow-anonymous, "
            "EXTERNAL only to TLS clients with a certificate.",
            item_type=str,
            choices=MECHANISMS,
        ),
        Setting(
            "producer-credit",
            int,
            1000,
            "Credit given to each sending link, replenished as it is used.",
            minimum=1,
        ),
        Setting(
            "max-sessions-per-connection",
            int,
            1024,
            "Sessions one connection may have open; past it a begin is answered with "
            "amqp:resource-limit-exceeded. 0 means no limit.",
            minimum=0,
        ),
        Setting(
            "max-links-per-connection",
            int,
            10000,
            "Links one connection may have attached; past it an attach is refused with "
            "amqp:resource-limit-exceeded. 0 means no limit.",
            minimum=0,
        ),
        Setting(
            "max-unsettled-per-link",
            int,
            0,
            "Messages a consumer may hold unsettled on one link; past it the broker sends "
            "no more until it settles some, whatever credit it gives. 0 means no limit.",
            minimum=0,
        ),
        Setting(
            "max-message-size",
            int,
            1 << 30,
            "Largest message accepted (bytes); a bigger one closes its link with "
            "amqp:link:message-size-exceeded. Also bounds the partial messages one "
            "connection holds in memory at once, all links together. 0 means no limit.",
            kind="size",
            minimum=0,
        ),
        Setting(
            "min-large-message-size",
            int,
            DEFAULT_MIN_LARGE_MESSAGE_SIZE,
            "Messages of this size or more are large: the body is written to a file of "
            "its own as it arrives ([broker] large-messages-directory), never held whole "
            "in memory, and streamed from it to consumers.",
            kind="size",
            minimum=1,
        ),
    ),
    "The AMQP 1.0 listener.",
)


def _factory(broker: Any, settings: Mapping[str, Any]) -> Any:
    from scow.protocols.amqp.server import AmqpServer

    return AmqpServer(
        broker,
        settings,
        hooks=broker.hooks,
        container_id=broker.config.section("broker")["name"],
        tls=broker.config.section("tls"),
    )


@hookimpl
def scow_config_sections() -> list[ConfigSection]:
    return [SECTION]


@hookimpl
def scow_register_protocols() -> list[ProtocolType]:
    return [
        ProtocolType(
            "amqp", _factory, "AMQP 1.0 over proton's C engine", message_format=AMQP_FORMAT
        )
    ]


@hookimpl
def scow_add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from scow.protocols.amqp import management_commands, perf

    perf.add_commands(subparsers)
    management_commands.add_commands(subparsers)
