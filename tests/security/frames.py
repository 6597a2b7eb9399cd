"""AMQP performatives as raw frames, for tests that must say what no client library would."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from scow.protocols.amqp.codec import Described, UInt, encode_value
from tests.wire.helpers import frame, performatives

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
TARGET = 0x29
SOURCE = 0x28


def performative(code: int, fields: list[Any], channel: int = 0, payload: bytes = b"") -> bytes:
    return frame(encode_value(Described(code, fields)) + payload, channel=channel)


def open_(container: str = "raw-client") -> bytes:
    return performative(OPEN, [container])


def begin(channel: int) -> bytes:
    return performative(BEGIN, [None, UInt(0), UInt(1 << 20), UInt(1 << 20)], channel)


def attach_sender(channel: int, handle: int, address: str, name: str | None = None) -> bytes:
    """Attach a link the client sends on (role sender) to `address`."""
    return performative(
        ATTACH,
        [
            name or f"link-{channel}-{handle}",
            UInt(handle),
            False,
            None,
            None,
            Described(SOURCE, []),
            Described(TARGET, [address]),
            None,
            None,
            UInt(0),
        ],
        channel,
    )


def transfer(
    channel: int, handle: int, delivery_id: int | None, payload: bytes, *, more: bool
) -> bytes:
    return performative(
        TRANSFER,
        [
            UInt(handle),
            UInt(delivery_id) if delivery_id is not None else None,
            b"t%d" % (delivery_id or 0),
            UInt(0),
            False,
            more,
        ],
        channel,
        payload,
    )


def message(body: str) -> bytes:
    """A bare message: one amqp-value section holding a string."""
    return b"\x00\x53\x77" + encode_value(body)


def close() -> bytes:
    return performative(CLOSE, [None])


def errors(reply_performatives: list[Any], code: int) -> list[tuple[str, str]]:
    """(condition, description) of each `code` performative (end, detach, close) with an
    error, in the order received."""
    found = []
    error_field = {END: 0, CLOSE: 0, DETACH: 2}[code]
    for p in reply_performatives:
        if p.descriptor == code:
            fields = [*p.value, None, None, None]
            error = fields[error_field]
            if error is not None:
                error_fields = [*error.value, None, None]
                found.append((str(error_fields[0]), str(error_fields[1])))
    return found


class RawConnection:
    """A socket speaking raw frames: send bytes, wait for performatives the broker sends."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.received = b""
        self.closed = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def performatives(self) -> list[Any]:
        return performatives(self.received) if self.received else []

    def wait(self, condition: Callable[[list[Any]], bool], what: str = "") -> list[Any]:
        """Read until `condition(performatives so far)` holds or the broker closes."""
        deadline = time.monotonic() + self.timeout
        while True:
            got = self.performatives()
            if condition(got):
                return got
            if self.closed or time.monotonic() > deadline:
                raise AssertionError(f"never saw {what or condition}; got {got}")
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
            self.received += chunk

    def close(self) -> None:
        self.sock.close()


def count(code: int) -> Callable[[list[Any]], int]:
    return lambda got: sum(1 for p in got if p.descriptor == code)
