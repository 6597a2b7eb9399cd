"""The AMQP listener: accepts sockets and flushes connections with pending output."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.config import ConfigError, parse_host_port
from scow.core.model import host_port, remote_of
from scow.core.security.tls import server_context
from scow.protocols.amqp.connection import AmqpConnection

if TYPE_CHECKING:
    from scow.core.broker import Broker

log = structlog.get_logger("scow.amqp")

#: Connections the kernel queues until the broker accepts them (it caps this at
#: net.core.somaxconn). asyncio's 100 overflowed when hundreds of clients connected at once
#: (a restart, a reconnect loop): the kernel dropped their SYNs and each such client waited
#: a second or more for its retransmission.
LISTEN_BACKLOG = 4096


def _version() -> str:
    try:
        return version("scow")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


class _TlsAccept(asyncio.Protocol):
    """A socket accepted on a TLS listener: counted against the open-file reserve at once,
    as a plain one is (`Security.take_socket`), then given its TLS handshake.

    asyncio's own TLS listener shows a socket only once its handshake is done: sockets
    that never finish one (a scanner, a storm of connects that send nothing) went
    uncounted for handshake-timeout each and could take the files the storage keeps.
    The accepted socket is duplicated and handed to `connect_accepted_socket`, which
    does the handshake from its first byte; the transport that accepted it is dropped
    before it reads anything (transports start reading after `connection_made`).
    """

    def __init__(self, server: AmqpServer, context: ssl.SSLContext) -> None:
        self.server = server
        self.context = context

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        remote = remote_of(transport)
        accepted = transport.get_extra_info("socket")
        if accepted is None or not self.server.broker.security.take_socket(remote):
            transport.abort()
            return
        try:
            sock = socket.socket(fileno=os.dup(accepted.fileno()))
        except OSError as exc:  # no file left for the copy
            self.server.broker.security.socket_closed()
            transport.abort()
            log.info("connection refused", remote=remote, reason=str(exc))
            return
        transport.abort()  # closes its descriptor only: the copy keeps the connection
        task = asyncio.get_running_loop().create_task(self._handshake(sock, remote))
        self.server.handshakes.add(task)
        task.add_done_callback(self.server.handshakes.discard)

    async def _handshake(self, sock: socket.socket, remote: str) -> None:
        server = self.server
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: AmqpConnection(server, counted=True),
                sock,
                ssl=self.context,
                ssl_handshake_timeout=server.handshake_timeout / 1000 or None,
            )
        except (Exception, asyncio.CancelledError) as exc:
            sock.close()
            server.broker.security.socket_closed()
            log.info("tls handshake failed", remote=remote, reason=str(exc) or repr(exc))


class AmqpServer:
    """ProtocolServer for AMQP 1.0 on every configured `host:port`."""

    def __init__(
        self,
        broker: Broker,
        settings: Mapping[str, Any],
        *,
        hooks: Any,
        container_id: str,
        tls: Mapping[str, Any] | None = None,
    ) -> None:
        self.broker = broker
        #: pluggy's hook relay, for the per-connection hooks
        self.hooks = hooks
        self.listen = [parse_host_port(item) for item in settings["listen"]]
        self.listen_tls = [parse_host_port(item) for item in settings["listen-tls"]]
        self.tls_settings = tls
        self.idle_timeout = int(settings["idle-timeout"])
        self.handshake_timeout = int(settings["handshake-timeout"])
        self.min_peer_idle_timeout = int(settings["min-peer-idle-timeout"])
        self.max_frame_size = int(settings["max-frame-size"])
        self.sasl_mechanisms = list(settings["sasl-mechanisms"])
        self.producer_credit = int(settings["producer-credit"])
        self.max_message_size = int(settings["max-message-size"])
        self.min_large_message_size = int(settings["min-large-message-size"])
        self.max_sessions = int(settings["max-sessions-per-connection"])
        self.max_links = int(settings["max-links-per-connection"])
        self.max_unsettled = int(settings["max-unsettled-per-link"])
        self.container_id = container_id
        self.version = _version()
        self.connections: set[AmqpConnection] = set()
        self.bound: list[tuple[str, int]] = []
        self.bound_tls: list[tuple[str, int]] = []
        self._servers: list[asyncio.AbstractServer] = []
        #: TLS handshakes under way (`_TlsAccept`).
        self.handshakes: set[asyncio.Task[None]] = set()
        self._dirty: list[AmqpConnection] = []

    async def start(self) -> None:
        context = None
        if self.listen_tls:
            try:
                context = server_context(self.tls_settings or {})
            except ValueError as exc:
                raise ConfigError(str(exc), section="tls") from None
        for host, port in self.listen:
            self.bound += await self._listen(host, port, None)
        for host, port in self.listen_tls:
            self.bound_tls += await self._listen(host, port, context)
        log.info(
            "amqp listening",
            on=[host_port(h, p) for h, p in self.bound],
            tls=[host_port(h, p) for h, p in self.bound_tls],
        )

    async def _listen(
        self, host: str, port: int, context: ssl.SSLContext | None
    ) -> list[tuple[str, int]]:
        # TLS stays in the transport (asyncio's, or uvloop's): the protocol sees plain
        # bytes, so the per-message path is the same engine calls with or without it.
        # A TLS handshake that does not finish in handshake-timeout ends there too (the
        # connection's own timer starts once it is done).
        server = await asyncio.get_running_loop().create_server(
            (lambda: AmqpConnection(self))
            if context is None
            else (lambda: _TlsAccept(self, context)),
            host or None,
            port,
            reuse_address=True,
            backlog=LISTEN_BACKLOG,
        )
        self._servers.append(server)
        return [sock.getsockname()[:2] for sock in server.sockets]

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self.handshakes):
            task.cancel()
        for connection in list(self.connections):
            # the client hears why (a cue to reconnect elsewhere), as far as its socket
            # takes the close frame now: what it has not read is dropped with the socket
            connection.close_forced("the broker is shutting down")
            connection.flush()
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
        return {
            "connections": len(self.connections),
            "listening": self.bound,
            "listening-tls": self.bound_tls,
        }
