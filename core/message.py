"""Messages as the broker holds them: the producer's bytes, stored once, referenced per queue.

A `Message` carries the encoded bytes exactly as received plus the few fields routing
needs (durable, priority, expiration), which the protocol's `MessageFormat` reads once
on arrival. Each queue the message is routed to holds the message itself while it waits,
and a `MessageRef` (its place in that queue, with a delivery count) once delivered; the
message is freed (and its journal record deleted) when its last queue acknowledges it.
Memory per queued message is what this layout is for: see `MEMORY_OVERHEAD`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

#: What `MessageFormat.inspect` reads: (durable, priority, ttl in ms or 0, the
#: `_AMQ_DUPL_ID` duplicate id or None).
Header = tuple[bool, int, int, object]


class MessageFormat(Protocol):
    """How the broker reads and rewrites messages of one wire encoding.

    Provided by a protocol plugin; the kernel never parses message bytes itself.
    """

    name: str

    def inspect(self, data: bytes) -> Header:
        """(durable, priority, ttl in ms or 0, duplicate id or None), read once per message
        sent: the header's fields, and the `_AMQ_DUPL_ID` application property
        (duplicate detection), as its cache key (`duplicates.key_of`: bytes) when it is
        a string or binary, else as its value (refused when it is checked). A message
        without that property must cost next to nothing more (the AMQP format looks for
        the name's bytes before parsing anything)."""

    def selector_lookup(self, message: Message) -> Callable[[str], object]:
        """A function mapping selector identifiers to the message's field values."""

    def properties(self, data: bytes) -> Mapping[str, object]:
        """The values selectors read by property name (`scow.core.selector.is_property_name`;
        AMQP's application properties), from the message's bytes alone: paged messages
        are summarized and filtered with it without becoming `Message`s. Raises
        ValueError when they cannot be read. The mapping is read-only: a format may
        hand the same one for messages whose properties are the same."""

    def for_delivery(self, message: Message, delivery_count: int) -> bytes:
        """The bytes to send to a consumer: the original with its delivery-count set."""

    def annotate(self, data: bytes, annotations: Mapping[str, object]) -> bytes:
        """A copy with extra message annotations (dead-letter and expiry stamps)."""

    def target_address(self, data: bytes) -> str | None:
        """The address the message names itself (AMQP `to`), for anonymous relays."""

    def describe(self, data: bytes, preview: int) -> dict[str, Any]:
        """Headers, properties and the first `preview` characters of the body, as plain
        JSON-able values (management's browse)."""


#: Estimated bytes of Python objects per message in memory, beyond its encoded bytes;
#: counted in the memory figures that max-size-bytes and global-max-size limit.
#: (A waiting message is mostly held compactly by its queue, as its bytes object and an
#: 8-byte id: about 60 B with the bytes object's header; one held as an object, a 4-slot
#: `Message` and its id, about 150 B. `benchmarks/paging_bench.py --only memory`
#: measures it.)
MEMORY_OVERHEAD = 100
#: Estimated bytes per further queue a message is in: each holds a slot for it in its
#: waiting list (a pointer; RSS grew 9.3 B per further queue for 20,000 x 1 KiB sent to
#: 200 subscriptions against one). Counted with MEMORY_OVERHEAD, as Artemis counts a
#: reference's estimate per queue: without it, 128 MiB of counted messages for 200
#: subscriptions took 410 MiB.
REF_OVERHEAD = 8


class OnDisk:
    """A message body moved out of memory (flow to disk), in place of its bytes.

    `len()` is the body's length, so memory accounting is unchanged; `load()` reads it
    back. The queue restores a body before anything reads it (`Message.restore`).
    """

    __slots__ = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def load(self) -> bytes:
        raise NotImplementedError


class PackedRows(bytes):
    """The data of a transaction's packed send (`Broker`'s `PackedSend`) that the broker
    routed whole: several messages (rows) in one, for queues that take packs
    (`takes_packs`) to store as those rows.

    Only the broker makes one (a client's bytes never do, whatever they hold), and the
    journal keeps the mark (its record's type), so that recovery hands such a queue the
    same. Like a large message's head, it is a `bytes` whose class is the mark.
    """

    __slots__ = ()


class MessageKind:
    """What many messages have in common: their address, format, durability, priority.

    Interned (see `kind_of`), so each message holds one reference instead of four.
    """

    __slots__ = ("address", "durable", "format", "priority")

    def __init__(self, address: str, fmt: MessageFormat, durable: bool, priority: int) -> None:
        self.address = address
        self.format = fmt
        self.durable = durable
        self.priority = priority


_KINDS: dict[tuple[str, MessageFormat, bool, int], MessageKind] = {}
#: Interning is a memory saving, not an identity: past this many kinds the table starts
#: afresh (messages keep theirs), so addresses that come and go do not grow it forever.
_MAX_KINDS = 4096


def kind_of(address: str, fmt: MessageFormat, durable: bool, priority: int) -> MessageKind:
    key = (address, fmt, durable, priority)
    kind = _KINDS.get(key)
    if kind is None:
        if len(_KINDS) >= _MAX_KINDS:
            _KINDS.clear()
        kind = _KINDS[key] = MessageKind(address, fmt, durable, priority)
    return kind


class Message:
    """One message, stored once however many queues hold it.

    A queue holds the message itself while it waits undelivered, and a `MessageRef`
    once it has been delivered (or carries per-queue state, such as a delivery count).
    A message held by one queue needs no counters: its acknowledgement frees it. One
    routed to several queues is a `SharedMessage`, which counts them.
    """

    __slots__ = ("data", "expiration", "id", "kind")

    def __init__(
        self,
        message_id: int,
        data: bytes,
        address: str,
        fmt: MessageFormat,
        # positional too: the broker makes one per message, and keywords cost a dict
        durable: bool = False,
        priority: int = 4,
        expiration: int = 0,
    ) -> None:
        self.id = message_id
        self.data = data
        self.kind = _KINDS.get((address, fmt, durable, priority)) or kind_of(
            address, fmt, durable, priority
        )
        #: Absolute expiry time in ms since the epoch; 0 means never.
        self.expiration = expiration

    @property
    def address(self) -> str:
        return self.kind.address

    @property
    def format(self) -> MessageFormat:
        return self.kind.format

    @property
    def durable(self) -> bool:
        return self.kind.durable

    @property
    def priority(self) -> int:
        return self.kind.priority

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def message(self) -> Message:
        """The message itself: a queue entry is a message or a reference to one."""
        return self

    def as_ref(self, queue: object) -> MessageRef:
        """The reference that `queue` hands to a consumer (a new one: never delivered)."""
        return MessageRef(self, queue)

    def restore(self) -> None:
        """Bring a body that flowed to disk back into memory (callers test
        `message.data.__class__ is not bytes` first: this is off the hot path)."""
        data = self.data
        if isinstance(data, OnDisk):
            self.data = data.load()

    #: Bytes of REF_OVERHEAD counted for it (a shared message's further queues).
    ref_bytes = 0

    def shared(self, refs: int, stored_refs: int) -> Message:
        """This message as held by `refs` queues, `stored_refs` of them in the journal."""
        if refs == 1:
            return self
        return SharedMessage(self, refs, stored_refs)

    def drop_ref(self) -> bool:
        """One queue is done with the message; True when it was the last."""
        return True

    def drop_stored_ref(self) -> bool:
        """One durable queue is done with it; True when its journal record can go."""
        return True

    def lookup(self) -> Callable[[str], object]:
        """The selector lookup function (the message's fields, parsed)."""
        return self.kind.format.selector_lookup(self)

    def __repr__(self) -> str:
        return f"<Message {self.id} to {self.address!r}, {len(self.data)} bytes>"


class SharedMessage(Message):
    """A message routed to several queues: freed when the last of them is done."""

    __slots__ = ("ref_bytes", "refcount", "stored_refs")

    def __init__(self, message: Message, refs: int, stored_refs: int) -> None:
        self.id = message.id
        self.data = message.data
        self.kind = message.kind
        self.expiration = message.expiration
        self.ref_bytes = 0  # set where it is counted (`Broker._store`)
        #: Live references (queues holding it); the message is freed at zero.
        self.refcount = refs
        #: References held by durable queues while the message is in the journal; each
        #: acknowledgement of one is journaled, the last deletes the record.
        self.stored_refs = stored_refs

    def shared(self, refs: int, stored_refs: int) -> Message:
        self.refcount = refs
        self.stored_refs = stored_refs
        return self

    def drop_ref(self) -> bool:
        self.refcount -= 1
        return self.refcount == 0

    def drop_stored_ref(self) -> bool:
        self.stored_refs -= 1
        return self.stored_refs == 0


class MessageRef:
    """A message's place in one queue once delivered, with that queue's delivery count."""

    __slots__ = ("consumer", "delivery_count", "message", "queue")

    def __init__(self, message: Message, queue: object, delivery_count: int = 0) -> None:
        self.message = message
        self.queue = queue
        self.delivery_count = delivery_count
        #: The consumer holding it unsettled, or None while it waits in the queue.
        self.consumer: object | None = None

    def as_ref(self, queue: object) -> MessageRef:
        return self

    def __repr__(self) -> str:
        return f"<MessageRef {self.message.id} in {getattr(self.queue, 'name', '?')}>"


#: What a queue holds: a message waiting undelivered, or a reference with state.
Entry = Message | MessageRef


def expired_by(entry: Entry, now: int) -> bool:
    """Whether `entry`'s message expired by `now` (ms since the epoch)."""
    return 0 < entry.message.expiration <= now


class PagedRef(MessageRef):
    """A reference whose message is stored in its address's pages, not in the journal.

    Its acknowledgement and delivery count go through `cursor`; `page` and `offset` are
    the record's place in the pages.
    """

    __slots__ = ("cursor", "offset", "page")

    def __init__(
        self,
        message: Message,
        queue: object,
        cursor: object,
        page: int,
        offset: int,
        delivery_count: int = 0,
    ) -> None:
        # MessageRef.__init__'s work, without the call: a paged drain makes one per message
        self.message = message
        self.queue = queue
        self.delivery_count = delivery_count
        self.consumer = None
        self.cursor: Any = cursor
        self.page = page
        self.offset = offset
