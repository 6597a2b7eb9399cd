"""Stream queues (`x-queue-type = "stream"`): every message kept, read by position.

A message routed to a stream gets the next sequence number of the stream (never reused)
and an enqueue time, both stored with it and written into it as the annotations
`x-opt-sequence-number` and `x-opt-enqueued-time` (see `records`). The stream keeps its
messages in a `StreamStore` its broker's store provides (segment files under
`<data-dir>/streams/<queue>`, or database rows), appended by a writer thread (see
`writer`). That store is the durable record of a durable message sent to the stream: the
broker does not journal it, and the producer's acknowledgement waits for the store's
sync (`keep`). A transaction's messages (and what the journal held at a crash) are
journaled first, as for any queue, and acknowledged once the store has them; recovery
appends those again, skipping the ones the last segments already hold. A store that
refuses a write (a full file system) holds it, and what is held is acknowledged only once
it is stored.

Reads do not consume: each consumer reads from its own position, given as a source filter
when it attaches (`scow:stream-offset`: "first", "last", "next", a sequence number or a
timestamp; optional `scow:stream-end`: a sequence number (exclusive) or a timestamp;
optional `scow:stream-pack`: up to that many records per delivery, as one pack (see
`records.pack`), which is what makes a bulk reader fast).
Reads, seeks by time and selectors run on reader threads, never on the event loop: the
loop gets the messages a consumer wants, ready to deliver, and a consumer's drain is
answered once the read it waits for is in. A selector runs on the properties read from a
record's bytes (a `Message` is made only for a record it wants), and a read passes over
the chunks of records whose summaries prove it wants none of them (see `chunks`).
Settling a delivery removes nothing. Gaps in the sequence numbers are normal (selectors,
retention). Retention deletes whole segments: past `retention-bytes`, older than
`retention-time`, or (with `retention-cursors`) once every named cursor has passed them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.message import Entry, Message, MessageRef, PackedRows
from scow.core.model import InvalidField
from scow.plugins.paging.selecting import RecordFilter
from scow.plugins.spark.chunks import CHUNK, ChunkSummaries
from scow.plugins.spark.cursors import Cursors, now_ms
from scow.plugins.spark.records import (
    MAX_PACK_RECORDS,
    PACK_BYTES,
    PACK_FILTER,
    MalformedPack,
    annotate,
    grouped,
    pack,
    row_id,
    rows_in,
)
from scow.plugins.spark.writer import StreamWriter, Written
from scow.protocols.amqp.codec import Described, Timestamp

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.interfaces import Completion, Consumer, Cursor, StreamSegment, StreamStore
    from scow.core.model import QueueSpec

log = structlog.get_logger("scow.stream")

START_FILTER = "scow:stream-offset"
END_FILTER = "scow:stream-end"
#: RabbitMQ's name for the start filter, accepted as well.
RABBITMQ_START_FILTER = "rabbitmq:stream-offset-spec"
START_NAMES = ("first", "last", "next")
#: Records read ahead per consumer at most: a chunk, so a read from a chunk's start
#: covers it whole (and can summarize it).
READ_AHEAD = CHUNK
#: Records a read with a selector scans at most for one the selector wants.
SCAN_LIMIT = 16 * READ_AHEAD

DEFAULT_SEGMENT_BYTES = 16 << 20
DEFAULT_CURSOR_TTL = 7 * 24 * 3600 * 1000

ARGUMENTS = {
    "retention-bytes": "Delete the oldest segments once the stream holds more bytes; 0: no limit.",
    "retention-time": "Delete segments whose messages are all older than this (ms); 0: no limit.",
    "retention-cursors": "true: delete segments every named cursor has passed.",
    "segment-bytes": (
        "Bytes per segment (a file, or a range of rows on the database store), the unit "
        f"of retention (default {DEFAULT_SEGMENT_BYTES})."
    ),
    "cursor-ttl": (
        f"Drop a named cursor unused this long (ms; default {DEFAULT_CURSOR_TTL}; 0: never)."
    ),
}


def check(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Normalize a stream's arguments; ValueError naming what is not accepted."""
    checked = dict(arguments)
    for name in ("retention-bytes", "retention-time", "segment-bytes", "cursor-ttl"):
        if name not in checked:
            continue
        value = checked[name]
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} = {value!r}: expected an integer of 0 or more")
        checked[name] = value
    if checked.get("segment-bytes") == 0:
        raise ValueError("segment-bytes = 0: expected at least 1")
    if "retention-cursors" in checked:
        value = checked["retention-cursors"]
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise ValueError(f"retention-cursors = {value!r}: expected true or false")
        checked["retention-cursors"] = value
    return checked


@dataclass(frozen=True)
class Retention:
    bytes: int = 0
    time_ms: int = 0
    cursors: bool = False


def _filter_value(value: Any) -> Any:
    return value.value if isinstance(value, Described) else value


def parse_position(queue: str, filters: Mapping[str, Any]) -> tuple[Any, Any]:
    """(start, end) from a consumer's source filters; InvalidField naming a bad one.

    start is "first", "last", "next", ("seq", n) or ("time", ms); end is None,
    ("seq", n) or ("time", ms).
    """
    start: Any = "next"
    end: Any = None
    for key, raw in filters.items():
        value = _filter_value(raw)
        if key in (START_FILTER, RABBITMQ_START_FILTER):
            if isinstance(value, str) and value in START_NAMES:
                start = value
            elif isinstance(value, Timestamp):
                start = ("time", int(value))
            elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                start = ("seq", int(value))
            else:
                raise InvalidField(
                    f"stream '{queue}': filter {key} = {value!r}: expected first, last, next, "
                    "a sequence number or a timestamp"
                )
        elif key == END_FILTER:
            if isinstance(value, Timestamp):
                end = ("time", int(value))
            elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                end = ("seq", int(value))
            else:
                raise InvalidField(
                    f"stream '{queue}': filter {key} = {value!r}: expected a sequence number "
                    "(exclusive) or a timestamp"
                )
    return start, end


def pack_size(queue: str, filters: Mapping[str, Any]) -> int:
    """Records per delivery a consumer's `scow:stream-pack` filter asks for (1: no packs);
    InvalidField naming a bad value."""
    raw = filters.get(PACK_FILTER)
    if raw is None:
        return 1
    value = _filter_value(raw)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PACK_RECORDS:
        raise InvalidField(
            f"stream '{queue}': filter {PACK_FILTER} = {value!r}: expected records per "
            f"delivery, 1 to {MAX_PACK_RECORDS}"
        )
    return int(value)


def stored_rows(stored: set[int], pack_id: int, rows: int) -> int:
    """How many of the first rows of the committed pack `pack_id` (of `rows`) the store
    holds (`stored`: the ids of its last segments' records), taken out of `stored`. A
    crash can leave a prefix of a pack's rows stored (they are appended in order), never
    a later row without the earlier ones."""
    first = 0
    while stored and first < rows and (found := row_id(pack_id, first)) in stored:
        stored.discard(found)
        first += 1
    return first


class _Reader:
    """One consumer's position and the messages read ahead for it (each with the number
    of records it carries: more than one in a pack)."""

    __slots__ = ("buffer", "consumer", "end", "next", "pack", "reading")

    def __init__(self, consumer: Consumer, start: int, end: int, pack: int) -> None:
        self.consumer = consumer
        self.next = start
        self.end = end
        self.pack = pack
        self.buffer: deque[tuple[Message, int]] = deque()
        #: A read (or a seek) for it runs off the loop: its drain waits for the answer.
        self.reading = False


class _Kept:
    """A message the stream's store is the durable record of (`keep`), until stored."""

    __slots__ = ("entry", "on_stored")

    def __init__(self, entry: Entry, on_stored: Completion | None) -> None:
        self.entry = entry
        self.on_stored = on_stored


class StreamQueue:
    """A stream: the Queue protocol over a `StreamStore`, reads by position."""

    admit: Callable[[Message], None] | None = None
    #: Its store holds its messages: the address's pager hands it each message directly
    #: and gives it no cursor (see `scow.core.interfaces.stores_own_messages`)...
    stores_own_messages = True
    #: ...and is their durable record: a durable message sent to it outside a
    #: transaction is not journaled (see `scow.core.interfaces.keeps_durable_copy`)...
    keeps_durable_copy = True
    #: ...except a draining one while its address's pages hold some of its messages
    #: (written there before streams were kept out of pages, or by a transaction the
    #: journal had no room for at commit).
    cursor: Cursor | None = None
    #: It appends a committed pack (`PackedRows`) as the rows it holds: a Spark sink's
    #: commit routes a staged pack to it whole (see `staging`).
    takes_packs = True

    def __init__(
        self,
        spec: QueueSpec,
        broker: Broker,
        store: StreamStore,
        place: Path,
        reads: Executor,
        on_close: Callable[[StreamQueue], None],
    ) -> None:
        arguments = dict(spec.arguments)
        self.spec = spec
        self.id = 0
        self.name = spec.name
        self.address = spec.address
        self.routing_type = spec.routing_type
        self.durable = spec.durable
        self.filter: Callable[[Message], bool] | None = None
        self.broker = broker
        self.retention = Retention(
            arguments.get("retention-bytes", 0),
            arguments.get("retention-time", 0),
            arguments.get("retention-cursors", False),
        )
        self.store = store
        contents = store.open()
        self.segments: list[StreamSegment] = contents.segments
        self.next_seq = contents.next_seq
        self._stored_ids = contents.recent_ids
        self._assigned = self.next_seq
        self._recovering = True
        self.cursors = Cursors(
            store.load_cursors(),
            store.save_cursors,
            arguments.get("cursor-ttl", DEFAULT_CURSOR_TTL),
        )
        self._loop = asyncio.get_running_loop()
        self._reads = reads
        self._on_close = on_close
        self._readers: dict[Consumer, _Reader] = {}
        self._format: Any = broker.message_format
        self._address_info: Any = None
        self._closed = False
        self.chunks = ChunkSummaries(self._properties)
        self.writer = StreamWriter(
            store,
            place,
            lambda written: self._loop.call_soon_threadsafe(self._written, written),
            annotate,
            self.chunks.appended,
        )
        self.memory_bytes = 0
        self.delivering = 0
        self.delivering_bytes = 0
        self.messages_expired = 0
        self.messages_killed = 0
        self.messages_added = 0
        self.messages_delivered = 0
        self.segments_deleted = 0

    def __repr__(self) -> str:
        return f"<StreamQueue {self.name!r}: {self.first_seq}..{self.next_seq}>"

    # ------------------------------------------------------------------ figures

    @property
    def first_seq(self) -> int:
        """The lowest sequence number still kept (== next_seq when empty)."""
        return self.segments[0].first if self.segments else self.next_seq

    def stored_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def message_count(self) -> int:
        return self.next_seq - self.first_seq

    def ready_count(self) -> int:
        return self._assigned - self.next_seq

    def consumer_count(self) -> int:
        return len(self._readers)

    def consumers(self) -> list[Consumer]:
        return [c for c in self._readers if not c.browse]

    def attached(self) -> list[Consumer]:
        return list(self._readers)

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "routing-type": self.routing_type.value,
            "durable": self.durable,
            "queue-type": "stream",
            "message-count": self.message_count(),
            "first-sequence": self.first_seq,
            "next-sequence": self.next_seq,
            "writing": self.ready_count(),
            "segments": len(self.segments),
            "stored-bytes": self.stored_bytes(),
            "cursors": len(self.cursors),
            "consumer-count": self.consumer_count(),
            "messages-added": self.messages_added,
            "messages-delivered": self.messages_delivered,
            "segments-deleted": self.segments_deleted,
            "chunk-summaries": len(self.chunks),
            "chunks-skipped": self.chunks.skipped,
            "write-errors": self.writer.errors,
            "writes-held": self.writer.held,
        }

    # ------------------------------------------------------------------ appending

    def enqueue(self, entry: Entry) -> None:
        """A message the journal holds (a transaction's, recovery's, or not durable):
        acknowledged once the store has it. A pack the broker routed whole (`PackedRows`:
        a Spark sink's committed rows; never what a client sent) is appended as its rows."""
        message = entry.message
        if message.data.__class__ is PackedRows:
            self._append_rows(message, entry)
            return
        if self._stored_ids and message.id in self._stored_ids:
            self._stored_ids.discard(message.id)  # stored before a crash: only the ack is due
            self._acknowledge(entry)
            return
        self._append(message, entry)

    def _append_rows(self, message: Message, entry: Entry) -> None:
        """Append a committed pack's rows (after those a crash left stored: they were
        appended in order, so those are the first ones), one store append for all. One
        whose sizes do not fit its bytes is refused alone (dead-lettered), checked here
        so that the writer never meets it."""
        try:
            rows = rows_in(message.data)
        except MalformedPack as exc:
            log.error(
                "committed pack refused: malformed; dead-lettered",
                stream=self.name,
                message=message.id,
                reason=str(exc),
            )
            self.broker.reject(self._ref(entry))
            return
        first = stored_rows(self._stored_ids, message.id, rows)
        if first == rows:  # all stored before a crash: only the ack is due
            self._acknowledge(entry)
            return
        seq = self._assigned
        self._assigned = seq + rows - first
        self.messages_added += rows - first
        self.writer.append_rows(seq, message.id, message.data, first, entry)

    def keep(self, entry: Entry, on_stored: Completion | None) -> None:
        """A durable message whose only record is to be the store's: `on_stored` runs
        once the store has made it durable (see `keeps_durable_copy`)."""
        self._append(entry.message, _Kept(entry, on_stored))

    def _append(self, message: Message, token: object) -> None:
        if message.data.__class__ is not bytes:
            message.restore()  # flowed to disk meanwhile
        if self._format is None:
            self._format = message.kind.format
        seq = self._assigned
        self._assigned = seq + 1
        self.messages_added += 1
        self.writer.append(seq, message.id, message.data, token)  # type: ignore[arg-type]

    def recovered(self) -> None:
        """Recovery is over (the broker started): forget the ids that let it skip
        messages already stored, once its address's pages have handed over what they
        still held for it (`cursor`: a draining one; a crash may have come between such
        a message's append and its acknowledgement)."""
        self._recovering = False
        self._forget_stored_ids()

    def _forget_stored_ids(self) -> None:
        cursor = self.cursor
        if not self._recovering and (cursor is None or not cursor.backlog):
            self._stored_ids = set()

    def _ref(self, entry: Entry) -> MessageRef:
        # a message routed to several queues is a SharedMessage: a Message, not a ref
        return entry if isinstance(entry, MessageRef) else MessageRef(entry.message, self)

    def _acknowledge(self, entry: Entry) -> None:
        self.broker.acknowledge(self._ref(entry))

    def _written(self, written: Written) -> None:
        """Back on the loop: a batch is stored; acknowledge it and let readers see it."""
        broker = self.broker
        for token in written.tokens:
            if token.__class__ is _Kept:
                kept: _Kept = token  # type: ignore[assignment]
                if kept.on_stored is not None:
                    kept.on_stored()
                broker.release_kept(self._ref(kept.entry))
            else:
                self._acknowledge(token)  # type: ignore[arg-type]
        if self._stored_ids:
            self._forget_stored_ids()
        if self._closed:
            return
        appended = written.appended
        if appended.new_segments:
            self.segments = [*self.segments, *appended.new_segments]
        if appended.sizes:
            # the segment the batch began in and every one it rolled
            for segment in self.segments[-(len(appended.new_segments) + 1) :]:
                segment.size = appended.sizes.get(segment.first, segment.size)
        if written.last_seq >= 0:
            self.next_seq = written.last_seq + 1
        self.apply_retention()
        for reader in list(self._readers.values()):
            self._serve(reader)

    # ------------------------------------------------------------------ retention

    def apply_retention(self, now: int | None = None) -> int:
        """Delete the segments retention lets go (never the one written to); how many."""
        segments = self.segments
        if len(segments) < 2:
            return 0
        retention = self.retention
        drop = 0
        if retention.bytes:
            total = sum(s.size for s in segments)
            while drop < len(segments) - 1 and total > retention.bytes:
                total -= segments[drop].size
                drop += 1
        if retention.time_ms:
            cutoff = (now or now_ms()) - retention.time_ms
            # a segment's newest message is no later than the next segment's first
            while drop < len(segments) - 1 and segments[drop + 1].first_time < cutoff:
                drop += 1
        if retention.cursors:
            lowest = self.cursors.lowest()
            if lowest is not None:
                while drop < len(segments) - 1 and segments[drop + 1].first <= lowest:
                    drop += 1
        if drop:
            gone = segments[:drop]
            self.segments = segments[drop:]
            self.segments_deleted += drop
            self.writer.delete([s.first for s in gone])
            self.chunks.forget_before(self.segments[0].first)
        return drop

    # ------------------------------------------------------------------ reading

    def position(self, start: Any) -> int:
        """The sequence number a start position that needs no read means now."""
        if start == "first":
            return self.first_seq
        if start == "next":
            return self._assigned
        if start == "last":
            return max(self.next_seq - 1, self.first_seq)
        return int(start[1])

    def seek(self, when: int) -> int:
        """The first sequence number enqueued at or after `when` (ms since the epoch).

        Reads the store: call it off the loop.
        """
        found = self.store.seek(when)
        return self.next_seq if found is None else found

    def add_consumer(self, consumer: Consumer) -> None:
        filters = getattr(consumer, "filters", None) or {}
        start, end = parse_position(self.name, filters)
        if self._address_info is None:
            self._address_info = self.broker.get_address(self.address)
        reader = self._readers[consumer] = _Reader(
            consumer,
            0 if _is_time(start) else self.position(start),
            1 << 63 if end is None or _is_time(end) else self.position(end),
            pack_size(self.name, filters),
        )
        if _is_time(start) or _is_time(end):  # a position by time is a read of the store
            reader.reading = True
            future = self._reads.submit(self._locate, start, end)
            future.add_done_callback(lambda f: self._from_reader(self._located, reader, f))
            return
        self._serve(reader)

    def _locate(self, start: Any, end: Any) -> tuple[int | None, int | None]:
        """(reader thread) The sequence numbers of the positions given by time."""
        return (
            self.seek(start[1]) if _is_time(start) else None,
            self.seek(end[1]) if _is_time(end) else None,
        )

    def _located(self, reader: _Reader, found: tuple[int | None, int | None]) -> None:
        start, end = found
        if start is not None:
            reader.next = start
        if end is not None:
            reader.end = end

    def remove_consumer(self, consumer: Consumer) -> None:
        self._readers.pop(consumer, None)

    def holds_drain(self, consumer: Consumer) -> bool:
        """True while a read for `consumer` runs: its drain is answered when it is in
        (`Consumer.drain_ready`), since the read may bring what its credit asks for."""
        reader = self._readers.get(consumer)
        return reader is not None and reader.reading

    def dispatch(self) -> None:
        for reader in list(self._readers.values()):
            self._serve(reader)

    def _serve(self, reader: _Reader) -> None:
        """Deliver what the consumer's credit allows; start a read off the loop for more."""
        if reader.buffer:
            self._deliver(reader)
        if reader.reading or reader.buffer or reader.consumer.credit() <= 0:
            return
        limit = min(self.next_seq, reader.end)
        if reader.next >= limit:
            return
        reader.reading = True
        future = self._reads.submit(
            self._read, reader.next, limit, reader.consumer.filter, reader.pack
        )
        future.add_done_callback(lambda f: self._from_reader(self._read_in, reader, f))

    def _from_reader(
        self, then: Callable[[_Reader, Any], None], reader: _Reader, future: Future[Any]
    ) -> None:
        """(reader thread) Hand a finished read back to the loop."""
        self._loop.call_soon_threadsafe(self._reader_done, then, reader, future)

    def _reader_done(
        self, then: Callable[[_Reader, Any], None], reader: _Reader, future: Future[Any]
    ) -> None:
        reader.reading = False
        if self._readers.get(reader.consumer) is not reader:
            return  # the consumer left meanwhile
        try:
            then(reader, future.result())
        except Exception:  # tried again at the next write or flow, not at once
            log.exception("stream read failed", stream=self.name, at=reader.next)
        else:
            self._serve(reader)
        if not reader.reading:
            drain_ready = getattr(reader.consumer, "drain_ready", None)
            if drain_ready is not None:
                drain_ready()

    def _read(
        self, seq: int, end: int, selector: Callable[[Message], bool] | None, per_pack: int
    ) -> tuple[list[tuple[Message, int]], int]:
        """(reader thread) The messages from `seq` below `end` the selector wants, in
        packs of up to `per_pack` records when that is more than 1, and where to read
        next. Records a selector refuses never reach the loop, nor become messages when it
        can judge them by their bytes; a read passes over the chunks whose summaries prove
        it wants nothing there, and scans up to SCAN_LIMIT records for one it wants."""
        name, fmt, read, chunks = self.address, self._format, self.store.read, self.chunks
        selecting = None if selector is None else RecordFilter([selector], self._properties)
        wanted: list[tuple[int, bytes]] = []
        scanned = 0
        while seq < end and not wanted and scanned < SCAN_LIMIT:
            if selecting is not None:
                seq = chunks.skip(seq, end, selecting)
                if seq >= end:
                    break
            records, following = read(seq, end, READ_AHEAD)
            if selecting is not None:
                chunks.rebuild(seq, records, following)
            seq = max(seq, following)
            if not records:
                break
            scanned += len(records)
            if selecting is None:
                wanted += [(rseq, data) for rseq, _enqueued, data in records]
                continue
            for rseq, _enqueued, data in records:
                verdict = selecting.accepts(data)
                if verdict is False:
                    continue
                if verdict or selector(Message(rseq, data, name, fmt)):  # type: ignore[misc]
                    wanted.append((rseq, data))
        if per_pack == 1:
            return [(Message(rseq, data, name, fmt), 1) for rseq, data in wanted], seq
        packs: list[tuple[Message, int]] = []
        at = 0  # the first record of each pack gives it its id
        for group in grouped([data for _s, data in wanted], per_pack, PACK_BYTES):
            packs.append((Message(wanted[at][0], pack(group), name, fmt), len(group)))
            at += len(group)
        return packs, seq

    def _properties(self, data: bytes) -> Mapping[str, object]:
        """A record's application properties, read from its bytes (any thread)."""
        return self._format.properties(data)  # type: ignore[no-any-return]

    def _read_in(self, reader: _Reader, read: tuple[list[tuple[Message, int]], int]) -> None:
        messages, following = read
        reader.next = max(reader.next, following)
        reader.buffer.extend(messages)

    def _deliver(self, reader: _Reader) -> None:
        consumer = reader.consumer
        buffer = reader.buffer
        credit = consumer.credit
        deliver = consumer.deliver
        address = self._address_info
        browse = consumer.browse
        delivered = 0
        while buffer and credit() > 0:
            message, records = buffer.popleft()
            if not browse and address is not None:
                address.add_memory(len(message.data))  # given back when the consumer settles it
            deliver(MessageRef(message, self))
            delivered += records
        self.messages_delivered += delivered

    # ------------------------------------------------------------------ outcomes

    def acknowledge(self, ref: MessageRef) -> None:
        """Settling a delivery removes nothing from a stream."""

    def release(self, ref: MessageRef, *, delivered: bool) -> None:
        """A released delivery is not offered again: the consumer reads by position."""
        self.broker.discard(ref)

    def remove_delivering(self, ref: MessageRef) -> None:
        """Nothing to forget: deliveries are not tracked."""

    def take(self, predicate: Callable[[Entry], bool] | None = None) -> list[MessageRef]:
        """Nothing waits to be taken: a stream is trimmed by retention, not purged."""
        return []

    def waiting(self) -> Iterator[Entry]:
        return iter(())

    def browse(self) -> Iterator[MessageRef]:
        return iter(())

    def paged(self, message: Message) -> None:
        """Never called: a stream stores its own messages, so its address's pager hands
        them to `enqueue` even while the address pages."""

    def wanted_from_pages(self, highest_paged_priority: int) -> Callable[[Message], bool] | None:
        return None

    # ------------------------------------------------------------------ lifetime

    def stop(self) -> None:
        """Store what is queued and stop the writer (broker shutdown)."""
        self.writer.close()
        self.store.close()

    def close(self) -> None:
        """Deleted: its records and cursors go with it."""
        self.writer.close()
        self._closed = True
        self._on_close(self)
        self.store.destroy()


def _is_time(position: Any) -> bool:
    return isinstance(position, tuple) and position[0] == "time"
