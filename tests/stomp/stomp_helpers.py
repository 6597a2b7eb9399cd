"""A stomp.py client that records what the broker sends, and a broker with STOMP on."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import stomp
from stomp.utils import Frame

from scow.core.testing import DEFAULT_PLUGINS, BrokerThread, wait_for

PLUGINS = (*DEFAULT_PLUGINS, "stomp")
STOMP_SECTION = {
    "listen": ["127.0.0.1:0"],
    "anycast-prefix": "/queue/",
    "multicast-prefix": "/topic/",
}


def start(scow_broker: Any, **kwargs: Any) -> BrokerThread:
    """A broker with the stomp plugin listening on a free loopback port."""
    sections = kwargs.pop("sections", {})
    stomp_section = {**STOMP_SECTION, **sections.pop("stomp", {})}
    plugins = kwargs.pop("plugins", PLUGINS)
    return scow_broker(plugins=plugins, sections={"stomp": stomp_section, **sections}, **kwargs)


class Recorder(stomp.ConnectionListener):
    """Keeps every MESSAGE, ERROR and RECEIPT; tells when the connection went."""

    def __init__(self) -> None:
        self.messages: list[Frame] = []
        self.errors: list[Frame] = []
        self.receipts: list[str] = []
        self.heartbeats = 0
        self.disconnected = threading.Event()

    def on_message(self, frame: Frame) -> None:
        self.messages.append(frame)

    def on_error(self, frame: Frame) -> None:
        self.errors.append(frame)

    def on_receipt(self, frame: Frame) -> None:
        self.receipts.append(frame.headers["receipt-id"])

    def on_heartbeat(self) -> None:
        self.heartbeats += 1

    def on_disconnected(self) -> None:
        self.disconnected.set()

    def wait_messages(self, count: int, timeout: float = 10) -> list[Frame]:
        wait_for(lambda: len(self.messages) >= count, timeout, what=f"{count} messages")
        return self.messages[:count]

    def wait_receipt(self, receipt: str) -> None:
        wait_for(lambda: receipt in self.receipts, what=f"receipt {receipt}")

    def wait_error(self) -> Frame:
        wait_for(lambda: self.errors, what="an ERROR frame")
        return self.errors[0]


@contextlib.contextmanager
def client(
    broker: BrokerThread, *, connect: bool = True, **connect_kwargs: Any
) -> Iterator[tuple[stomp.Connection12, Recorder]]:
    """A connected STOMP 1.2 client, disconnected however the test ends."""
    heartbeats = connect_kwargs.pop("heartbeats", (0, 0))
    conn = stomp.Connection12(
        [("127.0.0.1", broker.port_of("stomp"))], heartbeats=heartbeats, auto_decode=False
    )
    recorder = Recorder()
    conn.set_listener("recorder", recorder)
    if connect:
        conn.connect(wait=True, **connect_kwargs)
    try:
        yield conn, recorder
    finally:
        with contextlib.suppress(Exception):
            if conn.is_connected():
                # stomp.py does not wait for the receipt: without it, the broker may still
                # be reading this connection's last frames when the test goes on
                conn.disconnect(receipt="bye")
                wait_for(
                    lambda: "bye" in recorder.receipts or recorder.disconnected.is_set(),
                    what="the DISCONNECT receipt",
                )


def raw(broker: BrokerThread) -> socket.socket:
    """A plain socket to the STOMP port, for frames no client library would send."""
    sock = socket.create_connection(("127.0.0.1", broker.port_of("stomp")), timeout=10)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the broker writes until it closes the socket."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


class RawStomp:
    """A STOMP client on a plain socket, driven step by step: a test can stop mid-frame,
    or not read at all, which a client library does not let it do."""

    def __init__(self, port: int, *, receive_buffer: int | None = None) -> None:
        self.sock = socket.socket()
        if receive_buffer is not None:  # a slow reader: the broker's writes back up sooner
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        self._buffer = bytearray()
        self.sock.sendall(b"CONNECT\naccept-version:1.2\nhost:scow\n\n\x00")
        command, _, _ = self.read_frame()
        assert command == "CONNECTED", command

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        self._buffer += chunk

    def read_frame(self) -> tuple[str, dict[str, str], bytes]:
        """The next frame the broker sends (heart-beats skipped): command, headers, body."""
        while True:
            del self._buffer[: len(self._buffer) - len(self._buffer.lstrip(b"\n"))]
            end = self._buffer.find(b"\n\n")
            if end != -1:
                break
            self._more()
        command, *lines = self._buffer[:end].decode().split("\n")
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers.setdefault(name, value)
        start = end + 2
        length = int(headers.get("content-length", -1))
        while (
            stop := start + length if length >= 0 else self._buffer.find(b"\x00", start)
        ) < 0 or (len(self._buffer) <= stop):
            self._more()
        assert self._buffer[stop] == 0, "a frame not ended by NUL"
        body = bytes(self._buffer[start:stop])
        del self._buffer[: stop + 1]
        return command, headers, body

    def close(self) -> None:
        self.sock.close()
