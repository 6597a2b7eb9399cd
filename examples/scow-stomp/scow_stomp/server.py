"""The STOMP listener: accepts sockets on every configured `host:port`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import structlog

from scow.core import Broker, parse_host_port
from scow_stomp.connection import StompConnection
from scow_stomp.destinations import Destinations

#: Connections the kernel queues until they are accepted (capped at net.core.somaxconn):
#: many clients at once wait in it rather than for their dropped SYN's retransmission.
LISTEN_BACKLOG = 4096

log = structlog.get_logger("scow.stomp")

#: The encoding STOMP messages are converted to (see `scow_stomp.convert`).
STORED_FORMAT = "amqp-1.0"


def _version() -> str:
    try:
        return version("scow-stomp")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


class StompServer:
    """`scow.core.ProtocolServer` for STOMP 1.2."""

    def __init__(self, broker: Broker, settings: Mapping[str, Any]) -> None:
        fmt = broker.message_format
        if fmt is None or fmt.name != STORED_FORMAT:
            raise RuntimeError(
                "stomp: converts messages to the broker's stored encoding, which must be "
                f"{STORED_FORMAT!r} (found {getattr(fmt, 'name', None)!r}); enable the "
                "'amqp' plugin"
            )
        self.broker = broker
        self.listen = [parse_host_port(item) for item in settings["listen"]]
        self.destinations = Destinations(settings["anycast-prefix"], settings["multicast-prefix"])
        self.max_frame_size = int(settings["max-frame-size"])
        self.min_large_message_size = int(settings["min-large-message-size"])
        self.max_message_size = int(settings["max-message-size"])
        self.heart_beat_send = int(settings["heart-beat-send"])
        self.heart_beat_receive = int(settings["heart-beat-receive"])
        self.subscription_window = int(settings["subscription-window"])
        self.version = _version()
        self.connections: set[StompConnection] = set()
        self.bound: list[tuple[str, int]] = []
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for host, port in self.listen:
            server = await loop.create_server(
                lambda: StompConnection(self),
                host or None,
                port,
                reuse_address=True,
                backlog=LISTEN_BACKLOG,
            )
            self._servers.append(server)
            self.bound += [sock.getsockname()[:2] for sock in server.sockets]
        log.info("stomp listening", on=[f"{h}:{p}" for h, p in self.bound])

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close_forced("the broker is shutting down")  # an ERROR frame first
            if connection.socket is not None:
                connection.socket.abort()
            connection.connection_lost(None)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def stats(self) -> dict[str, Any]:
        return {"connections": len(self.connections), "listening": self.bound}
