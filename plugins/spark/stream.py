"""Stream queues (`x-queue-type = "stream"`): every message kept, read by position.

A message routed to a stream gets the next sequence number of the stream (never reused)
and an enqueue time, both stored with it and written into it as the annotations
`x-opt-sequence-number` and `x-opt-enqueued-time` (see `records`). The stream stores it in
its own segment files (see `segments`) under `<data-dir>/streams/<queue>`; the broker
journals a durable message first, as for any queue, and the stream acknowledges it once
its own copy is synced, so the journal holds only what the segments may not have yet
(recovery appends those again, skipping the ones the last segments already hold). A full
file system holds the stream's writes (and, through the disk monitor, its producers) until
space returns: what is held is acknowledged only once it is written (see `segments.Log`).

Reads do not consume: each consumer reads from its own position, given as a source filter
when it attaches (`scow:stream-offset`: "first", "last", "next", a sequence number or a
timestamp; optional `scow:stream-end`: a sequence number (exclusive) or a timestamp).
Settling a delivery removes nothing. Selectors still apply (gaps in the sequence numbers
are normal). Retention deletes whole segments: past `retention-bytes`, older than
`retention-time`, or (with `retention-cursors`) once every named cursor has passed them.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scow.core.message import Entry, Message, MessageRef
from scow.core.model import InvalidField
from scow.plugins.spark import segments as seglog
from scow.plugins.spark.cursors import Cursors, now_ms
from scow.plugins.spark.records import annotate
from scow.protocols.amqp.codec import Described, Timestamp

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.interfaces import Consumer, Cursor
    from scow.core.model import QueueSpec

STREAM_DIRECTORY = "streams"
START_FILTER = "scow:stream-offset"
END_FILTER = "scow:stream-end"
#: RabbitMQ's name for the start filter, accepted as well.
RABBITMQ_START_FILTER = "rabbitmq:stream-offset-spec"
START_NAMES = ("first", "last", "next")
#: Records read ahead per consumer at most.
READ_AHEAD = 4096

DEFAULT_SEGMENT_BYTES = 16 << 20
DEFAULT_CURSOR_TTL = 7 * 24 * 3600 * 1000

ARGUMENTS = {
    "retention-bytes": "Delete the oldest segments once the stream holds more bytes; 0: no limit.",
    "retention-time": "Delete segments whose messages are all older than this (ms); 0: no limit.",
    "retention-cursors": "true: delete segments every named cursor has passed.",
    "segment-bytes": (
        f"Bytes per segment file, the unit of retention (default {DEFAULT_SEGMENT_BYTES})."
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


def directory_name(queue_name: str) -> str:
    """A file name for the queue: safe characters kept, a hash keeps names distinct."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in queue_name)[:100]
    return f"{safe}-{hashlib.sha256(queue_name.encode()).hexdigest()[:12]}"


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


class _Reader:
    """One consumer's position and what was read ahead for it."""

    __slots__ = ("buffer", "consumer", "end", "next")

    def __init__(self, consumer: Consumer, start: int, end: int) -> None:
        self.consumer = consumer
        self.next = start
        self.end = end
        self.buffer: deque[tuple[int, int, bytes]] = deque()


class StreamQueue:
    """A stream: the Queue protocol over a segment log, reads by position."""

    admit: Callable[[Message], None] | None = None
    #: Its segments hold its messages: the address's pager hands it each message directly
    #: and gives it no cursor (see `scow.core.interfaces.stores_own_messages`)...
    stores_own_messages = True
    #: ...except a draining one while its address's pages hold some of its messages
    #: (written there before streams were kept out of pages, or by a transaction the
    #: journal had no room for at commit).
    cursor: Cursor | None = None

    def __init__(
        self,
        spec: QueueSpec,
        broker: Broker,
        data_dir: Path,
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
        self.directory = data_dir / STREAM_DIRECTORY / directory_name(spec.name)
        self.segments, self.next_seq, self._stored_ids = seglog.open_segments(self.directory)
        self._assigned = self.next_seq
        self._recovering = True
        self.cursors = Cursors(self.directory, arguments.get("cursor-ttl", DEFAULT_CURSOR_TTL))
        self._loop = asyncio.get_running_loop()
        self._on_close = on_close
        self._readers: dict[Consumer, _Reader] = {}
        self._format: Any = broker.message_format
        self._address_info: Any = None
        self._closed = False
        self.log = seglog.Log(
            self.directory,
            self.segments[-1] if self.segments else None,
            arguments.get("segment-bytes", DEFAULT_SEGMENT_BYTES),
            True,
            lambda written: self._loop.call_soon_threadsafe(self._written, written),
            annotate,
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
            "write-errors": self.log.errors,
            "writes-held": self.log.held,
        }

    # ------------------------------------------------------------------ appending

    def enqueue(self, entry: Entry) -> None:
        message = entry.message
        if message.data.__class__ is not bytes:
            message.restore()
        if self._format is None:
            self._format = message.kind.format
        if self._stored_ids and message.id in self._stored_ids:
            self._stored_ids.discard(message.id)  # stored before a crash: only the ack is due
            self._acknowledge(entry)
            return
        seq = self._assigned
        self._assigned = seq + 1
        self.messages_added += 1
        self.log.append(seq, message.id, message.data, entry)

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

    def _acknowledge(self, entry: Entry) -> None:
        # a message routed to several queues is a SharedMessage: a Message, not a ref
        ref = entry if isinstance(entry, MessageRef) else MessageRef(entry.message, self)
        self.broker.acknowledge(ref)

    def _written(self, written: seglog.Written) -> None:
        """Back on the loop: a batch is on disk; acknowledge it and let readers see it."""
        for token in written.tokens:
            self._acknowledge(token)
        if self._stored_ids:
            self._forget_stored_ids()
        if self._closed:
            return
        if written.new_segments:
            self.segments = [*self.segments, *written.new_segments]
        if written.index or written.sizes:
            # the segment the batch began in and every one it rolled: a batch that rolled
            # two or more left its first segment further back than the last two, and that
            # one's final size unapplied hid its last records from positioned reads
            touched = self.segments[-(len(written.new_segments) + 1) :]
            by_first = {s.first: s for s in touched}
            for first, entry in written.index:
                segment = by_first.get(first)
                if segment is not None and segment.index is not None:
                    segment.index.append(entry)
            for first, size in written.sizes.items():
                if first in by_first:
                    by_first[first].size = size
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
            self.log.delete([s.path for s in gone])
        return drop

    # ------------------------------------------------------------------ reading

    def position(self, start: Any) -> int:
        """The sequence number a start position means now."""
        if start == "first":
            return self.first_seq
        if start == "next":
            return self._assigned
        if start == "last":
            return max(self.next_seq - 1, self.first_seq)
        kind, value = start
        if kind == "seq":
            return int(value)
        return self.seek(int(value))

    def seek(self, when: int) -> int:
        """The first sequence number enqueued at or after `when` (ms since the epoch)."""
        return seglog.seek_time(list(self.segments), when, self.next_seq)

    def add_consumer(self, consumer: Consumer) -> None:
        start, end = parse_position(self.name, getattr(consumer, "filters", None) or {})
        first = self.position(start)
        last = (1 << 63) if end is None else self.position(end)
        if self._address_info is None:
            self._address_info = self.broker.get_address(self.address)
        reader = self._readers[consumer] = _Reader(consumer, first, last)
        self._serve(reader)

    def remove_consumer(self, consumer: Consumer) -> None:
        self._readers.pop(consumer, None)

    def dispatch(self) -> None:
        for reader in list(self._readers.values()):
            self._serve(reader)

    def _serve(self, reader: _Reader) -> None:
        """Deliver what the consumer's credit allows, reading on as needed.

        Reads run here, on the loop: a positioned read is a pread of what the page cache
        almost always holds, and a consumer's drain must see everything stored (its
        answer follows this call at once).
        """
        consumer = reader.consumer
        buffer = reader.buffer
        while True:
            if buffer:
                self._deliver(reader)
            limit = min(self.next_seq, reader.end)
            if buffer or reader.next >= limit or consumer.credit() <= 0:
                return
            records, following = seglog.read_range(self.segments, reader.next, limit, READ_AHEAD)
            reader.next = max(reader.next, following)
            if not records:
                return
            buffer.extend(records)

    def _deliver(self, reader: _Reader) -> None:
        consumer = reader.consumer
        buffer = reader.buffer
        credit = consumer.credit
        deliver = consumer.deliver
        selector = consumer.filter
        address, fmt, name = self._address_info, self._format, self.address
        browse = consumer.browse
        delivered = 0
        while buffer and credit() > 0:
            seq, _enqueued, data = buffer.popleft()
            message = Message(seq, data, name, fmt)
            if selector is not None and not selector(message):
                continue
            if not browse and address is not None:
                address.add_memory(len(data))  # given back when the consumer settles it
            deliver(MessageRef(message, self))
            delivered += 1
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
        """Write what is queued and stop the writer (broker shutdown)."""
        self.log.close()

    def close(self) -> None:
        """Deleted: its segments and cursors go with it."""
        self.log.close()
        self._closed = True
        self._on_close(self)
        shutil.rmtree(self.directory, ignore_errors=True)
