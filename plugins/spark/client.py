"""The connector's AMQP client: one blocking connection over the engine facade.

Built the way `scow perf client` is (the engine facade, preallocated C buffers, endpoint
states polled instead of events collected), because proton's object API caps a reader at
a few thousand messages a second; not on perf's `Wire`, whose non-blocking pump treats
every `OSError` as the end of the connection and so cannot carry TLS.

Speaks SASL PLAIN itself when a username is given (the engine's client end has no SASL
layer), and TLS through `ssl` around the socket for `amqps` or when a CA or client
certificate is given.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from scow.plugins.spark.records import PACK_FILTER, unpack
from scow.protocols.amqp import codec, engine, sasl_client

_IO_SIZE = 1 << 18
_MAX_FRAME = 1 << 17
_TAG = struct.Struct(">Q")
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
MANAGEMENT = "$management"
DEFAULT_PORT = 5672
#: Records a read asks the broker to pack into one delivery (`scow:stream-pack`): one
#: transfer, and one delivery for the broker's loop and proton, instead of one each.
PACK_RECORDS = 500
#: Deliveries asked for per read round (one drain each): up to 20,000 records in packs.
READ_CREDIT = 40
#: Unsettled messages a sender lets out before waiting for outcomes.
SEND_WINDOW = 5000


class ClientError(Exception):
    """The broker refused something, or the connection failed; the message says which."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: host, port, credentials, TLS files."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    timeout: float = 30.0

    @classmethod
    def parse(cls, url: str | None = None, **fields: Any) -> Endpoint:
        """From `amqp[s]://[user:password@]host[:port]` and/or explicit fields."""
        values: dict[str, Any] = {}
        if url:
            parts = urlsplit(url)
            if parts.scheme not in ("amqp", "amqps"):
                raise ClientError(f"url {url!r}: expected amqp://host[:port] or amqps://...")
            values["tls"] = parts.scheme == "amqps"
            values["host"] = parts.hostname or "127.0.0.1"
            values["port"] = parts.port or (5671 if values["tls"] else DEFAULT_PORT)
            if parts.username:
                values["username"] = parts.username
            if parts.password:
                values["password"] = parts.password
        values.update({k: v for k, v in fields.items() if v is not None})
        return cls(**values)


def _tls_context(endpoint: Endpoint) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=endpoint.ca_file)
    if endpoint.cert_file:
        context.load_cert_chain(endpoint.cert_file, endpoint.key_file)
    return context


class Client:
    """One connection and session; links are opened as needed. Not thread-safe."""

    def __init__(self, endpoint: Endpoint, name: str = "scow-spark") -> None:
        self.endpoint = endpoint
        try:
            sock = socket.create_connection((endpoint.host, endpoint.port), endpoint.timeout)
        except OSError as exc:
            raise ClientError(
                f"cannot connect to {endpoint.host}:{endpoint.port}: {exc.strerror or exc}"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoint.tls or endpoint.ca_file or endpoint.cert_file:
            sock = _tls_context(endpoint).wrap_socket(sock, server_hostname=endpoint.host)
        if endpoint.username:
            try:
                sasl_client.plain_login(
                    sock, endpoint.username, endpoint.password or "", endpoint.host
                )
            except (sasl_client.SaslError, OSError) as exc:
                sock.close()
                raise ClientError(f"{endpoint.host}:{endpoint.port}: {exc}") from None
        sock.settimeout(None)
        self.sock = sock
        # Asking for frames at least every `timeout` has a broker that is up send a
        # heartbeat every half of it (when its own idle-timeout is on), so a wait that
        # times out can tell a silent broker from a slow answer. The client never ticks
        # proton, so it neither enforces this nor sends heartbeats of its own.
        self.engine = engine.Engine(
            max_frame=_MAX_FRAME, idle_timeout_ms=round(endpoint.timeout * 1000), server=False
        )
        engine.stop_events(self.engine)
        self.transport = self.engine.transport
        self.connection = self.engine.connection
        self._in, self._in_view = engine.new_buffer(_IO_SIZE)
        self._out, self._out_view = engine.new_buffer(_IO_SIZE)
        self._msg, self._msg_view = engine.new_buffer(_IO_SIZE)
        self._tags = 0
        #: Links closed, freed once the broker has answered (`_close_link`).
        self._closing: list[Any] = []
        self.closed = False
        #: When the connection was opened, when the broker's last bytes were read and how
        #: much it has read: a wait that times out says all three (a broker that went
        #: silent, one slow to answer whose heartbeats still came, or one that kept
        #: sending what did not answer the wait).
        self._opened_at = self._heard_at = time.monotonic()
        self._heard_bytes = self._heard_reads = 0
        engine.client_open(self.connection, f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self.session = engine.new_session(self.connection)
        self._management: tuple[Any, Any, str] | None = None
        self._request_id = 0
        # the open goes now, not with the first request: a broker closes a connection
        # that has not opened within its handshake-timeout (Scow's and Artemis's: 10 s),
        # and a client may be made well before it is first used
        self._flush()

    # ------------------------------------------------------------------ I/O

    def _flush(self) -> None:
        transport = self.transport
        while True:
            pending = engine.transport_pending(transport)
            if pending <= 0:
                return
            got = engine.transport_peek(transport, self._out, min(pending, _IO_SIZE))
            if got <= 0:
                return
            try:
                self.sock.sendall(self._out_view[:got])
            except OSError as exc:
                raise ClientError(f"connection to the broker lost: {exc}") from None
            engine.transport_pop(transport, got)

    def _pump(self, timeout: float) -> bool:
        """Send what proton has; then wait up to `timeout` s for input and feed it.
        Whether any came."""
        self._flush()
        sock = self.sock
        pending = isinstance(sock, ssl.SSLSocket) and sock.pending()
        if not pending and not select.select([sock], [], [], timeout)[0]:
            return False
        room = engine.transport_capacity(self.transport)
        if room <= 0:  # proton reads no more: the broker's close came, or its input failed
            self._check_connection()
            name, text = self.engine.transport_condition()
            raise ClientError(f"the connection to the broker is closed ({name}: {text})")
        try:
            got = sock.recv_into(self._in_view, min(room, _IO_SIZE))
        except OSError as exc:
            raise ClientError(f"connection to the broker lost: {exc}") from None
        if not got:
            self.engine.close_input()
            self._check_connection()
            raise ClientError("the broker closed the connection")
        engine.transport_push(self.transport, self._in, got)
        self._heard_at = time.monotonic()
        self._heard_bytes += got
        self._heard_reads += 1
        return True

    def _check_connection(self) -> None:
        if engine.connection_state(self.connection) & engine.REMOTE_CLOSED:
            name, text = engine.remote_connection_condition(self.connection)
            raise ClientError(f"the broker closed the connection ({name}: {text})")

    def _check_link(self, link: Any, what: str) -> None:
        self._check_connection()
        if engine.link_state(link) & engine.REMOTE_CLOSED:
            name, text = engine.remote_link_condition(link)
            raise ClientError(f"{what}: refused by the broker ({name}: {text})")

    def wait(self, condition: Callable[[], bool], what: str, link: Any = None) -> None:
        deadline = time.monotonic() + self.endpoint.timeout
        while not condition():
            if link is not None:
                self._check_link(link, what)
            else:
                self._check_connection()
            now = time.monotonic()
            if now > deadline:
                raise ClientError(
                    f"timed out after {self.endpoint.timeout} s: {what} (the broker "
                    f"{self.endpoint.host}:{self.endpoint.port} last sent anything "
                    f"{now - self._heard_at:.1f} s ago, on a connection opened "
                    f"{now - self._opened_at:.1f} s ago that has read {self._heard_bytes} "
                    f"bytes in {self._heard_reads} reads)"
                )
            self._pump(0.05)

    def usable(self) -> bool:
        """Whether the connection is still open; checked before a kept connection is used
        again (without waiting).

        The client sends nothing while idle, so a connection kept across micro-batches
        that stays idle past the broker's `idle-timeout` is closed by the broker; so is
        every connection to a broker that restarted. Either shows as input waiting, and
        all of it is read: frames the broker sent before it went (the detach that ends a
        read) come before the end of the connection.
        """
        if self.closed:
            return False
        try:
            while self._pump(0):
                pass
            self._check_connection()
        except ClientError:
            self.close()
            return False
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            engine.close_connection(self.connection)
            self._flush()
        except (ClientError, OSError):
            pass
        try:
            self.sock.close()
        finally:
            self.engine.free()

    # ------------------------------------------------------------------ links

    def _close_link(self, link: Any) -> None:
        """Close `link`; it is freed once the broker's detach has come (`_free_closed`).
        A link only closed stays in the connection for good, and so does one freed
        before the broker's answer (proton keeps it): a kept connection would hold
        every read's link (about 3 KB each)."""
        engine.close_link(link)
        self._closing.append(link)

    def _free_closed(self) -> None:
        """Free the closed links the broker has answered (with the deliveries that were
        still coming for them: a read left early)."""
        open_links = []
        for link in self._closing:
            if engine.link_state(link) & engine.REMOTE_CLOSED:
                engine.free_link(link)
            else:
                open_links.append(link)
        self._closing = open_links

    def _receiver(
        self, address: str, filters: Mapping[str, Any] | None, *, presettled: bool
    ) -> Any:
        self._free_closed()
        self._tags += 1
        link = engine.new_receiver(self.session, f"scow-spark-{self._tags}", address, 0)
        if presettled:
            engine.set_sender_settle_mode_settled(link)
        if filters:
            encoded = codec.encode_value(
                {codec.Symbol(k): codec.Described(codec.Symbol(k), v) for k, v in filters.items()}
            )
            engine.set_source_filter(link, encoded)
        self.wait(lambda: bool(engine.link_state(link) & engine.REMOTE_ACTIVE), f"attach {address}")
        self._check_link(link, f"receiver from {address!r}")
        return link

    def _sender(self, address: str) -> Any:
        self._free_closed()
        self._tags += 1
        link = engine.new_sender(self.session, f"scow-spark-{self._tags}", address)
        self.wait(lambda: bool(engine.link_state(link) & engine.REMOTE_ACTIVE), f"attach {address}")
        self._check_link(link, f"sender to {address!r}")
        return link

    def _receive_one(self, link: Any) -> bytes | None:
        delivery = engine.link_current(link)
        if not delivery or engine.delivery_partial(delivery):
            return None
        size = engine.delivery_pending(delivery)
        buf, view = self._msg, self._msg_view
        if size > _IO_SIZE:
            buf, view = engine.new_buffer(size)
        got = engine.link_recv(link, buf, max(size, 1))
        data = bytes(view[: max(got, 0)])
        engine.link_advance(link)
        engine.delivery_update(delivery, engine.ACCEPTED)
        engine.delivery_settle(delivery)
        return data

    # ------------------------------------------------------------------ management

    def request(
        self,
        kind: str,
        name: str,
        operation: str,
        properties: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> tuple[int, str, Any]:
        """One `$management` request: (statusCode, statusDescription, body)."""
        if self._management is None:
            reply_to = f"scow.spark.reply.{uuid.uuid4()}"
            receiver = self._receiver(reply_to, None, presettled=False)
            engine.link_flow(receiver, 10)
            self._management = (self._sender(MANAGEMENT), receiver, reply_to)
        sender, receiver, reply_to = self._management
        self._request_id += 1
        request = codec.encode_message(
            body,
            body_kind="value",
            properties={"message_id": self._request_id, "reply_to": reply_to},
            application_properties={
                "operation": operation,
                "type": kind,
                "name": name,
                **(properties or {}),
            },
        )
        self._send_raw(sender, request)
        answer: list[bytes] = []

        def answered() -> bool:
            data = self._receive_one(receiver)
            if data is not None:
                answer.append(data)
            return bool(answer)

        self.wait(answered, f"{operation} {kind} {name!r}", receiver)
        if engine.link_credit(receiver) < 5:
            engine.link_flow(receiver, 10)
        info = codec.MessageInfo(answer[0])
        props = info.application_properties
        status = int(props.get("statusCode", 500))
        return status, str(props.get("statusDescription", "")), body_value(answer[0])

    def call(
        self,
        kind: str,
        name: str,
        operation: str,
        properties: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        """`request`, raising ClientError unless the status is 2xx; the answer's body."""
        status, description, answer = self.request(kind, name, operation, properties, body)
        if not 200 <= status < 300:
            raise ClientError(f"{operation} {kind} {name!r}: {status} {description}")
        return answer

    # ------------------------------------------------------------------ reading

    def read(
        self,
        queue: str,
        start: int,
        end: int,
        *,
        address: str | None = None,
        selector: str | None = None,
        credit: int = READ_CREDIT,
    ) -> Iterator[list[bytes]]:
        """The messages of stream `queue` from sequence `start` to `end` (exclusive), a
        list per round of `credit` deliveries, until the broker has no more of the range.
        The next round is asked for before a round is handed over, so that the broker
        reads it while the caller converts this one.

        Records come in packs of up to PACK_RECORDS (one at a time from a broker that
        does not pack). Each round grants `credit` in drain mode: a round that brings
        fewer deliveries than it asked for means the broker has sent all it holds of the
        range.
        """
        filters: dict[str, Any] = {
            "scow:stream-offset": codec.ULong(start),
            "scow:stream-end": codec.ULong(end),
            PACK_FILTER: codec.UInt(PACK_RECORDS),
        }
        if selector:
            filters["apache.org:selector-filter:string"] = selector
        link = self._receiver(f"{address or queue}::{queue}", filters, presettled=True)
        current, partial, pending, recv = (
            engine.link_current,
            engine.delivery_partial,
            engine.delivery_pending,
            engine.link_recv,
        )
        advance, settle, link_credit = (
            engine.link_advance,
            engine.delivery_settle,
            engine.link_credit,
        )
        buf, view = self._msg, self._msg_view
        try:
            engine.link_drain(link, credit)
            while True:
                batch: list[bytes] = []
                append = batch.append
                deliveries = 0
                while True:
                    delivery = current(link)
                    while delivery and not partial(delivery):
                        size = pending(delivery)
                        if size > _IO_SIZE:  # larger than the buffer: a buffer of its own
                            big, big_view = engine.new_buffer(size)
                            data = bytes(big_view[: recv(link, big, size)])
                        else:
                            data = bytes(view[: recv(link, buf, size)])
                        if not unpack(data, batch):
                            append(data)
                        deliveries += 1
                        advance(link)
                        settle(delivery)  # pre-settled by the broker: only freed here
                        delivery = current(link)
                    if link_credit(link) <= 0 and not engine.link_draining(link):
                        break
                    self._check_link(link, f"reading {queue!r}")
                    self._pump(self.endpoint.timeout)
                more = deliveries >= credit
                if more:
                    # the next round is read by the broker while the caller takes this one
                    engine.link_drain(link, credit)
                    self._flush()
                if batch:
                    yield batch
                if not more:
                    return
        finally:
            self._close_link(link)
            self._flush()

    # ------------------------------------------------------------------ sending

    def _send_raw(self, link: Any, data: bytes) -> Any:
        self._tags += 1
        return engine.send(link, _TAG.pack(self._tags), data)

    def sender(self, address: str, window: int = SEND_WINDOW) -> Sender:
        """A link sending to `address` (see `Sender`)."""
        return Sender(self, address, window)

    def send(self, address: str, messages: Iterable[bytes]) -> int:
        """Send every message and wait until the broker accepted each; how many."""
        sender = self.sender(address)
        try:
            sender.put(messages)
            sender.finish()
        finally:
            sender.detach()
        return sender.sent


class Sender:
    """Sends on one link, at most `window` unsettled: messages go out as `put` is given
    them; `finish` waits for the outcomes of those still unsettled; `detach` ends the link.

    Several senders (one per broker) can be fed in turn: each waits only on its own
    broker's window.
    """

    def __init__(self, client: Client, address: str, window: int = SEND_WINDOW) -> None:
        self.client = client
        self.address = address
        self.window = window
        self.link = client._sender(address)
        self.unsettled: list[Any] = []
        self.sent = 0
        self._closed = False

    def _settle(self) -> bool:
        """Settle what the broker accepted, oldest first, up to the first delivery still
        without an outcome; True once nothing is left unsettled.

        Outcomes come in the order of the sends (each after its journal sync), so looking
        past that delivery would only rescan the window at every pump; one accepted out of
        order is settled once those before it are.
        """
        unsettled = self.unsettled
        state_of, settle, accepted = (
            engine.delivery_remote_state,
            engine.delivery_settle,
            engine.ACCEPTED,
        )
        done = 0
        for delivery in unsettled:
            state = state_of(delivery)
            if state == accepted:
                settle(delivery)
                done += 1
            elif state or engine.delivery_settled(delivery):
                raise ClientError(f"the broker refused a message sent to {self.address!r}")
            else:
                break
        del unsettled[:done]
        return not unsettled

    def put(self, messages: Iterable[bytes]) -> None:
        """Send `messages` (waiting for credit or outcomes when the window is full)."""
        client, link, unsettled = self.client, self.link, self.unsettled
        credit, send, window = engine.link_credit, client._send_raw, self.window
        what = f"sending to {self.address!r}"
        for data in messages:
            while credit(link) <= 0 or len(unsettled) >= window:
                client._check_link(link, what)
                client._pump(0.05)
                self._settle()
            unsettled.append(send(link, data))
            self.sent += 1
            if self.sent % 1000 == 0:
                client._flush()
        client._flush()

    def finish(self) -> None:
        """Wait until the broker accepted every message sent (ClientError if it refused one)."""
        self.client.wait(self._settle, f"outcomes from {self.address!r}", self.link)

    def detach(self) -> None:
        if not self._closed:
            self._closed = True
            self.client._close_link(self.link)
            self.client._flush()


def body_value(data: bytes) -> Any:
    """An amqp-value body as a Python value (a management answer); None without one."""
    sections = codec.scan_sections(data)
    if sections.body is None or sections.body_code != codec.AMQP_VALUE:
        return None
    described = codec.decode_value(data, sections.body[0])[0]
    return described.value if isinstance(described, codec.Described) else described
