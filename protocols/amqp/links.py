"""Links: producers (the client sends, we receive) and consumers (we send to the client)."""

from __future__ import annotations

import struct
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.interfaces import holds_drain
from scow.core.large_messages import Arrival, Chunks, LargeBody, LargeHead, LargeMessageStore
from scow.core.model import BrokerError, RouteStatus, RoutingType
from scow.protocols.amqp import codec, engine
from scow.protocols.amqp.codec import Described
from scow.protocols.amqp.format import AMQP_FORMAT
from scow.protocols.amqp.transactions import (
    ACCEPTED_DESCRIPTOR,
    TRANSACTIONAL_STATE,
    accept_in,
    descriptor_code,
    transaction_of,
)

if TYPE_CHECKING:
    from scow.core.message import Message, MessageRef
    from scow.protocols.amqp.connection import AmqpConnection

log = structlog.get_logger("scow.amqp")

SELECTOR_DESCRIPTORS = ("apache.org:selector-filter:string", 0x0000468C00000004)
_OUTCOMES = frozenset(
    (engine.ACCEPTED, engine.RELEASED, engine.MODIFIED, engine.REJECTED, TRANSACTIONAL_STATE)
)
_TAG = struct.Struct(">Q")
_ACCEPTED = engine.ACCEPTED
_PENDING = RouteStatus.PENDING  # a global: reading it off its Enum class costs ~65 ns
#: Target addresses an anonymous-relay link remembers its permission for.
_RELAY_CACHE = 1024
#: The sections before a large message's body are held in memory (the broker parses
#: them); past this many bytes without its body beginning, the message is refused.
MAX_LARGE_HEAD = 1 << 20
#: A streaming delivery adds to its session only while the session holds less than this
#: that the consumer's window has not let out yet.
STREAM_WINDOW = 4 << 20


def routing_hint(capabilities: frozenset[str]) -> RoutingType | None:
    """Terminus capabilities `queue`/`topic` ask for anycast/multicast."""
    if "queue" in capabilities:
        return RoutingType.ANYCAST
    if "topic" in capabilities:
        return RoutingType.MULTICAST
    return None


def selector_of(filters: dict[str, Any]) -> str | None:
    for value in filters.values():
        if isinstance(value, Described) and value.descriptor in SELECTOR_DESCRIPTORS:
            return str(value.value)
    return None


class _NoAddress(BrokerError):
    condition = "amqp:not-found"


class _HeadTooLarge(BrokerError):
    condition = "amqp:resource-limit-exceeded"


class _LargeArrival:
    """A large message arriving on a link: every byte to its store, its head kept too."""

    __slots__ = ("file", "head", "head_size")

    def __init__(self, store: LargeMessageStore, file_id: int) -> None:
        self.file: Arrival = store.begin(file_id)
        self.head = bytearray()
        #: Where the body starts, once the head has arrived whole.
        self.head_size: int | None = None

    def take(self, proton: engine.Engine, link: Any, size: int) -> None:
        """Write the `size` bytes the delivery has pending (raises OSError, DecodeError
        or _HeadTooLarge, leaving the caller to abandon the file)."""
        for chunk in proton.receive_chunks(link, size):
            self.file.write(chunk)
            if self.head_size is None:
                self.head += chunk
                self.head_size = codec.head_length(self.head)
                if self.head_size is not None:
                    del self.head[self.head_size :]
                elif len(self.head) > MAX_LARGE_HEAD:
                    raise _HeadTooLarge(
                        f"a large message's sections before its body take more than "
                        f"{MAX_LARGE_HEAD} bytes"
                    )

    def complete(self, sync: bool) -> LargeHead:
        """The message has arrived whole: its head, with its body in its file."""
        if self.head_size is None:  # no body: the message is its head
            codec.scan_sections(self.head)  # raises DecodeError when it is malformed
            self.head_size = len(self.head)
        durable = codec.MessageInfo(bytes(self.head)).durable
        body = self.file.complete(self.head_size, sync=sync and durable)
        return LargeHead(bytes(self.head), body)


class _Stored:
    """A large message that arrived whole, routed (or refused) once its store answers."""

    __slots__ = ("answered", "data", "delivery", "error", "file")

    def __init__(self, delivery: Any, data: LargeHead, file: Arrival) -> None:
        self.delivery = delivery
        self.data = data
        self.file = file
        self.answered = False
        self.error: str | None = None


#: Node properties that describe the node itself (qpidd's NodeProperties); every other
#: key is a queue argument (e.g. qpid.priorities, last-value-key, x-queue-type).
_NODE_KEYS = frozenset(
    {"supported-dist-modes", "durable", "exclusive", "auto-delete", "lifetime-policy"}
    | {"alternate-exchange", "exchange-type"}
)


def create_on_demand(broker: Any, terminus: engine.TerminusInfo, authorize: Any = None) -> None:
    """Create the queue a terminus names, as qpidd does for Qpid Messaging clients.

    With the capability `create-on-demand` and no such queue yet, the terminus's node
    properties (the `x-declare` of an address string, flattened by the client) say how:
    `supported-dist-modes` "move" makes a queue (the default; "copy" a multicast
    address), `durable` and `exclusive` set those, and any other key, such as
    `qpid.priorities` or `last-value-key`, is a queue argument. Lifetime policies,
    alternate exchanges and exchange types have no Scow equivalent and are ignored.
    `authorize(permission, address)`, when given, refuses what the client may not create.
    """
    name = terminus.address
    if not name or "create-on-demand" not in terminus.capabilities or name in broker.queues:
        return
    properties = {str(k): v for k, v in terminus.properties.items()}
    if properties.get("supported-dist-modes") == "copy":
        broker.address_for(name, RoutingType.MULTICAST, authorize)
        return
    durable = bool(properties.get("durable", False))
    if authorize is not None:
        if name not in broker.addresses:
            authorize("createAddress", name)
        authorize("createDurableQueue" if durable else "createNonDurableQueue", name)
    broker.declare_queue(
        name,
        routing_type="ANYCAST",
        durable=durable,
        exclusive=bool(properties["exclusive"]) if "exclusive" in properties else None,
        arguments={k: v for k, v in properties.items() if k not in _NODE_KEYS},
    )


class _Accept:
    """The completion a producer link hands `Broker.send`: accepts `delivery` once its
    message is durable.

    `send` calls a completion only when it returns PENDING, and never after another
    status: a message held in memory only (nearly every one) is accepted at once, so the
    link gives the same object to the next send, and makes a new one only when the
    broker kept this one. proton frees a delivery with its link: a completion that runs
    after the link or its connection went away does nothing.
    """

    __slots__ = ("delivery", "link")

    def __init__(self, link: ProducerLink) -> None:
        #: None once the link closed (see `ProducerLink.close`).
        self.link: ProducerLink | None = link
        self.delivery: Any = None

    def __call__(self) -> None:
        link = self.link
        if link is not None and not (link.closed or link.conn.closed):
            engine.delivery_update(self.delivery, _ACCEPTED)
            engine.delivery_settle(self.delivery)
            link.conn.mark_dirty()


class ProducerLink:
    """A link the client sends on; routes each complete message into the broker."""

    def __init__(self, conn: AmqpConnection, link: Any, target: engine.TerminusInfo) -> None:
        self.conn = conn
        self.broker = conn.broker
        self.link = link
        self.address = target.address  # None: anonymous relay, routed by each message's `to`
        self.routing_type = routing_hint(target.capabilities)
        self.credit = conn.server.producer_credit
        #: The waiting list we are on while our credit is held back (a full address's, or
        #: the disk monitor's); `resume` takes us off it.
        self.waiting: list[Any] | None = None
        self.closed = False
        self.max_size = conn.server.max_message_size
        #: Bytes of the partial message this link holds (counted in conn.partial_bytes).
        self.partial = 0
        #: Messages from this size on are large; the one arriving, if any.
        self.large_size = conn.server.min_large_message_size
        self.arrival: _LargeArrival | None = None
        #: Large messages that arrived whole, in order, until their store has every byte
        #: (`when_stored`): the link takes the next large message's bytes meanwhile,
        #: but any other message waits in proton behind them (`_wait_for_store`), and
        #: `waited` says whether one does.
        self.stored: deque[_Stored] = deque()
        self.waited = False
        authorize = conn.authorize
        #: Anonymous relay under enforced permissions: target address -> the refusal
        #: (None: allowed), so each address is checked once per link.
        self.checked: dict[str, BrokerError | None] | None = None
        if self.address is not None:
            if authorize is not None:
                authorize("send", self.address)
            create_on_demand(conn.broker, target, authorize)
            conn.broker.address_for(self.address, self.routing_type, authorize)
        elif authorize is not None:
            self.checked = {}
        #: The completion the next message's send is given (see `_Accept`).
        self.accept = _Accept(self)
        self.receive = conn.engine.receive
        #: Messages to route before the link's credit is read again (`_replenish`): at
        #: most down to half of `credit`, so one read per half-window, not per message.
        self.until_replenish = self.credit - self.credit // 2
        engine.set_max_message_size(link, self.max_size)
        engine.open_link(link, address=self.address)
        engine.link_flow(link, self.credit)

    def on_delivery(self, delivery: Any) -> None:
        if self.closed:
            return
        if self.waited:  # one before it waits in proton: so does this one, behind it
            self._wait_for_store(delivery)
            return
        size = engine.delivery_pending(delivery)
        if not size and not engine.delivery_readable(delivery):
            # A message already read whole, the link advanced past it: proton merges
            # only consecutive events of a delivery, so when two links' frames
            # interleave, the event of a message whose last frame came in the same read
            # as another link's comes again. Read as a new message, it would be empty
            # (rejected) and advance the link past the next one.
            return
        if size >= self.large_size or self.arrival is not None:
            self._receive_large(delivery, size)
            return
        if self.stored:  # routed after the large messages before it
            self._wait_for_store(delivery)
            return
        if self.max_size and size > self.max_size:
            self._too_large(size)
            return
        if engine.delivery_partial(delivery):
            if self.max_size and not engine.delivery_aborted(delivery):
                self._hold_partial(size)
            return
        if self.partial:
            self._release_partial()
        link = self.link
        # proton reports 1 byte pending for an aborted delivery: only then can it be one
        if size == 1 and engine.delivery_aborted(delivery):
            self._aborted(delivery)
            return
        self._route(delivery, self.receive(link, delivery, size))
        self.until_replenish -= 1
        if self.until_replenish <= 0:
            self._replenish()

    def _route(self, delivery: Any, data: bytes) -> None:
        """Send a message that has arrived whole into the broker, and answer its delivery."""
        presettled = engine.delivery_settled(delivery)
        address = self.address
        try:
            if address is None:
                address = AMQP_FORMAT.target_address(data)
                if not address:
                    raise _NoAddress("anonymous relay: the message has no 'to' address")
                if self.checked is not None:
                    self._authorize_relay(address)
            if engine.delivery_remote_state(delivery) == TRANSACTIONAL_STATE:
                tx = transaction_of(self.conn, delivery)[0]  # type: ignore[index]
                self.broker.send(data, address, AMQP_FORMAT, self.routing_type, tx=tx)
                accept_in(delivery, tx)
            elif presettled:
                self.broker.send(data, address, AMQP_FORMAT, self.routing_type)
                engine.delivery_settle(delivery)
            else:
                accept = self.accept
                accept.delivery = delivery
                status = self.broker.send(data, address, AMQP_FORMAT, self.routing_type, accept)
                if status is not _PENDING:
                    engine.delivery_update(delivery, _ACCEPTED)
                    engine.delivery_settle(delivery)
                else:  # the broker keeps it until the message is durable: a new one
                    self.accept = _Accept(self)
        except BrokerError as exc:
            self._refuse(delivery, presettled, exc.condition, exc.description)
        except ValueError as exc:  # a message our codec cannot read
            self._refuse(delivery, presettled, "amqp:decode-error", str(exc))

    def _aborted(self, delivery: Any) -> None:
        """The producer aborted `delivery`: it goes, and the credit it spent comes back
        (the countdown to the next grant counts routed messages only).

        Advanced before it is settled: proton's settle of the link's current delivery
        advances the link itself, so an advance after it skipped the next delivery (a
        message sent after an aborted one then never had an answer)."""
        engine.link_advance(self.link)
        engine.delivery_settle(delivery)
        self._replenish()

    def _receive_large(self, delivery: Any, size: int) -> None:
        """Write what arrived of a large message to its file; route it once complete."""
        arrival = self.arrival
        link = self.link
        if engine.delivery_aborted(delivery):
            self._abandon_large()
            self._aborted(delivery)
            return
        if arrival is None:
            if self.partial:
                self._release_partial()  # counted while it was small: it is on disk now
            store = self.conn.broker.large_messages
            try:
                arrival = self.arrival = _LargeArrival(store, self.conn.broker.next_id())
            except OSError as exc:
                self._large_failed(f"large message not stored: {exc}")
                return
        total = arrival.file.written + size
        if self.max_size and total > self.max_size:
            self._abandon_large()
            self._too_large(total)
            return
        try:
            arrival.take(self.conn.engine, link, size)
        except BrokerError as exc:
            self._abandon_large()
            self.conn.drop_link(link, exc.condition, exc.description)
            return
        except ValueError as exc:  # its head is malformed
            self._abandon_large()
            self.conn.drop_link(link, "amqp:decode-error", str(exc))
            return
        except OSError as exc:
            file = arrival.file
            self._large_failed(f"large message {file.store.describe(file.file_id)}: {exc}")
            return
        if not arrival.file.room(self._store_caught_up):
            self.conn.hold_input(self)  # the store is behind: the socket waits for it
        if engine.delivery_partial(delivery):
            return
        engine.link_advance(link)
        self.arrival = None
        try:
            data = arrival.complete(self.conn.broker.large_messages.sync)
        except ValueError as exc:
            arrival.file.abandon()
            self._refuse(delivery, engine.delivery_settled(delivery), "amqp:decode-error", str(exc))
            self._replenish()
            return
        # routed once its store has every byte (at once for files), after the large
        # messages before it; in a transaction, all that came after it on the connection
        # waits too, so that its discharge cannot overtake it
        entry = _Stored(delivery, data, arrival.file)
        self.stored.append(entry)
        arrival.file.when_stored(lambda error: self._large_stored(entry, error))
        waiting = bool(self.stored) and self.stored[-1] is entry
        if waiting and engine.delivery_remote_state(delivery) == TRANSACTIONAL_STATE:
            self.conn.hold_events(delivery)

    def _large_stored(self, entry: _Stored, error: str | None) -> None:
        """A large message's store answered: route, in order, those that have their
        answer, then what waited behind them."""
        entry.answered = True
        entry.error = error
        stored = self.stored
        held = None
        while stored and stored[0].answered:
            first = stored.popleft()
            self._route_stored(first)
            if self.conn.events_held is first.delivery:
                held = first.delivery
        if not stored and self.waited:
            self._take_waiting()
        if held is not None:
            _release_events(self.conn, held)
        self.conn.mark_dirty()

    def _route_stored(self, entry: _Stored) -> None:
        """Route a large message its store has whole, or refuse it: its body goes."""
        body: LargeBody = entry.data.body
        body.acquire()  # held while it is routed: the body goes if nothing keeps it
        try:
            if self.closed:  # its delivery went with the link
                return
            delivery = entry.delivery
            if entry.error is None:
                self._route(delivery, entry.data)
            else:
                where = entry.file.store.describe(entry.file.file_id)
                reason = f"large message {where} not stored: {entry.error}"
                log.warning("large message refused", reason=reason)
                presettled = engine.delivery_settled(delivery)
                self._refuse(delivery, presettled, "amqp:resource-limit-exceeded", reason)
            self._replenish()
        finally:
            body.release()

    def _wait_for_store(self, delivery: Any) -> None:
        """A message came after large ones that wait for their store: it stays in proton
        until they are routed (see `_take_waiting`), and so does what follows it, as long
        as its session holds less than a large message; past that the socket waits, not
        the memory. A transactional one holds the connection's events (its discharge
        must not overtake it)."""
        self.waited = True
        conn = self.conn
        if conn.events_held is None and engine.delivery_remote_state(delivery) == (
            TRANSACTIONAL_STATE
        ):
            conn.hold_events(self.link)
        elif engine.session_incoming_bytes(engine.link_session(self.link)) >= self.large_size:
            conn.hold_input(self.link)

    def _take_waiting(self) -> None:
        """Handle the messages that waited on this link behind large ones (their events
        went by meanwhile), until one waits for more frames or for its store; not while
        the connection's events are held (their holder takes them once it lets go)."""
        held = self.conn.events_held
        if held is not None and held is not self.link:
            return
        self.waited = False
        self.conn.release_input(self.link)
        link = self.link
        try:
            while not self.closed:
                delivery = engine.link_current(link)
                if not delivery:
                    break
                self.on_delivery(delivery)
                if engine.link_current(link) == delivery:
                    break  # not advanced past: still arriving, or waiting again
        except Exception:
            # outside the connection's event loop, which guards the rest: a bug costs
            # this link only, never the broker or the connection's other links
            log.exception("producer link failed", link=engine.link_name(link))
            self.conn.drop_link(link, "amqp:internal-error", "the broker failed on this link")
        if self.conn.events_held is self.link:
            _release_events(self.conn, self.link)

    def _abandon_large(self) -> None:
        if self.arrival is not None:
            self.arrival.file.abandon()
            self.arrival = None
        self.conn.release_input(self)

    def _store_caught_up(self) -> None:
        self.conn.release_input(self)

    def _large_failed(self, reason: str) -> None:
        """The file system refused a large message: its link closes, the broker goes on."""
        log.warning("large message refused", reason=reason)
        self._abandon_large()
        self.conn.drop_link(self.link, "amqp:resource-limit-exceeded", reason)

    def _authorize_relay(self, address: str) -> None:
        """Raise the refusal when this link may not send to `address` (checked once)."""
        checked = self.checked
        assert checked is not None
        if address not in checked:
            if len(checked) >= _RELAY_CACHE:
                checked.clear()  # addresses can be unbounded (per-client replies)
            try:
                self.conn.authorize("send", address)
                if address not in self.conn.broker.addresses:
                    self.conn.authorize("createAddress", address)
                    return  # not cached: once it exists, send alone decides
                checked[address] = None
            except BrokerError as exc:
                checked[address] = exc
        refusal = checked[address]
        if refusal is not None:
            raise refusal

    def _hold_partial(self, size: int) -> None:
        """Count a message still arriving; past max-message-size for the whole
        connection, this link is closed (others' partial messages carry on)."""
        conn = self.conn
        conn.partial_bytes += size - self.partial
        self.partial = size
        if conn.partial_bytes > self.max_size:
            held = conn.partial_bytes
            self._release_partial()
            conn.drop_link(
                self.link,
                "amqp:resource-limit-exceeded",
                f"partial messages on this connection hold {held} bytes, more than "
                f"max-message-size {self.max_size}",
            )

    def _release_partial(self) -> None:
        self.conn.partial_bytes -= self.partial
        self.partial = 0

    def describe(self) -> dict[str, Any]:
        return {
            "name": engine.link_name(self.link),
            "role": "producer",
            "address": self.address,
            "credit": engine.link_credit(self.link),
            "blocked": self.waiting is not None,
        }

    def _too_large(self, size: int) -> None:
        """Close the link: the message (perhaps still arriving) is over max-message-size."""
        self.conn.drop_link(
            self.link,
            "amqp:link:message-size-exceeded",
            f"message of {size} bytes (or more) exceeds max-message-size {self.max_size}",
        )

    def _refuse(self, delivery: Any, presettled: bool, condition: str, description: str) -> None:
        if presettled:
            engine.delivery_settle(delivery)
            log.warning("pre-settled message refused", condition=condition, reason=description)
        else:
            engine.reject(delivery, condition, description)

    def _replenish(self) -> None:
        credit = engine.link_credit(self.link)
        half = self.credit // 2
        # each message the link routes counts down; credit is read again at 0
        self.until_replenish = credit - half
        if credit > half or self.waiting is not None:
            return
        broker = self.conn.broker
        if broker.limits.disk_full:  # every producer waits, anonymous ones included
            self._wait(broker.limits.on_disk_space)
            return
        address = broker.get_address(self.address) if self.address else None
        policy = address.full_policy if address is not None else None
        if policy is not None and policy.blocks_producers():
            self._wait(address.on_space)  # type: ignore[union-attr]
            return
        engine.link_flow(self.link, self.credit - credit)
        self.until_replenish = self.credit - half

    def _wait(self, waiting: list[Any]) -> None:
        self.waiting = waiting
        waiting.append(self.resume)

    def _stop_waiting(self) -> None:
        if self.waiting is not None:
            if self.resume in self.waiting:
                self.waiting.remove(self.resume)
            self.waiting = None

    def resume(self) -> None:
        """What held our credit back has room again: hand out credit."""
        self._stop_waiting()
        if not self.closed and not self.conn.closed:
            self._replenish()
            self.conn.mark_dirty()

    def close(self, remote_closed: bool) -> None:
        self.closed = True
        # the spare completion points back at the link: without it the link (and its
        # connection) is freed at once, not at the next full collection
        self.accept.link = None
        if self.partial:
            self._release_partial()
        self._abandon_large()
        self.conn.release_input(self.link)  # held while a large message was stored
        self._stop_waiting()


class _Stream:
    """A large message's delivery in progress: what is left of its body to send."""

    __slots__ = ("chunks", "delivery", "ref")

    def __init__(self, ref: MessageRef, delivery: Any, chunks: Chunks) -> None:
        self.ref = ref
        self.delivery = delivery
        self.chunks = chunks


def _release_events(conn: AmqpConnection, holder: object) -> None:
    """`holder` lets the connection's events go: those that waited are handled, then the
    messages producer links left waiting meanwhile (see `ProducerLink._take_waiting`)."""
    conn.release_events(holder)
    for link in list(conn.links.values()):
        if type(link) is ProducerLink and link.waited and not link.stored:
            link._take_waiting()


class ConsumerLink:
    """A link the broker sends on: a queue consumer (or browser) with the link's credit."""

    def __init__(self, conn: AmqpConnection, link: Any, source: engine.TerminusInfo) -> None:
        self.conn = conn
        self.link = link
        self.filter: Any = None
        #: The source's filter map as the client sent it (name -> described value), for
        #: queue types that read more than the selector (e.g. a stream's start position).
        self.filters: dict[str, Any] = source.filters
        self.browse = source.distribution_mode == engine.DIST_MODE_COPY
        self.unsettled: dict[Any, MessageRef] = {}
        # A receiver that asks for settled deliveries (at-most-once) gets them: without
        # this our end stayed `mixed`, every delivery went unsettled and the client's
        # settle came back as one disposition per message for the broker to process.
        if engine.link_remote_snd_settle_mode(link) == engine.SND_SETTLED:
            engine.set_sender_settle_mode_settled(link)
        self.presettled = engine.link_snd_settle_mode(link) == engine.SND_SETTLED
        self._tag = 0
        #: The delivery tag proton copies from, rewritten in place for each message.
        self._tag_struct, self._tag_view = engine.new_tag(_TAG.size)
        self.closed = False
        self.max_unsettled = conn.server.max_unsettled
        #: The large message being streamed from its file, if any; what the queue hands
        #: over meanwhile waits in `backlog` (a link sends one delivery at a time).
        self.stream: _Stream | None = None
        self.backlog: deque[MessageRef] = deque()
        broker = conn.broker
        caps = source.capabilities
        self.durable = False
        authorize = conn.authorize
        if source.dynamic:
            self.queue = broker.subscribe_temporary(self, authorize)
            address = self.queue.name
        else:
            address = source.address
            if not address:
                raise _NoAddress("a receiving link needs a source address (or dynamic)")
            if authorize is not None:
                authorize("browse" if self.browse else "consume", address.split("::", 1)[0])
            create_on_demand(broker, source, authorize)
            routing = routing_hint(caps)
            shared = "shared" in caps
            self.durable = source.durable and source.expiry_never
            name = engine.link_name(link)
            try:
                self.queue = broker.subscribe(
                    self,
                    address,
                    routing_type=routing,
                    selector=selector_of(source.filters),
                    durable=self.durable,
                    shared=shared,
                    global_="global" in caps,
                    subscription=name.split("|", 1)[0] if shared else name,
                    client_id=conn.container_id,
                    authorize=authorize,
                )
            except BaseException:
                # what the queue handed over before the attach failed goes back to it
                self._give_back_backlog()
                for ref in self.unsettled.values():
                    broker.release(ref, delivered=False)
                raise
        engine.open_link(link, address=address, dynamic=source.dynamic)

    def credit(self) -> int:
        if self.conn.out_room <= 0:  # the output waits to be written (OUTPUT_ROOM)
            self.conn.hold_delivery(self)
            return 0
        if self.stream is not None:
            return 0
        credit: int = engine.link_credit(self.link)
        if self.max_unsettled:
            room = self.max_unsettled - len(self.unsettled)
            return credit if credit < room else max(room, 0)
        return credit

    def deliver(self, ref: MessageRef) -> bool:
        """Send `ref`; True once the connection's output has no room for more (see
        `Consumer.deliver`)."""
        if self.stream is not None:
            self.backlog.append(ref)
            return False
        message: Message = ref.message
        self._tag += 1
        _TAG.pack_into(self._tag_view, 0, self._tag)
        fmt = message.kind.format
        count = ref.delivery_count
        # an AMQP message delivered for the first time goes as it came: no call to ask
        if fmt is AMQP_FORMAT and not count:
            data = message.data
        else:
            data = fmt.for_delivery(message, count)
        if message.data.__class__ is LargeHead:
            self._begin_stream(ref, data, message.data.body)  # type: ignore[attr-defined]
            return False
        link = self.link
        delivery = engine.new_delivery(link, self._tag_struct)
        size = len(data)
        engine.link_send(link, data, size)
        engine.link_advance(link)
        if self.browse:
            engine.delivery_settle(delivery)
        elif self.presettled:
            engine.delivery_settle(delivery)
            self.conn.broker.acknowledge(ref)
        else:
            self.unsettled[delivery] = ref
        conn = self.conn
        if not conn.dirty:  # mark_dirty's test, inlined: per message
            conn.mark_dirty()
        room = conn.out_room - size
        conn.out_room = room
        if room > 0:
            return False
        conn.hold_delivery(self)
        return True

    def _begin_stream(self, ref: MessageRef, head: bytes, body: LargeBody) -> None:
        """Start the delivery of a large message: its head now, its body from its file
        as the consumer's window and the socket let it out (`pump`)."""
        delivery = engine.begin_send(self.link, _TAG.pack(self._tag), head)
        self.stream = _Stream(ref, delivery, body.chunks(wake=self.conn.mark_dirty))
        if not (self.browse or self.presettled):
            self.unsettled[delivery] = ref  # a close before its end gives it back
        self.conn.streams.append(self)
        self.conn.mark_dirty()

    def pump(self, budget: int) -> int:
        """Send up to about `budget` more bytes of the streaming message; returns how
        many went to the session (0: the consumer's window is full)."""
        stream = self.stream
        assert stream is not None
        link = self.link
        session = engine.link_session(link)
        sent = 0
        while sent < budget and engine.session_outgoing_bytes(session) < STREAM_WINDOW:
            try:
                chunk = next(stream.chunks, None)
            except OSError as exc:
                self._abort_stream(str(exc))
                return sent
            if chunk is None:
                self._end_stream()
                break
            if not chunk:
                break  # the store is still reading: it wakes the connection once it has
            engine.send_more(link, chunk)
            sent += len(chunk)
        return sent

    def _end_stream(self) -> None:
        stream = self.stream
        assert stream is not None
        engine.link_advance(self.link)
        self._stop_stream()
        if self.browse:
            engine.delivery_settle(stream.delivery)
        elif self.presettled:
            engine.delivery_settle(stream.delivery)
            self.conn.broker.acknowledge(stream.ref)
        self._after_stream()

    def _after_stream(self) -> None:
        """Send what waited for the stream that ended; then the queue's next messages."""
        while self.backlog and self.stream is None:
            self.deliver(self.backlog.popleft())
        if self.stream is None:
            self.queue.dispatch()

    def _abort_stream(self, reason: str) -> None:
        """The body file could not be read: the delivery is aborted, the message put back
        (a failed attempt, so one that never reads goes to the dead-letter address)."""
        stream = self.stream
        assert stream is not None
        log.error("large message not delivered", queue=self.queue.name, reason=reason)
        engine.delivery_abort(stream.delivery)
        self._stop_stream()
        if not self.browse:
            self.unsettled.pop(stream.delivery, None)
            self.conn.broker.release(stream.ref, delivered=True)
        self._give_back_backlog()

    def _stop_stream(self) -> None:
        stream = self.stream
        if stream is not None:
            stream.chunks.close()  # closes its file, or stops its reads
            self.stream = None
            if self in self.conn.streams:
                self.conn.streams.remove(self)

    def _give_back_backlog(self) -> None:
        backlog, self.backlog = self.backlog, deque()
        if not self.browse:
            for ref in backlog:
                self.conn.broker.release(ref, delivered=False)

    def describe(self) -> dict[str, Any]:
        return {
            "name": engine.link_name(self.link),
            "role": "browser" if self.browse else "consumer",
            "queue": self.queue.name,
            "credit": self.credit(),
            "unsettled": len(self.unsettled),
            "selector": self.filter is not None,
            # the client has not read what it was sent: its credit waits until it does
            "output-full": self.conn.out_room <= 0,
        }

    def detach(self, reason: str) -> None:
        self.conn.drop_link(self.link, "amqp:resource-deleted", reason)

    def on_flow(self) -> None:
        self.queue.dispatch()
        if engine.link_get_drain(self.link) and not holds_drain(self.queue, self):
            self._answer_drain()

    def drain_ready(self) -> None:
        """The queue has what it held this link's drain for (see `holds_drain`)."""
        if engine.link_get_drain(self.link):
            self._answer_drain()
            self.conn.mark_dirty()

    def _answer_drain(self) -> None:
        """The queue has nothing more for the credit: drain it, unless the output had
        no room (the queue may have more; the connection calls `on_flow` again once
        there is room)."""
        if self.conn.out_room > 0:
            engine.link_drained(self.link)
        else:
            self.conn.hold_delivery(self)

    def on_disposition(self, delivery: Any) -> None:
        state = engine.delivery_remote_state(delivery)
        if state not in _OUTCOMES and not engine.delivery_settled(delivery):
            return  # no outcome yet (or only `received`): the client still has it
        ref = self.unsettled.pop(delivery, None)
        stream = self.stream
        if stream is not None and stream.delivery == delivery:
            # settled before the whole message went (a consumer may refuse it early):
            # the rest is not sent (an abort settles it on our side too)
            self._stop_stream()
            engine.delivery_abort(delivery)
            self._after_stream()
        else:
            engine.delivery_settle(delivery)
        if ref is None:
            return
        if self.max_unsettled and len(self.unsettled) == self.max_unsettled - 1:
            self.queue.dispatch()  # it was held at the limit: send what its credit allows
        broker = self.conn.broker
        if state == _ACCEPTED:  # the usual outcome, tested first
            broker.acknowledge(ref)
        elif state == TRANSACTIONAL_STATE:
            try:
                tx, fields = transaction_of(self.conn, delivery)  # type: ignore[misc]
            except BrokerError:
                broker.release(ref, delivered=False)  # no such transaction: nothing happened
                return
            outcome = fields[1] if len(fields) > 1 else None
            code = descriptor_code(getattr(outcome, "descriptor", None))
            if code == ACCEPTED_DESCRIPTOR:
                broker.acknowledge(ref, tx)
            else:
                broker.release(ref, delivered=False)
        elif state == engine.RELEASED:
            broker.release(ref, delivered=False)
        elif state == engine.MODIFIED:
            failed, _undeliverable = engine.disposition_failed(delivery)
            broker.release(ref, delivered=failed)
        elif state == engine.REJECTED:
            broker.reject(ref)
        else:  # settled without a terminal outcome: the client is done with it
            broker.acknowledge(ref)

    def close(self, remote_closed: bool) -> None:
        """Give back what the client did not settle (each counts as a delivery), detach."""
        if self.closed:
            return
        self.closed = True
        queue = self.queue
        queue.remove_consumer(self)
        stream = self.stream
        self._stop_stream()
        if stream is not None and self.presettled and not self.browse:
            self.conn.broker.release(stream.ref, delivered=False)  # it never arrived whole
        self._give_back_backlog()
        broker = self.conn.broker
        broker.release_unsettled(list(self.unsettled.values()))
        self.unsettled.clear()
        remove = remote_closed and self.durable
        if remove and self.conn.authorize is not None:
            try:
                self.conn.authorize("deleteDurableQueue", queue.address)
            except BrokerError:
                remove = False  # refused: the subscription stays (the audit log says so)
        broker.unsubscribe(self, queue, remove_subscription=remove)
