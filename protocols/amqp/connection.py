"""One client connection: socket bytes in, proton events to broker calls, bytes out."""

from __future__ import annotations

import asyncio
import platform
import time
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.ha import failover_server_list
from scow.core.model import BrokerError, ConnectionInfo, ResourceLimitExceeded, remote_of
from scow.core.security import Principal
from scow.core.security.tls import subject_name
from scow.protocols.amqp import engine
from scow.protocols.amqp.links import ConsumerLink, ProducerLink
from scow.protocols.amqp.management import MANAGEMENT_NODE, ManagementLink
from scow.protocols.amqp.sasl import SaslServer, State
from scow.protocols.amqp.transactions import CoordinatorLink

if TYPE_CHECKING:
    from scow.core.broker import Transaction
    from scow.protocols.amqp.server import AmqpServer

log = structlog.get_logger("scow.amqp")


#: Bytes of large messages' bodies one flush adds to the output before it lets the loop
#: serve others (the rest follows in the next flush).
STREAM_BUDGET = 4 << 20
#: Bytes of messages consumer links may hand to proton between two writes to the socket.
#: Past it they take no more until the output is written, and while the socket's write
#: buffer is full (`WRITE_BUFFER_HIGH`) none at all: a consumer that grants much credit
#: and then stops reading (frozen, or on a stalled network) costs the broker this and its
#: socket's buffers, not a copy of every message its credit covers.
OUTPUT_ROOM = 1 << 20
#: What asyncio may hold of a socket's output beyond what the kernel took before it calls
#: `pause_writing` (then nothing more is added: no deliveries, no large message's body),
#: and `resume_writing` once it is down to a quarter. Well above one flush's output, so a
#: consumer that reads keeps its socket full (asyncio's own 64 KiB paused a fast drain).
WRITE_BUFFER_HIGH = 2 << 20


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


#: An empty AMQP frame (size 8, data offset 2, type AMQP, channel 0): a heartbeat.
_HEARTBEAT = b"\x00\x00\x00\x08\x02\x00\x00\x00"


class _AnswerTooLarge(BrokerError):
    condition = "amqp:frame-size-too-small"


class AmqpConnection(asyncio.Protocol):
    """asyncio protocol driving a proton Transport/Connection pair for one socket."""

    def __init__(self, server: AmqpServer, *, counted: bool = False) -> None:
        self.server = server
        #: Whether its socket is counted already (`_TlsAccept` counts at the accept).
        self._counted = counted
        self.broker = server.broker
        self.engine = engine.Engine(
            max_frame=server.max_frame_size, idle_timeout_ms=server.idle_timeout
        )
        self.security = server.broker.security
        self.sasl: SaslServer | None = None
        #: Who the client is, once SASL is done (the anonymous principal without SASL).
        self.principal: Principal | None = None
        #: `authorize(permission, address)` for the broker, None while nothing is enforced.
        self.authorize: Any = None
        #: Sessions this connection opened (refused ones are not counted).
        self.sessions: set[Any] = set()
        self.links: dict[Any, ProducerLink | ConsumerLink | CoordinatorLink | ManagementLink] = {}
        #: Declared, undischarged transactions by their AMQP txn-id.
        self.transactions: dict[bytes, Transaction] = {}
        self.socket: asyncio.Transport | None = None
        self.info = ConnectionInfo(
            self.broker.next_connection_number(),
            "amqp",
            "",
            close=self.close_forced,
            links=self.describe_links,
        )
        self.closed = False
        self.container_id = ""
        #: Output is waiting and a flush is scheduled (`mark_dirty`).
        self.dirty = False
        self._timer: asyncio.TimerHandle | None = None
        #: Closes the connection if its AMQP open has not come in time (handshake-timeout).
        self._handshake: asyncio.TimerHandle | None = None
        self._opened = False
        self._admitted = False
        #: Bytes of partial (still arriving) messages held by this connection's links.
        self.partial_bytes = 0
        #: Consumer links streaming a large message from its file, fed as output drains.
        self.streams: list[ConsumerLink] = []
        self._writing_paused = False
        #: Bytes consumer links may still hand over before the next write (`OUTPUT_ROOM`),
        #: and the links that found none: they are offered messages again once there is.
        self.out_room = OUTPUT_ROOM
        self.held_links: list[ConsumerLink] = []
        #: What holds the socket's input back (see `hold_input`).
        self._input_holders: set[object] = set()
        #: Milliseconds the input was held before now, and since when it is held now,
        #: if it is: proton's clock leaves them out (see `_clock`).
        self._held_ms = 0
        self._held_since: int | None = None
        #: What holds the engine's events back (see `hold_events`), if anything.
        self.events_held: object | None = None

    # ------------------------------------------------------------------ socket side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.info.remote = remote_of(transport)
        if not self._counted and not self.security.take_socket(self.info.remote):
            # storage keeps its files
            self.closed = True
            self.engine.free()
            transport.abort()
            return
        self.socket = transport  # type: ignore[assignment]
        self.socket.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_HIGH // 4)
        tls = transport.get_extra_info("ssl_object")
        self.sasl = SaslServer(
            mechanisms=self.server.sasl_mechanisms,
            security=self.security,
            peer=self.info.remote,
            certificate_name=subject_name(tls.getpeercert()) if tls is not None else None,
        )
        self.server.connections.add(self)
        if self.server.handshake_timeout:
            self._handshake = asyncio.get_running_loop().call_later(
                self.server.handshake_timeout / 1000, self._handshake_expired
            )

    def _handshake_expired(self) -> None:
        self._handshake = None
        if self.closed or self.socket is None:
            return
        log.info(
            "connection closed",
            remote=self.info.remote,
            reason=f"no AMQP open within handshake-timeout ({self.server.handshake_timeout} ms)",
            stage="SASL" if self.principal is None else "open",
        )
        self.socket.abort()

    def _end_handshake(self) -> None:
        if self._handshake is not None:
            self._handshake.cancel()
            self._handshake = None

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        sasl = self.sasl
        if sasl is None and self.principal is None:
            return  # the login failed: nothing more is read
        if sasl is not None:
            out, data = sasl.feed(data)
            if out and self.socket is not None:
                self.socket.write(out)
            if sasl.state is State.FAILED:
                self._refuse_login(sasl)
                return
            if not data:
                return
            self._authenticated(sasl.principal)
        if not self.engine.push(data):
            self.engine.close_input()
        self.process()

    def _authenticated(self, principal: Principal | None) -> None:
        """SASL is done: from now on bytes go straight to proton."""
        self.sasl = None
        self.principal = principal
        self.info.user = principal.name if principal is not None else None
        security = self.security
        if security.enforcing:
            self.authorize = lambda permission, address: security.check(
                principal, permission, address
            )

    def _refuse_login(self, sasl: SaslServer) -> None:
        """Close after a failed login; a wrong password hears so only after the delay."""
        log.info("connection refused", remote=self.info.remote, reason=sasl.error)
        self.sasl = None
        if not sasl.deferred or self.socket is None:
            self._close_socket()
            return
        self.socket.pause_reading()

        def answer() -> None:
            if self.socket is not None and not self.socket.is_closing():
                self.socket.write(sasl.deferred)
            self._close_socket()

        asyncio.get_running_loop().call_later(self.security.login_failure_delay, answer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        if self.principal is None:  # gone before AMQP began: proton never saw a byte
            self._cleanup()
            return
        self.engine.close_input()
        self.engine.close_output()
        self._process_events()
        self._cleanup()

    def hold_input(self, holder: object) -> None:
        """Stop reading the socket until every holder has let go (`release_input`): a
        large message's store that is behind holds it, so the producer's bytes wait in
        the network, not in memory."""
        if not self._input_holders and self.socket is not None:
            self.socket.pause_reading()
            self._held_since = _monotonic_ms()
        self._input_holders.add(holder)

    def hold_events(self, holder: object) -> None:
        """Handle no more of the engine's events (nor read the socket) until `holder`
        lets go (`release_events`): a large message waiting for its store is routed
        before anything that came after it."""
        self.events_held = holder
        self.hold_input(holder)

    def release_events(self, holder: object) -> None:
        """`holder` no longer holds the events: those waiting are handled now."""
        if self.events_held is holder:
            self.events_held = None
            self.release_input(holder)
            self.process()

    def release_input(self, holder: object) -> None:
        """`holder` no longer holds the input (see `hold_input`)."""
        if holder in self._input_holders:
            self._input_holders.discard(holder)
            if self._input_holders:
                return
            if self._held_since is not None:
                self._held_ms += _monotonic_ms() - self._held_since
                self._held_since = None
            socket = self.socket
            if socket is not None and not socket.is_closing():
                socket.resume_reading()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self.out_room = 0  # the peer does not read: no more deliveries until it does

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._room_again()
        if self.streams:
            self.mark_dirty()

    def hold_delivery(self, link: ConsumerLink) -> None:
        """`link` found no room for output (see `OUTPUT_ROOM`): offer it messages again
        once there is."""
        if link not in self.held_links:
            self.held_links.append(link)

    def _room_again(self) -> None:
        """The output was written: links may hand over `OUTPUT_ROOM` bytes more, and
        those that waited for it are served as a credit grant would serve them."""
        self.out_room = OUTPUT_ROOM
        held, self.held_links = self.held_links, []
        for link in held:
            if not (link.closed or self.closed):
                link.on_flow()

    def _close_socket(self) -> None:
        if self.socket is not None and not self.socket.is_closing():
            self.socket.close()

    # ------------------------------------------------------------------ engine side

    def describe_links(self) -> list[dict[str, Any]]:
        return [handler.describe() for handler in self.links.values()]

    def close_forced(self, reason: str) -> None:
        """Close at the broker's request (management), telling the client why."""
        if not self.closed:
            engine.close_connection(self.engine.connection, "amqp:connection:forced", reason)
            self.mark_dirty()

    def mark_dirty(self) -> None:
        """Output is waiting: flush this connection once the current work is done."""
        if not self.dirty:
            self.dirty = True
            self.server.schedule_flush(self)

    def accepter(self, delivery: Any, link: CoordinatorLink) -> Any:
        """A completion that accepts `delivery` (a commit) once it is durable. (A
        producer link's messages have `_Accept`, one object reused while the broker
        keeps none.)

        proton frees a delivery with its link, so a completion that arrives after the link
        or connection went away does nothing.
        """

        def accept() -> None:
            if not (self.closed or link.closed):
                engine.delivery_update(delivery, engine.ACCEPTED)
                engine.delivery_settle(delivery)
                self.mark_dirty()

        return accept

    def process(self) -> None:
        if self.closed:
            return
        self._process_events()
        self.flush()

    def flush(self) -> None:
        self.dirty = False
        if self.closed or not self._write_output():
            return
        if self.streams and self._pump_streams():
            if not self._write_output():
                return
            if self.streams:
                self.mark_dirty()  # more to stream: after the loop has served the others
        if self.out_room < OUTPUT_ROOM and not self._writing_paused:
            self._room_again()  # what they handed over is written: links may send more
        self._schedule_tick()

    def _write_output(self) -> bool:
        """Write what proton has to send; False once the connection is closed."""
        output = self.engine.output
        while True:
            data = output()
            if data is None:
                self._close_socket()
                self._cleanup()
                return False
            if not data:
                return True
            if self.socket is not None:
                self.socket.write(data)

    def _pump_streams(self) -> int:
        """Add more of the large messages being streamed, as far as the socket has room;
        returns the bytes added."""
        socket = self.socket
        if self._writing_paused or socket is None:
            return 0
        sent = 0
        for link in list(self.streams):
            sent += link.pump(STREAM_BUDGET // len(self.streams) + 1)
        return sent

    def _clock(self) -> int:
        """The time proton's idle-timeout bookkeeping is given: it stands still while the
        input is held. The peer's frames then wait unread in the network, and a silence
        the broker chose must not close the peer's connection as idle (proton would,
        once idle-timeout passed: a database outage holding a large message did it)."""
        held_since = self._held_since
        now = held_since if held_since is not None else _monotonic_ms()
        return now - self._held_ms

    def _schedule_tick(self) -> None:
        if not self.server.idle_timeout or self._timer is not None:
            return
        now = self._clock()
        deadline = self.engine.tick(now)
        if not deadline:
            return
        delay = max(0, deadline - now)
        if self._held_since is not None and (remote := self.engine.remote_idle_timeout()):
            delay = min(delay, remote // 2)  # proton's clock stands: heartbeats are ours
        self._timer = asyncio.get_running_loop().call_later(delay / 1000, self._on_tick)

    def _on_tick(self) -> None:
        self._timer = None
        if self.closed:
            return
        self.engine.tick(self._clock())
        self.process()  # writes all proton has: what follows starts a frame
        socket = self.socket
        if self._held_since is not None and socket is not None and not socket.is_closing():
            # proton's clock stands while the input is held, and so do its heartbeats
            socket.write(_HEARTBEAT)

    def _process_events(self) -> None:
        try:
            self._dispatch_events()
        except Exception:
            # A bug must cost this connection only, never the broker or other clients.
            log.exception("connection failed", remote=self.info.remote)
            engine.collector_pop(self.engine.collector)  # the event that failed
            engine.close_connection(
                self.engine.connection,
                "amqp:internal-error",
                "the broker failed on this connection",
            )
            self.engine.close_input()

    def _dispatch_events(self) -> None:
        # Two events per message (its transfer in, its disposition back): everything the
        # loop touches per event is a local.
        collector = self.engine.collector
        peek, pop, etype = engine.collector_peek, engine.collector_pop, engine.event_type
        event_delivery, delivery_link = engine.event_delivery, engine.delivery_link
        handler_of = self.links.get
        DELIVERY, LINK_FLOW = engine.DELIVERY, engine.LINK_FLOW
        consumer_link = ConsumerLink
        event = peek(collector)
        while event and self.events_held is None:
            kind = etype(event)
            if kind == DELIVERY:
                delivery = event_delivery(event)
                handler = handler_of(delivery_link(delivery))
                if handler.__class__ is consumer_link:
                    handler.on_disposition(delivery)  # type: ignore[union-attr]
                elif handler is not None:
                    handler.on_delivery(delivery)  # type: ignore[union-attr]
            elif kind == LINK_FLOW:
                handler = handler_of(engine.event_link(event))
                if type(handler) is ConsumerLink:
                    handler.on_flow()
            else:
                self._on_event(kind, event)
            pop(collector)
            event = peek(collector)

    def _on_event(self, kind: int, event: Any) -> None:
        if kind == engine.CONNECTION_REMOTE_OPEN:
            self._on_open()
        elif kind == engine.CONNECTION_REMOTE_CLOSE:
            engine.close_connection(self.engine.connection)
        elif kind == engine.SESSION_REMOTE_OPEN:
            session = engine.event_session(event)
            if not self._admitted:
                return  # the connection was refused at open: it is closing
            limit = self.server.max_sessions
            if limit and len(self.sessions) >= limit:
                engine.refuse_session(
                    session,
                    "amqp:resource-limit-exceeded",
                    f"the connection has its max-sessions-per-connection ({limit}) open",
                )
            else:
                self.sessions.add(session)
                engine.open_session(session)
        elif kind == engine.SESSION_REMOTE_CLOSE:
            session = engine.event_session(event)
            self.sessions.discard(session)
            for link in [lk for lk in self.links if engine.link_session(lk) == session]:
                self._drop_link(link, remote_closed=False)
            engine.close_session(session)
            engine.free_session(session)
        elif kind == engine.LINK_REMOTE_OPEN:
            self._on_link_open(engine.event_link(event))
        elif kind in (engine.LINK_REMOTE_CLOSE, engine.LINK_REMOTE_DETACH):
            link = engine.event_link(event)
            closed = kind == engine.LINK_REMOTE_CLOSE
            self._drop_link(link, remote_closed=closed)
            if closed:
                engine.close_link(link)
            else:
                engine.detach_link(link)
            engine.free_link(link)  # proton keeps it until the detach is written
        elif kind == engine.TRANSPORT_ERROR:
            name, description = self.engine.transport_condition()
            log.info(
                "connection error", remote=self.info.remote, condition=name, reason=description
            )

    def _on_open(self) -> None:
        self._end_handshake()
        connection = self.engine.connection
        self.container_id = engine.remote_container(connection)
        self.info.container_id = self.container_id
        wanted, floor = self.engine.remote_idle_timeout(), self.server.min_peer_idle_timeout
        if 0 < wanted < floor:
            self._refuse_open(
                "amqp:invalid-field",
                f"idle-time-out {wanted} ms is below the broker's min-peer-idle-timeout "
                f"({floor} ms): ask for {floor} ms or more, or 0 for none",
            )
            return
        try:
            self.security.admit(self.principal)
        except ResourceLimitExceeded as exc:
            self._refuse_open(exc.condition, exc.description)
            return
        self._admitted = True
        properties: dict[str, Any] = {
            "product": "scow",
            "version": self.server.version,
            "platform": f"Python {platform.python_version()} ({platform.system()})",
        }
        ha = self.server.broker.ha
        if ha is not None and (servers := failover_server_list(ha.url, ha.peers)):
            properties["failover-server-list"] = servers  # Qpid JMS's convention
        engine.open_connection(connection, self.server.container_id, properties)
        self._opened = True
        self.server.hooks.scow_connection_opened(info=self.info)

    def _refuse_open(self, condition: str, description: str) -> None:
        log.info("connection refused", remote=self.info.remote, reason=description)
        connection = self.engine.connection
        engine.open_connection(connection, self.server.container_id, {})
        engine.close_connection(connection, condition, description)

    def _on_link_open(self, link: Any) -> None:
        if not self._admitted or engine.link_session(link) not in self.sessions:
            return  # the connection or the session was refused: it is closing
        try:
            limit = self.server.max_links
            if limit and len(self.links) >= limit:
                raise ResourceLimitExceeded(
                    f"the connection has its max-links-per-connection ({limit}) attached"
                )
            peer_frame = self.engine.remote_max_frame()
            if peer_frame and (size := engine.answer_size(link)) > peer_frame:
                raise _AnswerTooLarge(
                    f"the attach answering this link echoes its source and target (filter, "
                    f"properties, capabilities): about {size} bytes, more than the "
                    f"max-frame-size of {peer_frame} bytes this connection's open asked "
                    f"for. Shorten them (a selector?) or open with a larger max-frame-size"
                )
            if engine.link_is_sender(link):
                self.links[link] = ConsumerLink(self, link, engine.remote_source(link))
            else:
                target = engine.remote_target(link)
                if target.is_coordinator:
                    self.links[link] = CoordinatorLink(self, link)
                elif target.address == MANAGEMENT_NODE:
                    self.links[link] = ManagementLink(self, link)
                else:
                    self.links[link] = ProducerLink(self, link, target)
        except BrokerError as exc:
            engine.refuse_link(link, exc.condition, exc.description)

    def drop_link(self, link: Any, condition: str, description: str) -> None:
        """Close one link with an error; the connection and its other links carry on."""
        self._drop_link(link, remote_closed=False)
        engine.close_link(link, condition, description)
        self.mark_dirty()

    def _drop_link(self, link: Any, *, remote_closed: bool) -> None:
        handler = self.links.pop(link, None)
        if handler is not None:
            handler.close(remote_closed)

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._end_handshake()
        if self._timer is not None:
            self._timer.cancel()
        for tx in self.transactions.values():
            self.broker.rollback(tx)
        self.transactions.clear()
        for link in list(self.links):
            self._drop_link(link, remote_closed=False)
        self.server.connections.discard(self)
        self.security.socket_closed()
        if self._admitted:
            self.security.release(self.principal)
        if self._opened:
            self.server.hooks.scow_connection_closed(info=self.info)
        # the info's callbacks are bound to this connection: without them it is freed now,
        # not at the next full collection (rare in a broker: app.GC_THRESHOLD)
        self.info.close = self.info.links = None
        self.engine.free()
