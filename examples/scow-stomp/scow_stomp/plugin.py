"""The `stomp` plugin: its `[stomp]` config section and its listener.

Enabled like any plugin (`[plugins] enable = [..., "stomp"]`); it imports only Scow's
public API (`scow.core`), as a plugin made outside the project would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scow.core import (
    DEFAULT_MIN_LARGE_MESSAGE_SIZE,
    Broker,
    ConfigSection,
    ProtocolType,
    Setting,
    hookimpl,
)

#: The hook API versions this plugin is written for.
SCOW_HOOK_API = ">=1.0,<2"

SECTION = ConfigSection(
    "stomp",
    (
        Setting(
            "listen",
            list,
            ["localhost:61613"],
            "Addresses to accept STOMP connections on; a host name binds every address "
            "it resolves to, port 0 picks a free port.",
            kind="host-port-list",
        ),
        Setting(
            "anycast-prefix",
            str,
            "",
            "A destination starting with this (e.g. '/queue/') names the address after it, "
            "anycast (Artemis's anycastPrefix); empty: none.",
        ),
        Setting(
            "multicast-prefix",
            str,
            "",
            "A destination starting with this (e.g. '/topic/') names the address after it, "
            "multicast (Artemis's multicastPrefix); empty: none.",
        ),
        Setting(
            "max-frame-size",
            int,
            10_485_760,
            "Largest frame accepted (bytes): its headers, and its body when that is held "
            "in memory; a bigger one gets an ERROR frame and the connection closes. A "
            "large SEND's body, written to its file as it arrives, is bounded by "
            "max-message-size instead.",
            kind="size",
            minimum=1024,
        ),
        Setting(
            "max-message-size",
            int,
            1 << 30,
            "Largest body of a large SEND (one of min-large-message-size or more, "
            "written to its file as it arrives): with a content-length over it, refused "
            "before its body is read; without one, once that many bytes have come. "
            "Refused with an ERROR frame naming this setting; the connection closes. "
            "0 means no limit of its own; a body is never more than 4 GiB less a byte "
            "(the 32-bit length of the AMQP section it is stored as).",
            kind="size",
            minimum=0,
        ),
        Setting(
            "min-large-message-size",
            int,
            DEFAULT_MIN_LARGE_MESSAGE_SIZE,
            "A SEND whose message is this size or more is a large message, as an AMQP "
            "producer's: its body is kept in a file of its own ([broker] "
            "large-messages-directory), not in memory or the journal, and written there "
            "as it arrives: at once with a content-length this size or more, otherwise "
            "once this many bytes have come before the NUL that ends it. Large messages "
            "reach subscribers from their files as the socket takes them.",
            kind="size",
            minimum=1,
        ),
        Setting(
            "heart-beat-send",
            int,
            10000,
            "Shortest interval (ms) at which the broker offers to send heart-beats; 0: never.",
            kind="duration-ms",
            minimum=0,
        ),
        Setting(
            "heart-beat-receive",
            int,
            10000,
            "Shortest interval (ms) at which the broker wants the client's heart-beats; "
            "0: none wanted. A client silent for twice the agreed interval is disconnected.",
            kind="duration-ms",
            minimum=0,
        ),
        Setting(
            "subscription-window",
            int,
            1000,
            "Messages a subscription in ack mode client or client-individual holds "
            "unacknowledged at most (and an auto subscription takes in one go).",
            minimum=1,
        ),
    ),
    "The STOMP 1.2 listener (the scow-stomp distribution).",
)


def _factory(broker: Broker, settings: Mapping[str, Any]) -> Any:
    from scow_stomp.server import StompServer

    return StompServer(broker, settings)


@hookimpl
def scow_config_sections() -> list[ConfigSection]:
    return [SECTION]


@hookimpl
def scow_register_protocols() -> list[ProtocolType]:
    return [ProtocolType("stomp", _factory, "STOMP 1.2, converted to AMQP 1.0 messages")]
