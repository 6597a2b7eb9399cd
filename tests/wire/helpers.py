"""Client-side helpers for the wire tests: proton options, pumping, raw frames."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from proton import UNDESCRIBED, Array, Data, Delivery, Message, Terminus, Timeout, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption
from proton.utils import BlockingConnection, BlockingReceiver

from scow.protocols.amqp import engine

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
CLOSE = 0x18
_FRAME = struct.Struct(">IBBH")


# --------------------------------------------------------------------------- connections


@contextlib.contextmanager
def connected(url: str, **kwargs: Any) -> Iterator[BlockingConnection]:
    """A BlockingConnection that is closed however the test ends."""
    kwargs.setdefault("timeout", 10)
    conn = BlockingConnection(url, **kwargs)
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def send(conn: BlockingConnection, address: str | None, *messages: Message) -> None:
    """Send each message and wait for the broker to settle it (raises if it refuses)."""
    sender = conn.create_sender(address)
    for message in messages:
        sender.send(message)
    sender.close()


def receive(receiver: BlockingReceiver, count: int, *, accept: bool = True) -> list[Message]:
    """Receive exactly `count` messages, accepting each unless told not to."""
    got = []
    for _ in range(count):
        got.append(receiver.receive(timeout=10))
        if accept:
            receiver.accept()
    return got


def bodies(messages: Iterable[Message]) -> list[Any]:
    return [m.body for m in messages]


def drain(conn: BlockingConnection, receiver: BlockingReceiver, credit: int) -> list[Message]:
    """Grant `credit` in drain mode and return everything the broker sends for it.

    The broker answers a drain by sending what it has, then a flow using up the rest of
    the credit; when proton no longer reports draining and nothing is left queued on the
    link, the fetcher holds every message the broker was able to send. The receiver should
    be created with credit=0 so no prefetch window adds credit of its own.
    """
    link = receiver.link
    link.drain(credit)
    conn.wait(lambda: not link.draining() and link.queued == 0, msg="the drain to complete")
    return [receiver.fetcher.pop() for _ in range(receiver.fetcher.has_message)]


def settle_modified(receiver: BlockingReceiver, *, failed: bool) -> None:
    """Settle the oldest unsettled message as `modified` with delivery-failed set as given.

    BlockingReceiver.release(delivered=True) sends `modified` but never sets
    delivery-failed, so the broker could not tell a failed attempt from a plain release.
    """
    delivery = receiver.fetcher.unsettled.popleft()
    delivery.local.failed = failed
    delivery.update(Delivery.MODIFIED)
    delivery.settle()


def detach(conn: BlockingConnection, receiver: BlockingReceiver, until: Callable[[], Any]) -> None:
    """Detach (not close) a link, pumping the connection until `until()` (a broker-side check).

    A detach that is not a close leaves proton's remote link state as it was, so there is
    nothing on the client side to wait for.
    """
    receiver.link.detach()
    pump([conn], until, what="the broker to see the detach")


def pump(
    conns: Sequence[BlockingConnection],
    condition: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "",
) -> Any:
    """Drive several blocking connections' event loops until `condition()` is truthy."""
    saved = [c.container.timeout for c in conns]
    deadline = time.monotonic() + timeout
    try:
        for c in conns:
            c.container.timeout = 0.01
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
            for c in conns:
                c.container.process()
    finally:
        for c, t in zip(conns, saved, strict=True):
            c.container.timeout = t


def run_container(handler: Any, done: Callable[[], bool], timeout: float = 30.0) -> Container:
    """Run a reactor Container with `handler` until `done()` or fail after `timeout`."""
    container = Container(handler)
    container.timeout = 0.05
    container.start()
    deadline = time.monotonic() + timeout
    try:
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s; handler state: {vars(handler)}")
            container.process()
    finally:
        container.stop()
    return container


# --------------------------------------------------------------------------- link options


class Capabilities(LinkOption):
    """Set capabilities on a receiver's source (or a sender's target): `topic`, `shared`..."""

    def __init__(self, *names: str) -> None:
        self.names = [symbol(n) for n in names]

    def apply(self, link: Any) -> None:
        terminus = link.source if link.is_receiver else link.target
        terminus.capabilities.put_object(Array(UNDESCRIBED, Data.SYMBOL, *self.names))


class NodeProperties(LinkOption):
    """Ask the broker to create the node with these properties, as Qpid Messaging does for
    `{create: always, node: {x-declare: {arguments: ...}}}`: capability create-on-demand
    and the properties in the terminus's dynamic-node-properties."""

    def __init__(self, properties: dict[str, Any]) -> None:
        self.properties = {symbol(k): v for k, v in properties.items()}

    def apply(self, link: Any) -> None:
        terminus = link.source if link.is_receiver else link.target
        create = Array(UNDESCRIBED, Data.SYMBOL, symbol("create-on-demand"))
        terminus.capabilities.put_object(create)
        terminus.properties.put_dict(self.properties)


class Durable(LinkOption):
    """A durable subscription's source: durability and expiry-policy never."""

    def __init__(self, durability: int = Terminus.DELIVERIES) -> None:
        self.durability = durability

    def apply(self, link: Any) -> None:
        link.source.durability = self.durability
        link.source.expiry_policy = Terminus.EXPIRE_NEVER


# --------------------------------------------------------------------------- raw sockets


def frame(body: bytes, frame_type: int = 0, channel: int = 0) -> bytes:
    """An AMQP frame: 8-byte header (size, doff=2, type, channel) then `body`."""
    return _FRAME.pack(8 + len(body), 2, frame_type, channel) + body


def exchange(port: int, data: bytes, *, timeout: float = 5.0, close: bool = False) -> bytes:
    """Send raw bytes and read what the broker answers until it closes the socket.

    With `close` the client closes its side right after sending (and reads nothing).
    Raises AssertionError when the broker keeps the socket open past `timeout`.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if close:
            return b""
        reply = b""
        deadline = time.monotonic() + timeout
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(
                    f"the broker kept the socket open for {timeout}s; it sent {reply!r}"
                ) from None
            except ConnectionResetError:
                return reply
            if not chunk:
                return reply
            reply += chunk


def performatives(reply: bytes) -> list[Any]:
    """Decode the AMQP frames after the protocol header into proton Described values."""
    assert reply.startswith(AMQP_HEADER), f"no AMQP header in {reply!r}"
    out = []
    pos = len(AMQP_HEADER)
    while pos + 8 <= len(reply):
        size, doff, _ftype, _channel = _FRAME.unpack_from(reply, pos)
        body = reply[pos + doff * 4 : pos + size]
        pos += size
        if not body:
            continue  # an empty (heartbeat) frame
        data = Data()
        data.decode(body)
        data.rewind()
        data.next()
        out.append(data.get_object())
    return out


def close_condition(reply: bytes) -> tuple[str | None, str | None]:
    """(condition, description) of the `close` frame in `reply`; (None, None) without one."""
    for performative in performatives(reply):
        if performative.descriptor == CLOSE:
            fields = [*performative.value, None]
            error = fields[0]
            if error is None:
                return None, None
            error_fields = [*error.value, None, None]
            return str(error_fields[0]), error_fields[1]
    return None, None


def round_trip(url: str, address: str = "health", **kwargs: Any) -> None:
    """A normal client sends and receives one message: the broker is still serving."""
    with connected(url, **kwargs) as conn:
        send(conn, address, Message(body="still here"))
        receiver = conn.create_receiver(address)
        assert receiver.receive(timeout=10).body == "still here"
        receiver.accept()


def consume_all(url: str, address: str, *, quiet: float = 1.0) -> list[Message]:
    """Receive and accept from `address` until nothing arrives for `quiet` seconds."""
    with connected(url) as conn:
        receiver = conn.create_receiver(address, credit=100)
        got = []
        while True:
            try:
                got.append(receiver.receive(timeout=quiet))
            except Timeout:
                return got
            receiver.accept()


class _BulkSender(MessagingHandler):
    def __init__(self, url: str, address: str, messages: Iterator[Message], total: int) -> None:
        super().__init__()
        self.url, self.address, self.messages, self.total = url, address, messages, total
        self.sent = self.settled = 0

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        event.container.create_sender(conn, self.address)

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit and self.sent < self.total:
            sender.send(next(self.messages))
            self.sent += 1

    def on_settled(self, event: Any) -> None:
        self.settled += 1
        if self.settled == self.total:
            event.connection.close()


def bulk_send(
    url: str, address: str, count: int, make: Callable[[int], Message], timeout: float = 120
) -> None:
    """Send `count` messages (`make(i)`) as fast as credit allows; wait until all settled."""
    handler = _BulkSender(url, address, (make(i) for i in range(count)), count)
    run_container(handler, lambda: handler.settled >= count, timeout)


class RawClient:
    """A client on proton's engine over a plain socket, driven step by step, so that a
    test can stop mid-message (which a blocking client cannot)."""

    def __init__(self, port: int, max_frame: int = 65536) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.engine = engine.Engine(max_frame=max_frame, idle_timeout_ms=0, server=False)
        engine.client_open(self.engine.connection, "raw")
        self.session = engine.new_session(self.engine.connection)
        self.received = 0

    def flush(self) -> None:
        while out := self.engine.output():
            self.sock.sendall(out)

    def read(self, timeout: float = 0.2) -> None:
        self.flush()
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return
        self.received += len(data)
        self.engine.push(data)
        self.flush()

    def until(self, condition: Any, what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.read()

    def close(self) -> None:
        self.sock.close()
