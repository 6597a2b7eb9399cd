"""One connection's non-blocking socket and its proton engine (`Wire`), and what the
client and the sink share in driving one: I/O buffers, selector events, delivery tags,
the send batch, and a client's connect (TLS for amqps)."""

from __future__ import annotations

import selectors
import socket
import ssl
import struct
from typing import Any

from scow.protocols.amqp import engine
from scow.protocols.amqp.perf.errors import PerfError

_TAG = struct.Struct("<Q")
_IO_SIZE = 1 << 18
_MAX_FRAME = 1 << 17
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_SEND_BATCH = 2000  # messages handed to proton between two socket writes


_in_buf, _in_view = engine.new_buffer(_IO_SIZE)
_out_buf, _out_view = engine.new_buffer(_IO_SIZE)


class Wire:
    """One non-blocking socket and its proton engine, without an event collector."""

    __slots__ = (
        "connection",
        "engine",
        "eof",
        "pending",
        "retry",
        "sock",
        "transport",
        "want_write",
    )

    def __init__(self, sock: socket.socket, *, server: bool) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        #: Decrypted bytes TLS holds that the selector cannot see (0 without TLS).
        self.pending = sock.pending if isinstance(sock, ssl.SSLSocket) else _nothing
        #: A TLS write that would block must be retried with the same length.
        self.retry = 0
        self.engine = engine.Engine(max_frame=_MAX_FRAME, idle_timeout_ms=0, server=server)
        engine.stop_events(self.engine)  # endpoint states and links are polled instead
        self.transport = self.engine.transport
        self.connection = self.engine.connection
        self.eof = False
        self.want_write = False

    def read(self) -> None:
        """Feed proton what the socket has; sets `eof` once either side is done."""
        transport, recv_into, push = self.transport, self.sock.recv_into, engine.transport_push
        while True:
            room = engine.transport_capacity(transport)
            if room <= 0:
                self.eof = self.eof or room < 0
                return
            try:
                got = recv_into(_in_view, min(room, _IO_SIZE))
            except _WOULD_BLOCK:
                return
            except OSError:
                got = 0
            if not got:
                self.eof = True
                self.engine.close_input()
                return
            if push(transport, _in_buf, got) < 0:
                self.eof = True
                return
            if got < room and not self.pending():
                return

    def write(self) -> None:
        """Send what proton has for the socket; sets `want_write` while some is left."""
        transport, send = self.transport, self.sock.send
        while True:
            pending = engine.transport_pending(transport)
            if pending <= 0:
                self.eof = self.eof or pending < 0
                self.want_write = False
                return
            got = engine.transport_peek(transport, _out_buf, self.retry or min(pending, _IO_SIZE))
            if got <= 0:
                self.want_write = False
                return
            try:
                sent = send(_out_view[:got])
                self.retry = 0
            except _WOULD_BLOCK:
                sent = 0
                self.retry = got
            except OSError:
                self.eof = True
                self.want_write = False
                return
            if sent:
                engine.transport_pop(transport, sent)
            if sent < got:
                self.want_write = True
                return

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            self.engine.free()


_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def _nothing() -> int:
    return 0


def _connect(host: str, port: int, options: dict[str, Any]) -> socket.socket:
    """A connected socket; for amqps, with its TLS handshake done (blocking)."""
    try:
        sock = socket.create_connection((host, port), timeout=10)
        if options.get("tls"):
            context = ssl.create_default_context(cafile=options.get("ca_file") or None)
            sock = context.wrap_socket(sock, server_hostname=host)
        return sock
    except OSError as exc:
        raise PerfError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
