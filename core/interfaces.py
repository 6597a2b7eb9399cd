"""The interfaces the kernel owns; built-in and third-party backends implement them.

Each is a `typing.Protocol`, so a backend needs no base class. Plugins hand the kernel a
frozen descriptor (see `scow.core.descriptors`) whose factory builds an object that
satisfies one of these protocols; the hot path then calls that object directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from scow.core.message import expired_by

if TYPE_CHECKING:
    from scow.core.message import Entry, Message, MessageRef
    from scow.core.model import QueueSpec, RouteStatus, RoutingType

# --------------------------------------------------------------------------- journal

#: Called (on the event loop, or wherever the journal's dispatcher runs it) once the
#: record it was passed with is as durable as asked for.
Completion = Callable[[], None]


def after_all(count: int, then: Completion) -> Completion:
    """A completion to be called `count` times (once per part that must be durable);
    `then` runs at the last call."""
    left = count

    def part() -> None:
        nonlocal left
        left -= 1
        if left == 0:
            then()

    return part


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """One committed record found by `Journal.load`, in journal order."""

    id: int
    type: int
    data: bytes
    is_update: bool = False


@dataclass(slots=True)
class PreparedTransaction:
    """A transaction that was prepared but neither committed nor rolled back."""

    tx_id: int
    data: bytes
    records: list[RecordInfo] = field(default_factory=list)
    deletes: list[int] = field(default_factory=list)


@dataclass(slots=True)
class LoadResult:
    """What recovery found: live records (adds and their updates) and prepared txs."""

    records: list[RecordInfo] = field(default_factory=list)
    prepared: list[PreparedTransaction] = field(default_factory=list)
    max_id: int = 0


@runtime_checkable
class Journal(Protocol):
    """An append-only record store that knows nothing about messages.

    Records have a 64-bit id chosen by the caller and a small integer type. An *add*
    creates a record, an *update* attaches more data to it (a *replaceable* update
    supersedes earlier replaceable updates of the same type, so compaction may keep only
    the last), a *delete* removes it and its updates. Transactional forms are buffered
    under a transaction id until `commit` or `rollback`; `prepare` makes a transaction
    survive a restart undecided.

    Non-transactional methods take `sync` (wait for the disk before calling `on_done`)
    and an optional `on_done` completion. The journal calls completions in batches through
    its dispatcher (`set_dispatcher`), never on the caller's stack for a sync record
    unless the journal has no disk at all.
    """

    def set_dispatcher(self, dispatch: Callable[[list[Completion]], None]) -> None:
        """Route completions: `dispatch` receives each batch once it is durable."""

    def load(self) -> LoadResult:
        """Open (creating if needed) and recover; call once, before any append."""

    def append_add(
        self,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        sync: bool,
        on_done: Completion | None = None,
    ) -> None: ...

    def append_update(
        self,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        sync: bool,
        on_done: Completion | None = None,
        replaceable: bool = False,
    ) -> None: ...

    def append_delete(
        self, record_id: int, *, sync: bool, on_done: Completion | None = None
    ) -> None: ...

    def append_add_tx(self, tx_id: int, record_id: int, record_type: int, data: bytes) -> None: ...

    def append_update_tx(
        self, tx_id: int, record_id: int, record_type: int, data: bytes
    ) -> None: ...

    def append_delete_tx(self, tx_id: int, record_id: int) -> None: ...

    def prepare(
        self, tx_id: int, data: bytes, *, sync: bool, on_done: Completion | None = None
    ) -> None: ...

    def commit(self, tx_id: int, *, sync: bool, on_done: Completion | None = None) -> None: ...

    def rollback(self, tx_id: int, *, sync: bool, on_done: Completion | None = None) -> None: ...

    def flush(self) -> None:
        """Block until everything appended so far is durable and its completions ran."""

    def stop(self) -> None:
        """Flush, stop background work and close files. Idempotent."""


# --------------------------------------------------------------------------- paging


@runtime_checkable
class PageStore(Protocol):
    """The pages of one address: numbered pages of records, each page written once, in order.

    Records are opaque bytes (the paging plugin's message encoding). The store frames each
    record (see `scow.core.page_frames`) so that `read` gives back exactly the records that
    were appended, in order, and never a torn or corrupt tail: opening a store cuts such a
    tail off the last page. Page numbers grow by one; only the highest page is appended to.

    One thread appends, syncs and deletes; other threads may `read` at the same time.
    """

    #: The address whose pages these are.
    address: str

    def page_numbers(self) -> list[int]:
        """Every page stored, in ascending order."""

    def append(self, page: int, records: Sequence[bytes]) -> int:
        """Append `records` to `page` (created when new); returns the page's size in bytes.

        Appended records may be read at once but are durable only after `sync`. An empty
        record is refused with ValueError (its frame would read as unwritten space).
        """

    def sync(self) -> None:
        """Make every appended record durable."""

    def read(self, page: int, offset: int = 0) -> bytes:
        """The page's framed records from byte `offset` (a frame boundary) to its end.

        Decode with `scow.core.page_frames.iter_frames`. A page that does not exist reads
        as empty.
        """

    # Optional: `read_unchecked(page, offset) -> bytes`, the page's bytes from `offset`
    # with no frame checked (a torn or corrupt tail included), for a reader that checks
    # each frame's CRC as it parses it; without it such a reader uses `read`.

    def delete(self, page: int) -> None:
        """Remove a page; deleting a missing page does nothing."""

    def close(self) -> None:
        """Release files and connections; idempotent."""


# --------------------------------------------------------------------------- streams

#: One stream record as stored: (sequence number, enqueue time in ms since the epoch,
#: broker message id (unsigned 64-bit), the message's bytes as delivered).
StreamRecord = tuple[int, int, int, bytes]


@dataclass(slots=True)
class StreamSegment:
    """One segment of a stream: consecutive records, the unit of retention."""

    #: Sequence number of its first record (a segment ends where the next one starts).
    first: int
    #: Bytes it holds (what retention-bytes counts).
    size: int
    #: Enqueue time of its first record (ms), or when it was made while it is empty.
    first_time: int


@dataclass(slots=True)
class StreamContents:
    """What `StreamStore.open` found."""

    segments: list[StreamSegment] = field(default_factory=list)
    #: The sequence number the next record gets (never reused, even past retention).
    next_seq: int = 0
    #: Broker message ids of the records of the last two segments: recovery skips the
    #: journaled messages a crash left both there and in the journal.
    recent_ids: set[int] = field(default_factory=set)


@dataclass(slots=True)
class StreamAppended:
    """What one `StreamStore.append` did, for the stream's view of its segments."""

    #: Segments the append began (a roll), in order.
    new_segments: list[StreamSegment] = field(default_factory=list)
    #: segment first sequence number -> its size now, for every segment it wrote to.
    sizes: dict[int, int] = field(default_factory=dict)


@runtime_checkable
class StreamStore(Protocol):
    """The records of one stream queue: appended in sequence order, read by position.

    Records fill segments of about `segment_bytes` (given to the backend's factory); a
    segment is deleted whole (retention), always the oldest ones. The store also keeps
    the stream's named cursors (a small mapping written whole on each change).

    Threads: one writer thread calls `append` and `delete_segments`; `read` and `seek`
    run on reader threads at the same time (never on the event loop, since they may
    read a whole segment or wait for a database).
    """

    #: The stream (queue) whose records these are.
    name: str

    def open(self) -> StreamContents:
        """Open (creating if needed) and recover: a torn tail is cut off. Call once."""

    def append(self, records: Sequence[StreamRecord]) -> StreamAppended:
        """Write `records` (sequence numbers following the last ones) and make them
        durable before returning. All or nothing: on an error (OSError for a full file
        system, see `scow.core.disk_monitor.is_no_space`) nothing of them stays, and
        the same records may be appended again."""

    def read(self, seq: int, end: int, limit: int) -> tuple[list[tuple[int, int, bytes]], int]:
        """Up to `limit` records from `seq` (or the first kept after it) below `end`:
        [(sequence, enqueue time, bytes)], and the sequence number to read next. Records
        of deleted segments are skipped (a gap)."""

    def seek(self, when: int) -> int | None:
        """The sequence number of the first record enqueued at or after `when` (ms);
        None when there is none."""

    def delete_segments(self, firsts: Sequence[int]) -> None:
        """Delete the segments starting at `firsts` (the oldest ones) with their records."""

    def load_cursors(self) -> dict[str, tuple[int, int]]:
        """The stored cursors: name -> (sequence number, last used ms)."""

    def save_cursors(self, cursors: Mapping[str, tuple[int, int]]) -> None:
        """Replace the stored cursors, durably."""

    def destroy(self) -> None:
        """The stream was deleted: remove its records and cursors, and close."""

    def close(self) -> None:
        """Release files and connections; idempotent."""


# --------------------------------------------------------------------------- queues


class Cursor(Protocol):
    """A queue's read position in its address's pages (built by the paging plugin).

    A paged message costs no object while it is on disk: the cursor holds a position and
    counters. The queue asks it for more (`fill`) whenever it has room and consumers; the
    cursor reads off the event loop and enqueues what it read as `PagedRef`s.
    """

    #: Messages for this queue still in pages, not yet read into memory, and their bytes.
    backlog: int
    backlog_bytes: int

    def fill(self, now: bool = False) -> None:
        """The queue has room: read more paged messages into it (asynchronously; what is
        read already is handed over at the end of the loop turn, or at once with `now`:
        a consumer's new credit, which a drain answers right after)."""

    def purge(self, up_to: int) -> None:
        """Drop, as it reads them (asynchronously), the paged messages whose id is at most
        `up_to`: each is acknowledged instead of entering the queue."""

    def journal_ack(self, ref: MessageRef, tx_id: int | None) -> bool:
        """Journal that the queue is done with paged `ref`; True if anything was written.
        Nothing is for a message that is not durable: the broker's own acknowledgements
        do not ask for those."""

    def settle(self, ref: MessageRef) -> None:
        """Paged `ref` left the queue for good (acknowledged, moved or dropped)."""

    def store_delivery_count(self, ref: MessageRef, on_done: Callable[[], None]) -> bool:
        """Journal `ref`'s new delivery count; True when `on_done` will run once it is."""

    def browse(self, browser: Consumer) -> None:
        """Show `browser` the paged messages past what it saw, as its credit allows."""

    def browsed(self, browser: Consumer, ref: MessageRef) -> bool:
        """True if `browser` was shown `ref` from the pages already."""

    def forget(self, consumer: Consumer) -> None:
        """`consumer` left the queue."""

    def expire_scan(self, now: int) -> None:
        """Read expired messages out of the pages into the queue, where expiry takes them."""

    def paged(self, up_to: int) -> AsyncIterator[tuple[int, int, Message]]:
        """(page, offset, message) of the paged messages past the position, in order, up to
        message id `up_to`, read off the loop without entering the queue (management)."""

    def take_paged(self, page: int, at: int, message: Message) -> MessageRef | None:
        """Take a message `paged` found for good (until `Broker.discard`); None when the
        cursor read it into the queue meanwhile."""

    def take_held(self, chosen: Callable[[MessageRef], bool]) -> list[MessageRef]:
        """Take the journal's messages held back at recovery that `chosen` accepts."""

    def stats(self) -> dict[str, Any]: ...


@runtime_checkable
class Consumer(Protocol):
    """Something that takes messages from a queue: a protocol's sending link."""

    #: Selector the consumer gave when it subscribed, or None.
    filter: Callable[[Message], bool] | None
    #: True for a browser (distribution-mode copy): sees messages without taking them.
    browse: bool

    def credit(self) -> int:
        """How many more messages it can take right now."""

    def deliver(self, ref: MessageRef) -> bool | None:
        """Hand over one message; the queue will hear its outcome later.

        True when it takes no more for now whatever its credit (its connection's output
        is full): a queue handing over a batch stops there, and the consumer calls the
        queue's `dispatch()` again once it can take more."""

    def detach(self, reason: str) -> None:
        """The broker ends the subscription (its queue is deleted): give back what is
        unsettled and tell the client why."""

    # Optional: `drain_ready()`, answer a drain the queue held (see `holds_drain`).


@runtime_checkable
class Queue(Protocol):
    """A queue bound to an address. Implementations come from `QueueType` factories.

    The broker sets `id`, `durable` and `filter` after the factory builds the queue.

    A queue type that keeps its messages in its own storage, in bounded memory (a
    stream's segment files), declares the class attribute `stores_own_messages = True`
    (optional: see `stores_own_messages`); one whose storage is also the durable record
    of them declares `keeps_durable_copy = True` and has `keep(entry, on_stored)` (see
    `keeps_durable_copy`).

    A queue type may also have `enqueue_all(entries)`: `enqueue` of each entry, in
    order, done as a batch. A cursor draining pages hands over what it read that way
    when the queue has it (the standard queue serves its one consumer's credit without
    asking for it per message), else one `enqueue` at a time. And `deliverable()`: how
    many entries it would hand straight to a consumer now, or None when entries may
    wait or be offered around; a cursor then hands over no more than that. And
    `take_expired(now)`: see `take_expired`.
    """

    spec: QueueSpec
    id: int
    name: str
    address: str
    routing_type: RoutingType
    durable: bool
    #: The queue's own filter (subscription selectors): messages it refuses never enter.
    filter: Callable[[Message], bool] | None
    #: Called with each message routed to the queue, before it is stored or enqueued
    #: anywhere: raises BrokerError (e.g. ResourceLimitExceeded) to refuse the send as a
    #: whole. None for queues that take whatever their filter accepts.
    admit: Callable[[Message], None] | None
    #: Its position in the address's pages while the address has any (set by the pager).
    cursor: Cursor | None
    #: Bytes of the messages in memory (waiting and delivering); delivered and unsettled
    #: messages and their bytes.
    memory_bytes: int
    delivering: int
    delivering_bytes: int
    messages_expired: int
    messages_killed: int

    def enqueue(self, entry: Entry) -> None:
        """Add a message (new to this queue) or a reference (with per-queue state).

        The queue turns a message into a `MessageRef` (`entry.as_ref(queue)`) only when
        it hands it to a consumer, so waiting messages cost no per-queue object.
        """

    def add_consumer(self, consumer: Consumer) -> None: ...

    def remove_consumer(self, consumer: Consumer) -> None:
        """Forget `consumer`; idempotent."""

    def consumer_count(self) -> int: ...

    def ready_count(self) -> int:
        """Messages waiting in memory (not delivered)."""

    def consumers(self) -> Sequence[Consumer]:
        """The consumers that receive (not browsers), for cursors that look ahead for
        their selectors."""

    def attached(self) -> list[Consumer]:
        """Every consumer and browser attached."""

    def message_count(self) -> int:
        """Messages held, in memory and in pages, including those delivered and unsettled."""

    def dispatch(self) -> None:
        """Offer pending messages to consumers with credit."""

    def close(self) -> None:
        """The queue is deleted (its messages taken): release what it holds outside
        memory, such as files."""

    def acknowledge(self, ref: MessageRef) -> None:
        """The consumer is done with a delivered `ref`."""

    def paged(self, message: Message) -> None:
        """A message routed to this queue went to its address's pages; the cursor brings
        it back later (a last-value queue drops the waiting value it supersedes)."""

    def wanted_from_pages(self, highest_paged_priority: int) -> Callable[[Message], bool] | None:
        """Which paged messages its cursor should take ahead of its position (a priority
        queue: those of a priority above everything waiting in memory), given the
        highest priority in its pages; None for none."""

    def release(self, ref: MessageRef, *, delivered: bool) -> None:
        """Put a delivered `ref` back at its place and offer it again."""

    def remove_delivering(self, ref: MessageRef) -> None:
        """Forget a delivered `ref` the broker moved elsewhere (dead letter, expiry)."""

    def take(self, predicate: Callable[[Entry], bool] | None = None) -> list[MessageRef]:
        """Remove the waiting entries `predicate` accepts (all when None); their refs."""

    def browse(self) -> Iterable[MessageRef]:
        """The messages in the queue, in order, without taking them."""

    def waiting(self) -> Iterator[Entry]:
        """The waiting entries in delivery order, as they are: no copies, no refs made
        (bodies that flowed to disk stay there)."""

    def stats(self) -> dict[str, Any]: ...


def stores_own_messages(queue: Queue) -> bool:
    """True for a queue that keeps every message it is given in its own storage (a
    stream's segment files), in bounded memory, and reads them back from there.

    Its address's pages must not hold its messages, since it does not read them: while
    the address pages, the pager hands such a queue each message directly (as the broker
    does while the address does not page), gives it no cursor and never waits for it to
    delete a page or to leave page mode. Only what pages hold for it anyway (from an
    older broker, or a commit the journal had no room for) reaches it through a cursor
    that hands it everything, consumers or not (so `enqueue` must take `PagedRef`s).
    A queue type says so with the class attribute `stores_own_messages = True`; a queue
    without the attribute is paged like any other. Asked when a queue is bound, never
    per message.
    """
    return getattr(queue, "stores_own_messages", False) is True


def holds_drain(queue: Queue, consumer: Consumer) -> bool:
    """True when `queue` answers `consumer`'s drain itself, later: it is reading off the
    loop what the consumer's credit may take, and calls `consumer.drain_ready()` once
    that is delivered (a stream). A queue says so with a `holds_drain(consumer)` method;
    a protocol asks on each flow that drains, never per message."""
    held = getattr(queue, "holds_drain", None)
    return held is not None and bool(held(consumer))


def take_expired(queue: Queue, now: int) -> list[MessageRef]:
    """`queue.take` of the waiting messages expired by `now` (ms since the epoch): the
    broker's expiry scan, every period, of every queue. A queue that knows which of its
    entries can expire without reading each says so with a `take_expired(now)` method
    (the standard queue: a message held compactly has no expiry); any other is asked
    about each entry."""
    own = getattr(queue, "take_expired", None)
    if own is not None:
        return own(now)
    return queue.take(lambda entry: expired_by(entry, now))


def keeps_durable_copy(queue: Queue) -> bool:
    """True for a queue whose own storage is the durable record of what it is given (a
    stream's synced segments), so that a durable message to it is written once.

    Outside a transaction the broker does not journal a durable message for such a
    queue: it calls `queue.keep(entry, on_stored)` instead of `enqueue`, and the queue
    calls `on_stored` (when not None) once its copy is durable, then frees the entry
    with `broker.release_kept`; it journals no acknowledgement for it. Transactional
    sends (whose atomicity the journal gives) still reach it journaled, through
    `enqueue`. A queue type says so with the class attribute `keeps_durable_copy = True`
    (and must then store its own messages, `stores_own_messages`). Asked when a queue
    is bound, never per message.
    """
    return getattr(queue, "keeps_durable_copy", False) is True and stores_own_messages(queue)


# --------------------------------------------------------------------------- full policies


class Pager(Protocol):
    """Where an address's messages go while it pages (built by the PAGE policy's plugin).

    The broker hands a routed message to `page` once the address is full or already
    paging; the pager writes it once for every queue it was routed to, and each queue
    reads it back through its own `Cursor`. Queues that store their own messages
    (`stores_own_messages`) are not paged: they get the message as if the address did
    not page.
    """

    #: True while new messages go to pages.
    paging: bool

    def page(
        self,
        message: Message,
        queues: list[Queue],
        on_stored: Callable[[], None] | None,
        tx_id: int | None,
    ) -> RouteStatus:
        """Store `message` for `queues`; ROUTED, PENDING (on_stored follows), DROPPED.

        Raises ResourceLimitExceeded when a page limit refuses it (page-full-policy FAIL),
        before anything is stored. Within a transaction (`tx_id`), nothing is visible
        until `commit_tx` runs, and `on_stored` always follows.
        """

    def commit_tx(self, tx_id: int) -> None:
        """The journal committed `tx_id`: its paged messages become visible."""

    def bind(self, queue: Queue) -> None:
        """A queue was bound to the address: give it a cursor at the head of the pages."""

    def unbind(self, queue: Queue) -> None:
        """A queue left: forget its cursor, so the pages it held can go."""

    def check(self) -> None:
        """Memory was freed: leave page mode if every cursor caught up and there is room."""

    def close(self) -> None:
        """The address was deleted (its queues first): release its store."""

    def stats(self) -> dict[str, Any]: ...


@runtime_checkable
class FullPolicy(Protocol):
    """What an address does with a new message once it holds `max-size-bytes`."""

    def admit(self, message: Message) -> bool | None:
        """True to route it, False to drop it silently, None to refuse it (sender error)."""

    def blocks_producers(self) -> bool:
        """True while producers should get no more credit."""


# --------------------------------------------------------------------------- protocols and services


@runtime_checkable
class Service(Protocol):
    """Background work with a lifetime: started after the broker, stopped before it.

    One that answers clients (an HTTP API) says so with a true `serves_clients`
    attribute: it starts after every other service has (paging has read its pages) and
    after the protocol listeners, so it never shows or acts on a broker half recovered.
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class ProtocolServer(Service, Protocol):
    """A listener for one wire protocol."""

    #: (host, port) pairs actually bound, available after `start`.
    bound: Sequence[tuple[str, int]]

    def stats(self) -> dict[str, Any]: ...
