"""Links: producers (the client sends, we receive) and consumers (we send to the client)."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.interfaces import holds_drain
from scow.core.model import BrokerError, RouteStatus, RoutingType
from scow.protocols.amqp import engine
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
#: Target addresses an anonymous-relay link remembers its permission for.
_RELAY_CACHE = 1024


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
        engine.set_max_message_size(link, self.max_size)
        engine.open_link(link, address=self.address)
        engine.link_flow(link, self.credit)

    def on_delivery(self, delivery: Any) -> None:
        if self.closed:
            return
        size = engine.delivery_pending(delivery)
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
        if engine.delivery_aborted(delivery):
            engine.delivery_settle(delivery)
            engine.link_advance(link)
            return
        data = engine.receive(link, delivery, size)
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
                accept = self.conn.accepter(delivery, self)
                status = self.broker.send(data, address, AMQP_FORMAT, self.routing_type, accept)
                if status is not RouteStatus.PENDING:
                    engine.delivery_update(delivery, _ACCEPTED)
                    engine.delivery_settle(delivery)
        except BrokerError as exc:
            self._refuse(delivery, presettled, exc.condition, exc.description)
        except ValueError as exc:  # a message our codec cannot read
            self._refuse(delivery, presettled, "amqp:decode-error", str(exc))
        if engine.link_credit(link) <= self.credit // 2:  # _replenish's first test, inlined
            self._replenish()

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
        if credit > self.credit // 2 or self.waiting is not None:
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
        if self.partial:
            self._release_partial()
        self._stop_waiting()


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
        self.presettled = engine.link_snd_settle_mode(link) == engine.SND_SETTLED
        self._tag = 0
        #: The delivery tag proton copies from, rewritten in place for each message.
        self._tag_struct, self._tag_view = engine.new_tag(_TAG.size)
        self.closed = False
        self.max_unsettled = conn.server.max_unsettled
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
        engine.open_link(link, address=address, dynamic=source.dynamic)

    def credit(self) -> int:
        credit: int = engine.link_credit(self.link)
        if self.max_unsettled:
            room = self.max_unsettled - len(self.unsettled)
            return credit if credit < room else max(room, 0)
        return credit

    def deliver(self, ref: MessageRef) -> None:
        message: Message = ref.message
        self._tag += 1
        _TAG.pack_into(self._tag_view, 0, self._tag)
        data = message.kind.format.for_delivery(message, ref.delivery_count)
        delivery = engine.send_tagged(self.link, self._tag_struct, data)
        if self.browse:
            engine.delivery_settle(delivery)
        elif self.presettled:
            engine.delivery_settle(delivery)
            self.conn.broker.acknowledge(ref)
        else:
            self.unsettled[delivery] = ref
        self.conn.mark_dirty()

    def describe(self) -> dict[str, Any]:
        return {
            "name": engine.link_name(self.link),
            "role": "browser" if self.browse else "consumer",
            "queue": self.queue.name,
            "credit": self.credit(),
            "unsettled": len(self.unsettled),
            "selector": self.filter is not None,
        }

    def detach(self, reason: str) -> None:
        self.conn.drop_link(self.link, "amqp:resource-deleted", reason)

    def on_flow(self) -> None:
        self.queue.dispatch()
        if engine.link_get_drain(self.link) and not holds_drain(self.queue, self):
            engine.link_drained(self.link)

    def drain_ready(self) -> None:
        """The queue has what it held this link's drain for (see `holds_drain`)."""
        if engine.link_get_drain(self.link):
            engine.link_drained(self.link)
            self.conn.mark_dirty()

    def on_disposition(self, delivery: Any) -> None:
        state = engine.delivery_remote_state(delivery)
        settled = engine.delivery_settled(delivery)
        if not settled and state not in _OUTCOMES:
            return  # no outcome yet (or only `received`): the client still has it
        ref = self.unsettled.pop(delivery, None)
        engine.delivery_settle(delivery)
        if ref is None:
            return
        if self.max_unsettled and len(self.unsettled) == self.max_unsettled - 1:
            self.queue.dispatch()  # it was held at the limit: send what its credit allows
        broker = self.conn.broker
        if state == TRANSACTIONAL_STATE:
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
        else:  # accepted, or settled without a terminal outcome: the client is done with it
            broker.acknowledge(ref)

    def close(self, remote_closed: bool) -> None:
        """Give back what the client did not settle (each counts as a delivery), detach."""
        if self.closed:
            return
        self.closed = True
        queue = self.queue
        queue.remove_consumer(self)
        refs = sorted(self.unsettled.values(), key=lambda r: r.message.id)
        self.unsettled.clear()
        broker = self.conn.broker
        for ref in refs:
            broker.release(ref, delivered=True)
        remove = remote_closed and self.durable
        if remove and self.conn.authorize is not None:
            try:
                self.conn.authorize("deleteDurableQueue", queue.address)
            except BrokerError:
                remove = False  # refused: the subscription stays (the audit log says so)
        broker.unsubscribe(self, queue, remove_subscription=remove)
