"""Messages as the broker holds them: the producer's bytes, stored once, referenced per queue.

A `Message` carries the encoded bytes exactly as received plus the few fields routing
needs (durable, priority, expiration), which the protocol's `MessageFormat` reads once
on arrival. Each queue the message is routed to holds a `MessageRef`; the message is
freed (and its journal record deleted) when its last reference is acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol


class MessageFormat(Protocol):
    """How the broker reads and rewrites messages of one wire encoding.

    Provided by a protocol plugin; the kernel never parses message bytes itself.
    """

    name: str

    def inspect(self, data: bytes) -> tuple[bool, int, int]:
        """(durable, priority, ttl in ms or 0) read from the message's header."""

    def selector_lookup(self, message: Message) -> Callable[[str], object]:
        """A function mapping selector identifiers to the message's field values."""

    def for_delivery(self, message: Message, delivery_count: int) -> bytes:
        """The bytes to send to a consumer: the original with its delivery-count set."""

    def annotate(self, data: bytes, annotations: Mapping[str, object]) -> bytes:
        """A copy with extra message annotations (dead-letter and expiry stamps)."""

    def target_address(self, data: bytes) -> str | None:
        """The address the message names itself (AMQP `to`), for anonymous relays."""


#: Estimated bytes of Python objects per message in memory, beyond its encoded bytes;
#: counted in the memory figures that max-size-bytes and global-max-size limit.
MEMORY_OVERHEAD = 300


class Message:
    """One message, stored once however many queues hold it."""

    __slots__ = (
        "address",
        "data",
        "durable",
        "expiration",
        "format",
        "id",
        "lookup_cache",
        "priority",
        "refcount",
        "stored_refs",
    )

    def __init__(
        self,
        message_id: int,
        data: bytes,
        address: str,
        fmt: MessageFormat,
        *,
        durable: bool = False,
        priority: int = 4,
        expiration: int = 0,
    ) -> None:
        self.id = message_id
        self.data = data
        self.address = address
        self.format = fmt
        self.durable = durable
        self.priority = priority
        #: Absolute expiry time in ms since the epoch; 0 means never.
        self.expiration = expiration
        #: Live references (queues holding it); the message is freed at zero.
        self.refcount = 0
        #: References held by durable queues while the message is in the journal; each
        #: acknowledgement of one is journaled, the last deletes the record.
        self.stored_refs = 0
        self.lookup_cache: Callable[[str], object] | None = None

    @property
    def size(self) -> int:
        return len(self.data)

    def lookup(self) -> Callable[[str], object]:
        """The selector lookup function, built on first use and kept."""
        if self.lookup_cache is None:
            self.lookup_cache = self.format.selector_lookup(self)
        return self.lookup_cache

    def __repr__(self) -> str:
        return f"<Message {self.id} to {self.address!r}, {len(self.data)} bytes>"


class MessageRef:
    """A message's place in one queue, with that queue's delivery count."""

    __slots__ = ("consumer", "delivery_count", "message", "queue", "seq")

    def __init__(self, message: Message, queue: object, delivery_count: int = 0) -> None:
        self.message = message
        self.queue = queue
        self.delivery_count = delivery_count
        #: Position in the queue, assigned on enqueue; a released ref returns to it.
        self.seq = 0
        #: The consumer holding it unsettled, or None while it waits in the queue.
        self.consumer: object | None = None

    def __repr__(self) -> str:
        return f"<MessageRef {self.message.id} in {getattr(self.queue, 'name', '?')}>"


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
        super().__init__(message, queue, delivery_count)
        self.cursor: Any = cursor
        self.page = page
        self.offset = offset
