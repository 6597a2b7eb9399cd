"""One STOMP client connection: frames in, broker calls, frames out.

Every failure the client caused (a malformed frame, a refused SEND, an unknown
subscription) is answered with an ERROR frame and the connection is closed, as STOMP
1.2 requires; other connections are not affected. Receipts keep the order of the frames
that asked for them: a RECEIPT is written only once every earlier durable SEND or
COMMIT is on disk, so the receipt of a DISCONNECT covers everything before it.

Large messages (`scow_stomp.large`) never pass whole through memory: a large SEND's body
goes to its file as it arrives, and a large MESSAGE's body goes from its file to the
socket while asyncio takes more (`pause_writing`); frames written meanwhile wait their
turn, and subscriptions take no messages until it is out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from scow.core import (
    BrokerError,
    ConnectionInfo,
    LargeHead,
    MessageRef,
    RouteStatus,
    Transaction,
    remote_of,
)
from scow_stomp import convert, frames
from scow_stomp.large import IncomingSend, StreamedFrame
from scow_stomp.login import LoginRefused, authorizer, login
from scow_stomp.subscription import Subscription

if TYPE_CHECKING:
    from scow_stomp.server import StompServer

log = structlog.get_logger("scow.stomp")

VERSION = "1.2"
#: Destinations a connection remembers its send permission for.
MAX_CHECKED = 1024
#: Bytes of a streamed body written per turn of the loop, so that a consumer as fast as
#: the socket does not hold up every other connection.
STREAM_TURN = 4 << 20
#: What may hold a connection's reading paused (see `_hold_input`).
_STORING = "a large SEND waiting for its store to have all of it"
_BEHIND = "a store that is behind"


class ClientError(Exception):
    """The client asked for something that cannot be done: ERROR, then close."""

    def __init__(self, message: str, receipt: str | None = None) -> None:
        super().__init__(message)
        #: The receipt the failed frame asked for, echoed as the ERROR's receipt-id.
        self.receipt = receipt


@dataclass
class _Tx:
    tx: Transaction
    #: NACKed messages, released when the transaction ends either way.
    nacks: list[MessageRef] = field(default_factory=list)


def _required(frame: frames.Frame, name: str) -> str:
    value = frame.headers.get(name)
    if not value:
        raise ClientError(f"{frame.command} frame without the required '{name}' header")
    return value


class StompConnection(asyncio.Protocol):
    """asyncio protocol for one STOMP socket."""

    def __init__(self, server: StompServer) -> None:
        self.server = server
        self.broker = server.broker
        self.parser = frames.Parser(
            server.max_frame_size, server.min_large_message_size, server.max_message_size
        )
        self.socket: asyncio.Transport | None = None
        self.info = ConnectionInfo(
            self.broker.next_connection_number(),
            "stomp",
            "",
            close=self.close_forced,
            links=self.describe_links,
        )
        self.connected = False
        #: The STOMP version agreed at CONNECT (1.1 or 1.2).
        self.version = VERSION
        #: Who logged in (the broker security's principal); None while anonymous.
        self.principal: Any = None
        #: `authorize(permission, address)`, None while the broker enforces nothing.
        self.authorize: Any = None
        #: Destinations this connection may send to, checked once each.
        self._may_send: set[str] = set()
        #: Counted by the broker security's connection limits.
        self._admitted = False
        self.closed = False
        #: True while asyncio has paused writing: subscriptions take no messages.
        self.paused = False
        self.subscriptions: dict[str, Subscription] = {}
        #: Which subscription holds each unacknowledged ack id.
        self.acks: dict[str, Subscription] = {}
        self.transactions: dict[str, _Tx] = {}
        self._ack_ids = itertools.count(1)
        self._out: list[bytes] = []
        #: The large SEND whose body is arriving, if any.
        self._incoming: IncomingSend | None = None
        #: While a large SEND waits for its store to answer (`when_stored`), the frames
        #: after it wait too (they are routed after it): the parser's events not yet
        #: handled, and the socket's reading paused.
        self._held: Iterator[frames.Frame | frames.BodyPart] | None = None
        #: What holds the socket's reading paused: a large SEND waiting for its store,
        #: a store that is behind (`room`).
        self._input_holders: set[str] = set()
        #: The MESSAGE whose body is being written from its file, and the frames
        #: written meanwhile, which wait for it.
        self._stream: StreamedFrame | None = None
        self._after_stream: deque[bytes | StreamedFrame] = deque()
        #: Durable sends and commits not yet on disk, and the receipts waiting for them.
        self._unstored = 0
        self._receipts: list[bytes] = []
        #: DISCONNECT arrived: frames after it are ignored, the socket closes once stored.
        self._closing = False
        self._last_read = time.monotonic()
        self._last_write = time.monotonic()
        self._timers: list[asyncio.TimerHandle] = []

    # ------------------------------------------------------------------ socket side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.info.remote = remote_of(transport)
        if not self.broker.security.take_socket(self.info.remote):  # storage keeps its files
            self.closed = True
            transport.abort()
            return
        self.socket = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed or self._closing:
            return
        self._last_read = time.monotonic()
        events = self.parser.feed(data)
        if self._held is not None:  # read before the pause took effect: after the rest
            self._held = itertools.chain(self._held, events)
            return
        self._take(events)

    def _take(self, events: Iterator[frames.Frame | frames.BodyPart]) -> None:
        """Handle the parser's events, until a large SEND waits for its store."""
        with self._failing():
            for event in events:
                if isinstance(event, frames.BodyPart):
                    self._send_part(event)
                else:
                    self._handle(event)
                if self.closed or self._closing:
                    return
                if _STORING in self._input_holders:
                    self._held = events
                    return

    @contextlib.contextmanager
    def _failing(self) -> Iterator[None]:
        """Turn what a frame's handling raises into an ERROR frame and the close."""
        try:
            yield
        except frames.FrameTooLarge as exc:
            self.fail(f"frame refused: {exc}")
        except frames.FrameError as exc:
            self.fail(f"malformed frame: {exc}")
        except ClientError as exc:
            self.fail(str(exc), receipt=exc.receipt)
        except Exception:  # a bug must cost this connection only, never the broker
            log.exception("stomp connection failed", remote=self.info.remote)
            self.fail("the broker failed on this connection")

    def _hold_input(self, holder: str) -> None:
        """Stop reading the socket until every holder has let go (`_release_input`)."""
        if not self._input_holders and self.socket is not None:
            self.socket.pause_reading()
        self._input_holders.add(holder)

    def _release_input(self, holder: str) -> None:
        self._input_holders.discard(holder)
        socket = self.socket
        if not self._input_holders and socket is not None and not socket.is_closing():
            socket.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cleanup()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._stream is not None:
            self.pump()  # offers more once the stream is out
        else:
            self._offer()

    def _offer(self) -> None:
        """Have the subscriptions' queues hand out what the connection can take now."""
        for subscription in list(self.subscriptions.values()):
            if self.paused or self._stream is not None:
                return
            subscription.queue.dispatch()

    @property
    def busy(self) -> bool:
        """The socket takes no more for now: asyncio paused writing, or a body streams."""
        return self.paused or self._stream is not None

    def write(self, data: bytes) -> None:
        """Queue bytes for the socket; written together after the current callback
        (after the body being streamed, if one is)."""
        if self._stream is not None:
            self._after_stream.append(data)
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)

    def write_streamed(self, frame: StreamedFrame) -> None:
        """Write a frame whose body is read from its file as the socket takes it."""
        if self._stream is not None:
            self._after_stream.append(frame)
            return
        self._start_stream(frame)
        self.pump()

    def _start_stream(self, frame: StreamedFrame) -> None:
        self._flush()
        self._stream = frame

    def pump(self) -> None:
        """Write more of the streamed body while the socket takes it; once it is out,
        what waited for it, and then the subscriptions may take more."""
        written = 0
        ended = False
        while (stream := self._stream) is not None and not self.paused and not self.closed:
            if written >= STREAM_TURN:  # the rest in a later turn of the loop
                asyncio.get_running_loop().call_soon(self.pump)
                return
            try:
                chunk = next(stream.chunks, None)
            except OSError as exc:
                log.error("large message not delivered", reason=str(exc))
                self.fail(f"a large message's body could not be read: {exc}")
                return
            assert self.socket is not None
            if chunk == b"":  # the store is still reading: it calls `pump` once it has
                return
            if chunk is not None:
                self.socket.write(chunk)
                self._last_write = time.monotonic()
                written += len(chunk)
                continue
            self.socket.write(b"\x00")
            self._stream = None
            ended = True
            if stream.ref is not None:
                self.broker.acknowledge(stream.ref)
            while self._after_stream and self._stream is None:
                item = self._after_stream.popleft()
                if isinstance(item, StreamedFrame):
                    self._start_stream(item)
                else:
                    self.write(item)
        if ended and self._stream is None:
            self._offer()

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and self.socket is not None and not self.socket.is_closing():
            self.socket.write(b"".join(out))
            self._last_write = time.monotonic()

    def fail(self, message: str, receipt: str | None = None) -> None:
        """Answer ERROR (the first line of `message` as its header), then close."""
        if self.closed:
            return
        log.info("stomp connection failed", remote=self.info.remote, reason=message)
        headers = {"message": message.splitlines()[0][:200], "content-type": "text/plain"}
        if receipt:
            headers["receipt-id"] = receipt
        self.write(frames.encode("ERROR", headers, message.encode()))
        self._close()

    def close_forced(self, reason: str) -> None:
        """Close at the broker's request (management), telling the client why."""
        self.fail(f"connection closed by the broker: {reason}")

    def _close(self) -> None:
        self._flush()
        if self.socket is not None and not self.socket.is_closing():
            self.socket.close()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        for timer in self._timers:
            timer.cancel()
        if self._incoming is not None:
            self._incoming.abandon()
            self._incoming = None
        self._held = None
        self._input_holders.clear()
        self._drop_streams()
        for state in self.transactions.values():
            self._abort(state)
        self.transactions.clear()
        for subscription in list(self.subscriptions.values()):
            subscription.close(remove_subscription=False)
        self.subscriptions.clear()
        self.server.connections.discard(self)
        self.broker.security.socket_closed()
        if self._admitted:
            self.broker.security.release(self.principal)
        if self.connected:
            self.broker.hooks.scow_connection_closed(info=self.info)

    def _drop_streams(self) -> None:
        """The connection goes: large messages not written whole go back to their queues
        (a failed delivery); those the client acknowledges go back with its subscription."""
        streams = [self._stream, *self._after_stream]
        self._stream = None
        self._after_stream.clear()
        for stream in streams:
            if isinstance(stream, StreamedFrame):
                stream.chunks.close()
                if stream.ref is not None:
                    self.broker.release(stream.ref, delivered=True)

    def describe_links(self) -> list[dict[str, Any]]:
        return [
            {
                "name": sub.id,
                "role": "consumer",
                "queue": sub.queue.name,
                "ack": sub.ack,
                "unsettled": len(sub.pending),
                "selector": sub.filter is not None,
            }
            for sub in self.subscriptions.values()
        ]

    def next_ack_id(self) -> str:
        return str(next(self._ack_ids))

    # ------------------------------------------------------------------ frames

    def _handle(self, frame: frames.Frame) -> None:
        command = frame.command
        if not self.connected:
            if command not in ("CONNECT", "STOMP"):
                raise ClientError(f"{command} before CONNECT: the first frame must be CONNECT")
            self._connect(frame)
            return
        handler = self._handlers.get(command)
        if handler is None:  # a second CONNECT
            raise ClientError(f"{command}: this connection is already connected")
        receipt = frame.headers.get("receipt")
        try:
            handler(self, frame)
        except BrokerError as exc:
            raise ClientError(f"{command} refused: {exc.description}", receipt) from None
        except ClientError as exc:
            exc.receipt = receipt
            raise
        if command != "DISCONNECT" and receipt is not None and not frame.streamed:
            self._receipt(receipt)  # a streamed SEND's, once its body is whole

    def _receipt(self, receipt_id: str) -> None:
        data = frames.encode("RECEIPT", {"receipt-id": receipt_id})
        if self._unstored:
            self._receipts.append(data)  # after the durable frames before it
        else:
            self.write(data)

    def _stored(self) -> None:
        self._unstored -= 1
        if not self._unstored and not self.closed:
            for data in self._receipts:
                self.write(data)
            self._receipts.clear()
            if self._closing:
                self._close()

    def _connect(self, frame: frames.Frame) -> None:
        versions = frame.headers.get("accept-version", "1.0").split(",")
        if VERSION not in versions and "1.1" not in versions:
            self.write(
                frames.encode(
                    "ERROR",
                    {"version": "1.1,1.2", "content-type": "text/plain"},
                    f"unsupported STOMP version {','.join(versions)} (accepted: 1.1, 1.2)".encode(),
                )
            )
            self._close()
            return
        username = frame.headers.get("login")
        try:
            self.principal = login(
                self.broker, username, frame.headers.get("passcode"), self.info.remote
            )
        except LoginRefused as exc:
            self._refuse_login(str(exc), exc.delayed)
            return
        self._admitted = True
        self.authorize = authorizer(self.broker, self.principal)
        self.info.user = username
        self.info.container_id = frame.headers.get("client-id", "")
        self.version = VERSION if VERSION in versions else "1.1"
        send_ms, receive_ms = self._heart_beat(frame.headers.get("heart-beat", "0,0"))
        self.connected = True
        self.write(
            frames.encode(
                "CONNECTED",
                {
                    "version": self.version,
                    "session": str(self.info.id),
                    "server": f"scow-stomp/{self.server.version}",
                    "heart-beat": f"{send_ms},{receive_ms}",
                },
            )
        )
        self.broker.hooks.scow_connection_opened(info=self.info)

    def _refuse_login(self, message: str, delayed: bool) -> None:
        """ERROR and close; a wrong password hears so only after the security's delay."""
        delay = self.broker.security.login_failure_delay if delayed else 0
        if not delay or self.socket is None:
            self.fail(message)
            return
        self._closing = True  # nothing more is read from this client
        self.socket.pause_reading()
        self._timers.append(asyncio.get_running_loop().call_later(delay, self.fail, message))

    def _heart_beat(self, value: str) -> tuple[int, int]:
        """Negotiate heart-beats (STOMP 1.2 "Heart-beating"); start the timers."""
        try:
            cx, cy = (int(v) for v in value.split(","))
        except ValueError:
            raise ClientError(f"heart-beat {value!r}: expected two integers 'cx,cy'") from None
        sx, sy = self.server.heart_beat_send, self.server.heart_beat_receive
        send_every = max(sx, cy) if sx and cy else 0
        expect_every = max(cx, sy) if cx and sy else 0
        loop = asyncio.get_running_loop()
        if send_every:
            self._timers.append(loop.call_later(send_every / 1000, self._beat, send_every / 1000))
        if expect_every:
            # the client may be late by as much again before it counts as gone
            grace = 2 * expect_every / 1000
            self._timers.append(loop.call_later(grace, self._check_alive, grace))
        return sx, sy

    def _beat(self, every: float) -> None:
        if self.closed:
            return
        if time.monotonic() - self._last_write >= every * 0.9 and not self._out:
            self.write(b"\n")
        self._timers.append(asyncio.get_running_loop().call_later(every, self._beat, every))

    def _check_alive(self, grace: float) -> None:
        if self.closed:
            return
        if time.monotonic() - self._last_read > grace:
            self.fail(f"no frame or heart-beat from the client for {grace:.1f} s")
            return
        self._timers.append(
            asyncio.get_running_loop().call_later(grace / 2, self._check_alive, grace)
        )

    def _send(self, frame: frames.Frame) -> None:
        destination = _required(frame, "destination")
        address, routing = self.server.destinations.resolve(destination, frame.headers)
        if address not in self._may_send:
            if self.authorize is not None:
                self.authorize("send", address)
            self.broker.address_for(address, routing, self.authorize)
            if len(self._may_send) >= MAX_CHECKED:
                self._may_send.clear()  # destinations can be unbounded (per-client replies)
            self._may_send.add(address)
        self._check_room(address)
        tx = self._tx(frame).tx if "transaction" in frame.headers else None
        if frame.streamed:
            self._begin_large_send(frame, destination, address, routing, tx)
            return
        try:
            head, body = convert.to_amqp_sections(frame.headers, frame.body, address)
        except ValueError as exc:
            raise ClientError(f"SEND to {destination!r}: {exc}") from None
        if len(head) + len(body) < self.server.min_large_message_size:
            self._route(head + body, address, routing, tx)
            return
        # a large message (a text body, or headers that made it one) that came whole
        broker = self.broker
        large = broker.large_messages
        durable = convert.persistent(frame.headers)
        try:
            data = large.write_whole(broker.next_id(), head, body, sync=large.sync and durable)
        except OSError as exc:
            raise ClientError(f"SEND to {destination!r}: large message not stored: {exc}") from None
        self._route_large(data, address, routing, tx)

    def _begin_large_send(
        self, frame: frames.Frame, destination: str, address: str, routing: Any, tx: Any
    ) -> None:
        """A SEND over min-large-message-size: its body goes to its file as it comes
        (a text body without content-length, once it has passed that size)."""
        try:
            head = convert.to_amqp_head(frame.headers, address)
        except ValueError as exc:
            raise ClientError(f"SEND to {destination!r}: {exc}") from None
        broker = self.broker
        large = broker.large_messages
        try:
            self._incoming = IncomingSend(
                large,
                broker.next_id(),
                head,
                size if (size := frame.headers.get("content-length")) is None else int(size),
                sync=large.sync and convert.persistent(frame.headers),
                address=address,
                routing=routing,
                tx=tx,
                receipt=frame.headers.get("receipt"),
            )
        except OSError as exc:
            raise ClientError(f"SEND to {destination!r}: large message not stored: {exc}") from None

    def _send_part(self, part: frames.BodyPart) -> None:
        """More of a large SEND's body; routed once it is whole and stored."""
        incoming = self._incoming
        assert incoming is not None  # a failed SEND closed the connection
        try:
            incoming.write(part.data)
            if not part.last:
                if not incoming.arrival.room(self._store_caught_up):
                    self._hold_input(_BEHIND)
                return
            self._incoming = None
            data = incoming.complete()
        except (OSError, ValueError) as exc:
            self._incoming = None
            incoming.abandon()
            raise ClientError(incoming.refused(exc), incoming.receipt) from None
        # the frames after it wait until its store has every byte (or refused some)
        self._hold_input(_STORING)
        incoming.arrival.when_stored(lambda error: self._incoming_stored(incoming, data, error))

    def _store_caught_up(self) -> None:
        self._release_input(_BEHIND)

    def _incoming_stored(self, incoming: IncomingSend, data: LargeHead, error: str | None) -> None:
        """A large SEND's store has all of it: route it, or refuse it (its body goes)."""
        if self.closed or error is not None:
            data.body.acquire()
            data.body.release()  # nothing refers to it: the body goes
            if not self.closed:
                self.fail(incoming.refused(error), incoming.receipt)
            return
        with self._failing():
            try:
                self._route_large(data, incoming.address, incoming.routing, incoming.tx)
            except BrokerError as exc:
                raise ClientError(f"SEND refused: {exc.description}", incoming.receipt) from None
            if incoming.receipt is not None:
                self._receipt(incoming.receipt)
        self._release_input(_STORING)
        held, self._held = self._held, None
        if held is not None and not self.closed:
            self._take(held)

    def _route_large(self, data: LargeHead, address: str, routing: Any, tx: Any) -> None:
        data.body.acquire()  # held while it is routed: the file goes if nothing keeps it
        try:
            self._route(data, address, routing, tx)
        finally:
            data.body.release()

    def _route(self, data: bytes, address: str, routing: Any, tx: Any) -> None:
        broker = self.broker
        if tx is not None:
            broker.send(data, address, broker.message_format, routing, tx=tx)
            return
        self._unstored += 1
        status = broker.send(data, address, broker.message_format, routing, self._stored)
        if status is not RouteStatus.PENDING:
            self._stored()

    def _check_room(self, address: str) -> None:
        """STOMP cannot hold a producer back: while it would be blocked, refuse and close."""
        broker = self.broker
        if broker.limits.disk_full:
            raise ClientError(
                f"the broker's storage takes no more messages now (blocked by: "
                f"{', '.join(broker.limits.reasons)}: the disk is full or cannot keep up) and "
                "producers are held back; STOMP has no flow control, so this connection "
                "closes (messages sent before are kept)"
            )
        info = broker.get_address(address)
        policy = info.full_policy if info is not None else None
        if policy is not None and policy.blocks_producers():
            raise ClientError(
                f"address '{address}' is full and blocks producers (address-full-policy "
                f"{info.settings.address_full_policy}); STOMP has no flow control, so this "  # type: ignore[union-attr]
                "connection closes (messages sent before are kept)"
            )

    def _subscribe(self, frame: frames.Frame) -> None:
        sub_id = _required(frame, "id")
        destination = _required(frame, "destination")
        if sub_id in self.subscriptions:
            raise ClientError(f"SUBSCRIBE: subscription id '{sub_id}' is already in use")
        address, routing = self.server.destinations.resolve(destination, frame.headers)
        subscription = Subscription(
            self,
            sub_id,
            destination,
            frame.headers.get("ack", "auto"),
            self.server.subscription_window,
        )
        name = frame.headers.get("durable-subscription-name") or frame.headers.get(
            "activemq.subscriptionName"
        )
        subscription.durable = bool(name)
        if self.authorize is not None:
            self.authorize("consume", address)
        subscription.queue = self.broker.subscribe(
            subscription,
            address,
            routing_type=routing,
            selector=frame.headers.get("selector"),
            durable=bool(name),
            subscription=name,
            client_id=self.info.container_id,
            authorize=self.authorize,
        )
        self.subscriptions[sub_id] = subscription

    def _unsubscribe(self, frame: frames.Frame) -> None:
        sub_id = _required(frame, "id")
        subscription = self.subscriptions.get(sub_id)
        if subscription is None:
            raise ClientError(f"UNSUBSCRIBE: no subscription with id '{sub_id}'")
        if subscription.durable and self.authorize is not None:
            self.authorize("deleteDurableQueue", subscription.queue.address)
        del self.subscriptions[sub_id]
        subscription.close(remove_subscription=subscription.durable)

    def _settled(self, frame: frames.Frame) -> list[MessageRef]:
        ack_id = frame.headers.get("id") or frame.headers.get("message-id")
        if not ack_id:
            raise ClientError(f"{frame.command} frame without the required 'id' header")
        subscription = self.acks.get(ack_id)
        if subscription is None:
            raise ClientError(
                f"{frame.command}: '{ack_id}' is not an unacknowledged message of this connection"
            )
        return subscription.settle(ack_id)

    def _ack(self, frame: frames.Frame) -> None:
        tx = self._tx(frame).tx if "transaction" in frame.headers else None
        for ref in self._settled(frame):
            self.broker.acknowledge(ref, tx)

    def _nack(self, frame: frames.Frame) -> None:
        state = self._tx(frame) if "transaction" in frame.headers else None
        for ref in self._settled(frame):
            if state is not None:
                state.nacks.append(ref)
            else:
                self.broker.release(ref, delivered=True)

    def _tx(self, frame: frames.Frame) -> _Tx:
        name = frame.headers["transaction"]
        state = self.transactions.get(name)
        if state is None:
            raise ClientError(f"{frame.command}: no transaction '{name}' was begun")
        return state

    def _begin(self, frame: frames.Frame) -> None:
        name = _required(frame, "transaction")
        if name in self.transactions:
            raise ClientError(f"BEGIN: transaction '{name}' is already open")
        self.transactions[name] = _Tx(self.broker.begin())

    def _commit(self, frame: frames.Frame) -> None:
        _required(frame, "transaction")
        state = self.transactions.pop(frame.headers["transaction"], None)
        if state is None:
            raise ClientError(f"COMMIT: no transaction '{frame.headers['transaction']}'")

        def done() -> None:
            for ref in state.nacks:
                self.broker.release(ref, delivered=True)
            self._stored()

        self._unstored += 1
        try:
            self.broker.commit(state.tx, done)
        except BrokerError:
            self._unstored -= 1
            self._abort(state)
            raise

    def _abort_frame(self, frame: frames.Frame) -> None:
        _required(frame, "transaction")
        state = self.transactions.pop(frame.headers["transaction"], None)
        if state is None:
            raise ClientError(f"ABORT: no transaction '{frame.headers['transaction']}'")
        self._abort(state)

    def _abort(self, state: _Tx) -> None:
        self.broker.rollback(state.tx)
        for ref in state.nacks:
            self.broker.release(ref, delivered=True)

    def _disconnect(self, frame: frames.Frame) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._receipt(receipt)
        if self._unstored:
            self._closing = True  # `_stored` closes once the receipts are out
        else:
            self._close()

    _handlers: dict[str, Callable[[StompConnection, frames.Frame], None]] = {
        "SEND": _send,
        "SUBSCRIBE": _subscribe,
        "UNSUBSCRIBE": _unsubscribe,
        "ACK": _ack,
        "NACK": _nack,
        "BEGIN": _begin,
        "COMMIT": _commit,
        "ABORT": _abort_frame,
        "DISCONNECT": _disconnect,
    }
