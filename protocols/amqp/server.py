"""The AMQP listener: accepts sockets and flushes connections with pending output."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.config import parse_host_port
from scow.protocols.amqp.connection import AmqpConnection

if TYPE_CHECKING:
    from scow.core.broker import Broker

log = structlog.get_logger("scow.amqp")


def _version() -> str:
    try:
        return version("scow")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


class AmqpServer:
    """ProtocolServer for AMQP 1.0 on every configured `host:port`."""

    def __init__(
        self,
        broker: Broker,
        settings: Mapping[str, Any],
        *,
        hooks: Any,
        users: Mapping[str, str],
        allow_anonymous: bool,
        container_id: str,
    ) -> None:
        self.broker = broker
        #: pluggy's hook relay, for the per-connection hooks
        self.hooks = hooks
        self.listen = [parse_host_port(item) for item in settings["listen"]]
        self.idle_timeout = int(settings["idle-timeout"])
        self.max_frame_size = int(settings["max-frame-size"])
        self.sasl_mechanisms = list(settings["sasl-mechanisms"])
        self.producer_credit = int(settings["producer-credit"])
        self.max_message_size = int(settings["max-message-size"])
        self.users = dict(users)
        self.allow_anonymous = allow_anonymous
        self.container_id = container_id
        self.version = _version()
        self.connections: set[AmqpConnection] = set()
        self.bound: list[tuple[str, int]] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._dirty: list[AmqpConnection] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for host, port in self.listen:
            server = await loop.create_server(
                lambda: AmqpConnection(self), host or None, port, reuse_address=True
            )
            self._servers.append(server)
            for sock in server.sockets:
                addr = sock.getsockname()
                self.bound.append((addr[0], addr[1]))
        log.info("amqp listening", on=[f"{h}:{p}" for h, p in self.bound])

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            if connection.socket is not None:
                connection.socket.abort()
            connection.connection_lost(None)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def schedule_flush(self, connection: AmqpConnection) -> None:
        """Flush `connection` after the current callback, batched with the others."""
        if not self._dirty:
            asyncio.get_running_loop().call_soon(self._flush_dirty)
        self._dirty.append(connection)

    def _flush_dirty(self) -> None:
        dirty, self._dirty = self._dirty, []
        for connection in dirty:
            connection.flush()

    def stats(self) -> dict[str, Any]:
        return {"connections": len(self.connections), "listening": self.bound}
