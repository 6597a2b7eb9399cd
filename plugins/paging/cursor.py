"""A queue's cursor in its address's pages: a position and counters, not a list.

The cursor reads pages off the event loop (a page window at a time), and turns into
objects only the records it hands to the queue: those routed to its queue, committed and
not yet acknowledged, while the queue has room under its read limits (Artemis's
max-read-page-* and prefetch-page-*). When every consumer with credit has a selector
that nothing in memory matches, it looks further ahead and takes only what they match,
so a restrictive selector is never starved behind messages it refuses; what it took
ahead is skipped when the cursor's position gets there.

After a restart the journal's messages are in the queue before the cursor has read any
page. Those sent after the first paged message are held back (`hold_back`) and join the
queue as the cursor's reading passes their ids: a queue comes back in send order, not
with what was in memory ahead of what was paged before it.

A queue that stores its own messages (a stream) has no cursor, except to take back what
pages still hold for it from before such queues were kept out of pages (`drain_to_queue`).
"""

from __future__ import annotations

import asyncio
import struct
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from itertools import accumulate
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.large_messages import hold_body
from scow.core.message import Message, MessageKind, PagedRef, kind_of
from scow.core.page_frames import HEADER_SIZE as FRAME_HEADER
from scow.core.page_frames import crc32, next_valid_frame, valid_length
from scow.plugins.paging import index as page_index
from scow.plugins.paging.record import (
    DURABLE,
    HEAD,
    LARGE,
    UNREADABLE,
    UNREADABLE_REST,
    head_of,
    message_data,
)
from scow.plugins.paging.selecting import RecordFilter

if TYPE_CHECKING:
    from scow.core.interfaces import Completion, Consumer, PageStore, Queue
    from scow.core.message import MessageRef
    from scow.plugins.paging.pager import AddressPager

log = structlog.get_logger("scow.paging")

#: Records a selector look-ahead examines before it lets the loop serve others.
SCAN_BATCH = 5000
#: Messages a draining cursor hands its queue at a time (while the queue stores them).
DRAIN_BATCH = 1024

#: Seconds between two warnings that a queue's reads from pages wait for settlements.
HELD_LOG_PERIOD = 60.0

#: A page frame's payload length, the first field of its header.
_FRAME_LENGTH = struct.Struct(">I")


def _covers(read: _Window | _Run, page: int, offset: int) -> bool:
    """Whether `read` holds what is at `offset` of `page`: a read cut short at a damaged
    frame holds that frame's place too (there is nothing more to read there)."""
    return (
        page == read.page
        and read.start <= offset
        and (offset < read.end or (read.cut and offset == read.end))
    )


class _Window:
    """Records of one page read from the store, from byte `start` of the page on, for
    reads that may take few of them (look-aheads, browsers, expiry): parsed by the
    reader thread (`_read_window`), made into messages on the loop as they are taken."""

    __slots__ = ("cut", "end", "page", "records", "start")

    def __init__(self, page: int, start: int, end: int, records: list[_Record]) -> None:
        self.page = page
        self.start = start
        #: The page offset just past the bytes read.
        self.end = end
        self.records = records
        #: Whether the read ended at a damaged frame, short of the page's visible end.
        self.cut = False

    def covers(self, page: int, offset: int) -> bool:
        return _covers(self, page, offset)

    def from_offset(self, offset: int) -> list[_Record]:
        """The records at and after page offset `offset`."""
        records = self.records
        return records[bisect_left(records, offset, key=_offset_of) :]


#: (page offset, offset of the next record, header, the message's bytes if routed to
#: the queue, else None)
_Record = tuple[int, int, tuple, Any]
_offset_of = itemgetter(0)
_new_message = Message.__new__
_new_ref = PagedRef.__new__


def _read_window(store: PageStore, page: int, offset: int, queue_id: int) -> _Window:
    """Read `page` from `offset` and parse its records for queue `queue_id` (runs in the
    reader thread: nothing here touches the loop's state)."""
    buf = store.read(page, offset)
    unpack = HEAD.unpack_from
    frame_length = _FRAME_LENGTH.unpack_from
    size = HEAD.size
    records: list[_Record] = []
    append = records.append
    queue_key = queue_id.to_bytes(8, "big")
    at = 0
    stop = len(buf)
    while at + FRAME_HEADER <= stop:
        pstart = at + FRAME_HEADER
        pend = pstart + frame_length(buf, at)[0]
        head = unpack(buf, pstart)
        n = head[5]
        ids_at = pstart + size
        routed = (
            buf[ids_at : ids_at + 8] == queue_key if n == 1 else queue_id in _ids(buf, ids_at, n)
        )
        append((offset + at, offset + pend, head, buf[ids_at + 8 * n : pend] if routed else None))
        at = pend
    return _Window(page, offset, offset + len(buf), records)


class _Run:
    """The records of one page routed to a cursor's queue, read from byte `start` on to
    be taken in order: each message's bytes and the few ints it needs, cut out of the
    page by the reader thread (`_read_run`), so that the loop makes a record's
    `Message` and `PagedRef` only as it hands it over (`QueueCursor._refs`), a slice
    of them at a time when nothing about them needs a look of its own (`plain`)."""

    __slots__ = (
        "cut",
        "datas",
        "end",
        "expirations",
        "ids",
        "indexed",
        "keys",
        "nexts",
        "offsets",
        "page",
        "plain",
        "priority",
        "sizes",
        "start",
        "txs",
    )

    def __init__(self, page: int, start: int, end: int) -> None:
        self.page = page
        self.start = start
        #: The page offset just past the bytes read.
        self.end = end
        # lists, not arrays: the reader appends to them for every message, and a list's
        # append costs less than an array's (they live as long as the run)
        #: The page offset of each record routed to the queue, in page order.
        self.offsets: list[int] = []
        #: The page offset just past each of them.
        self.nexts: list[int] = []
        #: Their message ids, expirations, `flags << 8 | priority` and bytes (a large
        #: message's: its record's data, which the loop makes its message of).
        self.ids: list[int] = []
        self.expirations: list[int] = []
        self.keys: list[int] = []
        self.datas: list[bytes] = []
        #: index -> transaction id of those sent in a transaction.
        self.txs: dict[int, int] = {}
        #: Bytes of the messages before each of them (one more entry: all of them).
        self.sizes = [0]
        #: No record sent in a transaction or large: the loop may hand over a slice
        #: without looking at each.
        self.plain = True
        #: The priority of every message in it, -1 if they differ (or there are none).
        self.priority = -1
        #: Whether the read ended at a damaged frame, short of the page's visible end.
        self.cut = False
        #: Read through the page's index, not by a walk of its frames.
        self.indexed = False

    def covers(self, page: int, offset: int) -> bool:
        return _covers(self, page, offset)

    def index(self, offset: int) -> int:
        """Index of the first record at or after page offset `offset`."""
        return bisect_left(self.offsets, offset)


#: A frame's length and CRC, a record's header and its first queue id: what the reader
#: needs of a record, in one unpack. A message's frame is never shorter (it is routed to
#: a queue), so a shorter frame at a page's end is a summary.
_FRAME_AND_HEAD = struct.Struct(">II" + HEAD.format.lstrip(">") + "Q")
#: Where a record's queue ids start in its frame.
_IDS_AT = FRAME_HEADER + HEAD.size


def _read_run(
    store: PageStore, page: int, offset: int, end: int, queue_id: int, index_at: int = 0
) -> _Run:
    """Read `page` from `offset` up to `end` (its visible end) and cut out the records
    routed to queue `queue_id` (runs in the reader thread: it touches nothing of the
    loop's).

    Every paged message passes through here once. A closed page's index (at page offset
    `index_at`, 0: none known) gives every record's fields a column at a time, checked by
    two CRC calls (`_indexed_run`); without one, or when it does not check out, the
    frames are walked (`_walked_run`). Nothing is made per record but its bytes and a few
    ints: its `Message` and `PagedRef` are made by the loop as it hands them over
    (`QueueCursor._refs`). The page is read with one `pread` (which lets go of the GIL
    while it copies), not mapped: a page file cut short by something else while mapped
    would kill the broker with SIGBUS."""
    read = getattr(store, "read_unchecked", store.read)
    if index_at:
        buf = read(page, 0)  # the index's CRC covers the page from its first byte
        columns = page_index.read(buf, index_at)
        if columns is not None:
            run = _indexed_run(buf, columns, page, offset, end, queue_id)
        else:
            run = _walked_run(buf, 0, page, offset, end, queue_id)
    else:
        run = _walked_run(read(page, offset), offset, page, offset, end, queue_id)
    run.sizes = list(accumulate(map(len, run.datas), initial=0))
    priorities = {key & 0xFF for key in set(run.keys)}
    if len(priorities) == 1:
        run.priority = priorities.pop()
    return run


def _walked_run(buf: bytes, base: int, page: int, offset: int, end: int, queue_id: int) -> _Run:
    """`_read_run` by a walk of the frames of `buf` (the page from byte `base` on), each
    checked as `page_frames.valid_length` would (the store's `read_unchecked` leaves
    that to this one walk), with one unpack per record: ends at the first frame that is
    torn or corrupt, as a store's `read` would."""
    view = memoryview(buf)
    run = _Run(page, offset, offset)
    add_offset = run.offsets.append
    add_next = run.nexts.append
    add_id = run.ids.append
    add_expiration = run.expirations.append
    add_key = run.keys.append
    add_data = run.datas.append
    unpack = _FRAME_AND_HEAD.unpack_from
    data_from = _IDS_AT + 8  # where the message starts in a record routed to one queue
    plain = True
    at = offset - base
    size = min(len(buf), end - base)  # bytes past the visible end are appends under way
    last = size - _FRAME_AND_HEAD.size  # the last place a message's frame can start
    try:
        while at <= last:
            length, crc, message_id, expiration, tx_id, flags, priority, n, first = unpack(buf, at)
            pend = at + FRAME_HEADER + length
            if length == 0 or pend > size or crc32(view[at + FRAME_HEADER : pend]) != crc:
                break  # zero fill, a torn append or a corrupt frame: the page ends here
            if first == queue_id and n == 1:
                data = buf[at + data_from : pend]
            elif n > 1 and queue_id in _ids(buf, at + _IDS_AT, n):
                data = buf[at + _IDS_AT + 8 * n : pend]
            else:
                at = pend
                continue
            if tx_id or flags & LARGE:
                plain = False
                if tx_id:
                    run.txs[len(run.offsets)] = tx_id
            add_offset(base + at)
            add_next(base + pend)
            add_id(message_id)
            add_expiration(expiration)
            add_key(flags << 8 | priority)
            add_data(data)
            at = pend
        # what is too short for a message (a summary) is checked as the store would
        run.end = base + valid_length(view[:size], at)
    finally:
        view.release()
    run.plain = plain
    return run


def _indexed_run(
    buf: bytes, columns: page_index.Columns, page: int, offset: int, end: int, queue_id: int
) -> _Run:
    """`_read_run` from a page's checked index (`buf`: the page from its first byte):
    the records from `offset` up to `end` routed to `queue_id`, taken a column at a time
    (when every record is routed to the same queues, with no test per record) and each
    message's bytes cut with one list comprehension. `end` is a record's end or past
    the records (a page read whole): the index's and summary's frames are then passed
    over as the walk passes over them."""
    run = _Run(page, offset, offset)
    run.indexed = True
    offsets, records_end = columns.offsets, columns.end
    first = bisect_left(offsets, offset)
    stop = bisect_left(offsets, min(end, records_end))
    # where a record's message starts past its frame's start, per route
    starts = [_IDS_AT + 8 * len(ids) for ids in columns.route_ids]
    mine = {r for r, ids in enumerate(columns.route_ids) if queue_id in ids}
    nexts = offsets[first + 1 : stop + 1]
    if stop == len(offsets) and stop > first:
        nexts.append(records_end)
    txs = columns.txs
    if len(mine) == len(starts) and len(starts) == 1:  # every record is the queue's
        picked = offsets[first:stop]
        delta = starts[0]
        run.datas = [buf[at + delta : nxt] for at, nxt in zip(picked, nexts, strict=True)]
        run.offsets, run.nexts = picked, nexts
        run.ids = columns.ids[first:stop]
        run.expirations = columns.expirations[first:stop]
        run.keys = columns.keys[first:stop]
        if txs:
            run.txs = {k - first: tx for k, tx in txs.items() if first <= k < stop}
    elif mine:
        routes = columns.routes
        chosen = [k for k in range(first, stop) if routes[k] in mine]
        run.offsets = [offsets[k] for k in chosen]
        run.nexts = [nexts[k - first] for k in chosen]
        run.datas = [buf[offsets[k] + starts[routes[k]] : nexts[k - first]] for k in chosen]
        ids, expirations, keys = columns.ids, columns.expirations, columns.keys
        run.ids = [ids[k] for k in chosen]
        run.expirations = [expirations[k] for k in chosen]
        run.keys = [keys[k] for k in chosen]
        if txs:
            run.txs = {i: txs[k] for i, k in enumerate(chosen) if k in txs}
    run.plain = not run.txs and not any(key >> 8 & LARGE for key in set(run.keys))
    if end <= records_end:
        run.end = end
    else:  # the index's and the summary's frames, checked as the walk would
        with memoryview(buf) as view:
            run.end = valid_length(view[:end], max(offset, records_end))
    return run


class QueueCursor:
    """One queue's read position in its address's pages."""

    # every queue of a paging address has one, paging or not: 1.2 KB less per queue
    # than as a dict
    __slots__ = (
        "_batch",
        "_batch_for",
        "_browsing",
        "_deliverable",
        "_fill_due",
        "_filling",
        "_held_by_unsettled",
        "_held_logged_at",
        "_kinds",
        "_next_expiry",
        "_queue_enqueue_all",
        "_reading",
        "_scan",
        "_scan_key",
        "_settled",
        "_windows",
        "acked",
        "backlog",
        "backlog_bytes",
        "closed",
        "counts",
        "drain_to_queue",
        "held",
        "indexed_reads",
        "offset",
        "page",
        "paged_priorities",
        "pager",
        "pages_skipped",
        "pending",
        "priorities_known",
        "purging",
        "queue",
        "reads",
        "reads_held_by_unsettled",
        "records",
        "taken",
    )

    def __init__(self, pager: AddressPager, queue: Queue) -> None:
        self.pager = pager
        self.queue = queue
        self._queue_enqueue_all: Callable[[list[PagedRef]], None] = getattr(
            queue, "enqueue_all", None
        ) or partial(_enqueue_each, queue)
        #: How many entries the queue would hand straight to a consumer now (optional).
        self._deliverable: Callable[[], int | None] | None = getattr(queue, "deliverable", None)
        self.page = pager.write_page
        self.offset = pager.write_offset
        #: Messages for the queue still in pages (not read into memory) and their bytes.
        self.backlog = 0
        self.backlog_bytes = 0
        #: page -> messages of that page the queue has not acknowledged (read or not).
        self.pending: dict[int, int] = {}
        #: page -> id of the journal record holding the queue's acknowledgements there.
        self.records: dict[int, int] = {}
        #: Recovered: page -> acknowledged offsets, page -> {offset: delivery count}.
        self.acked: dict[int, set[int]] = {}
        self.counts: dict[int, dict[int, int]] = {}
        #: (page, offset) of records already taken ahead of the position (by a selector
        #: look-ahead, or straight from memory by a priority queue).
        self.taken: set[tuple[int, int]] = set()
        #: Messages in the backlog per priority 0-9; unknown for a recovered backlog.
        self.paged_priorities = [0] * 10
        self.priorities_known = True
        #: While set, records with an id up to it are acknowledged as read (a purge).
        self.purging: int | None = None
        #: Recovered journal messages sent after the first paged one, in id order: each
        #: joins the queue once the cursor reads past its id (see `hold_back`).
        self.held: deque[MessageRef] = deque()
        #: Set for a queue that stores its own messages but has some in pages (written
        #: before such queues were kept out of pages): the cursor hands the queue all of
        #: them, consumers or not, DRAIN_BATCH at a time, and then has nothing to do.
        self.drain_to_queue = False
        self.closed = False
        #: Page reads from the store (a cursor that keeps up never reads), and those of
        #: them that a page's index served.
        self.reads = 0
        self.indexed_reads = 0
        #: Pages (or their unread rest) selectors passed over by the page's summary.
        self.pages_skipped = 0
        #: Times reading from pages stopped because unsettled deliveries filled the read
        #: limits while consumers waited with credit, and when that was last logged.
        self.reads_held_by_unsettled = 0
        self._held_by_unsettled = False
        self._held_logged_at = -HELD_LOG_PERIOD
        self._windows: dict[str, _Window | _Run] = {}
        #: (durable flag, priority) -> the kind of such a message of the address.
        self._kinds: dict[tuple[int, int], MessageKind] = {}
        #: The address settings `_batch` was worked out for, and (bytes, messages) of a
        #: quarter of the read limits (0: no limit).
        self._batch_for: Any = None
        self._batch = (0, 0)
        self._reading = False
        #: A fill is scheduled for the end of this loop turn; one is under way.
        self._fill_due = False
        self._filling = False
        self._scan = (self.page, self.offset)
        self._scan_key: tuple[int, ...] = ()
        #: page -> when its next message expires, as far as expire_scan has seen
        self._next_expiry: dict[int, int] = {}
        #: browser -> (page, offset) it has seen the pages up to
        self._browsing: dict[Consumer, tuple[int, int]] = {}
        #: The page of each message settled since the last loop pass (`settle`).
        self._settled: list[int] = []

    def __repr__(self) -> str:
        return f"<QueueCursor {self.queue.name!r} at {self.page}:{self.offset}, {self.backlog}>"

    # ------------------------------------------------------------------ state

    def caught_up(self, page: int, offset: int) -> bool:
        """True when nothing is left in pages for the queue; it moves to (page, offset).

        With nothing of its own left, what lies between its position and the head is for
        other queues (or refused by its filter): it need not read it.
        """
        if self.backlog:
            return False
        if (self.page, self.offset) != (page, offset):
            self.page, self.offset = page, offset
            self.taken.clear()
            self.acked.clear()
            self.counts.clear()
        return True

    @property
    def reading(self) -> bool:
        """A read of a page is under way (it hands its records over when it is done)."""
        return self._reading

    def has_room(self) -> bool:
        """The queue has consumers and its memory is under every read limit."""
        messages, size = self._allowance()
        return messages > 0 and size > 0

    def _allowance(self) -> tuple[int, int]:
        """How many more messages, and bytes, the queue may read from pages right now."""
        queue = self.queue
        if self.purging is not None:
            return 1 << 62, 1 << 62  # what it reads now is dropped, not kept
        if self.drain_to_queue:
            return DRAIN_BATCH - self._handed_over(), 1 << 62
        if not queue.consumers():
            return 0, 0
        settings = self.pager.address.settings
        memory = queue.memory_bytes
        ready = queue.ready_count()
        prefetch_bytes = settings.prefetch_page_bytes
        if settings.max_read_page_bytes < 0 and prefetch_bytes < 0:
            prefetch_bytes = settings.page_size_bytes  # never read a backlog in unbounded
        messages = size = 1 << 62
        if settings.max_read_page_bytes >= 0:
            size = settings.max_read_page_bytes - memory
        if prefetch_bytes >= 0:
            size = min(size, prefetch_bytes - (memory - queue.delivering_bytes))
        if settings.max_read_page_messages >= 0:
            messages = settings.max_read_page_messages - ready - queue.delivering
        if settings.prefetch_page_messages >= 0:
            messages = min(messages, settings.prefetch_page_messages - ready)
        return messages, size

    def _handed_over(self) -> int:
        """Messages read into the queue and not yet settled."""
        return sum(self.pending.values()) - self.backlog

    def _room_for_a_batch(self) -> bool:
        """Room for a quarter of the read limits: refilling one message per acknowledgement
        would cost a read pass per message."""
        messages, size = self._allowance()
        if size <= 0 or messages <= 0:
            return False
        settings = self.pager.address.settings
        if settings is not self._batch_for:  # asked on every fill: worked out once
            self._batch_for = settings
            self._batch = (
                _quarter(settings.max_read_page_bytes, settings.prefetch_page_bytes),
                _quarter(settings.max_read_page_messages, settings.prefetch_page_messages),
            )
        batch_bytes, batch_messages = self._batch
        return size >= batch_bytes and messages >= batch_messages

    # ------------------------------------------------------------------ reading

    def fill(self, now: bool = False) -> None:
        """Read into the queue what its read limits have room for, at the end of this
        loop turn: the queue asks on every acknowledgement, and the acknowledgements
        of one read from the socket then cost one pass, not one each. `now`: at once,
        for a consumer's new credit (a drain is answered right after: it must find
        what the credit may take already handed over)."""
        if self._filling or self.closed or not self.backlog:
            return  # what it hands the queue asks to fill again: no need while it fills
        if now:
            self._fill_now()
        elif not self._fill_due:
            self._fill_due = True
            self.pager.manager.loop.call_soon(self._fill_due_now)

    def _fill_due_now(self) -> None:
        self._fill_due = False
        self._fill_now()

    def _fill_now(self) -> None:
        # not skipped while a read is on its way: that may be the next page's, read ahead
        if self._filling or self.closed or not self.backlog:
            return
        self._filling = True
        try:
            self._fill()
            if not self.backlog:
                # the last of it is handed over: the address may leave page mode now,
                # not at the next acknowledgement (the consumer may hold back its last)
                self.pager.check_now()
        finally:
            self._filling = False

    def _fill(self) -> None:
        if self._waits_for_credit():
            return  # asked on every acknowledgement: the common answer, found first
        pager = self.pager
        if self.queue.ready_count() and not self._room_for_a_batch():
            self._scan_ahead()  # selectors refusing what is ready still look further on
            return  # the others have messages ready: refill once a batch fits
        while self.backlog:
            if not self.has_room():
                self._note_held_by_unsettled()
                self._scan_ahead()
                return
            self._held_by_unsettled = False
            page, offset = self.page, self.offset
            end = pager.visible_end(page)
            if offset >= end:
                if not self._page_done(page, offset):
                    return  # waiting for writes to become visible
                self._next_page()
                continue
            if self._selected_out(page):
                self._scan_ahead()  # what they match lies further on, if anywhere
                return
            run = self._run(page, offset)
            if run is None:
                return  # a read is on its way; it calls fill again
            if run.end == offset:  # visible bytes, but no valid frame at the position
                self.offset = self._past_damage(page, offset, end)
                continue
            if not self._take(run, end):
                return  # its consumer took what its credit allows: more once it has credit

    def _note_held_by_unsettled(self) -> None:
        """Reading stopped with nothing ready and consumers waiting with credit: what they
        hold unsettled fills the read limits (which count it, as Artemis's do). Logged
        (at most every HELD_LOG_PERIOD s), as Artemis does since ARTEMIS-4362: otherwise
        the broker just seems stuck."""
        queue = self.queue
        if (
            self._held_by_unsettled
            or queue.ready_count()
            or not any(c.credit() > 0 for c in queue.consumers())
        ):
            return
        self._held_by_unsettled = True
        self.reads_held_by_unsettled += 1
        now = time.monotonic()
        if now - self._held_logged_at < HELD_LOG_PERIOD:
            return
        self._held_logged_at = now
        settings = self.pager.address.settings
        log.warning(
            "reading from pages waits for consumers to settle: the messages delivered and "
            "not yet settled fill the address's read limits; settle (acknowledge) sooner, "
            "give consumers less credit, or raise max-read-page-bytes/-messages",
            address=self.pager.address.name,
            queue=queue.name,
            unsettled=queue.delivering,
            unsettled_bytes=queue.delivering_bytes,
            max_read_page_bytes=settings.max_read_page_bytes,
            max_read_page_messages=settings.max_read_page_messages,
            messages_paged=self.backlog,
            times=self.reads_held_by_unsettled,
        )

    def _waits_for_credit(self) -> bool:
        """True when the queue would hand what it is given straight to its consumer,
        whose credit is spent, and the page at the position is read already: nothing
        to do until credit comes (the queue's dispatch asks then)."""
        deliverable = self._deliverable
        if deliverable is None or self.purging is not None or self.drain_to_queue:
            return False
        run = self._windows.get("main")
        return run is not None and run.covers(self.page, self.offset) and deliverable() == 0

    def _past_damage(self, page: int, offset: int, end: int) -> int:
        """Where to read on from a frame damaged on disk after it was written: its page's
        next valid frame (`page_frames.next_valid_frame`), else the end of what is
        visible of the page (read again, the frame would stop the reader there for
        good). Recovery notes the frames damaged before the start (`PageInfo.damaged`);
        others are found and logged by the first reader (a cursor's position, a browser,
        a look-ahead, of any of the address's queues) to meet them: a read of the page on
        the loop, as rare as bit rot."""
        info = self.pager.pages.get(page)
        damaged = info.damaged if info is not None else {}
        resume = damaged.get(offset)
        if resume is None:
            read = getattr(self.pager.store, "read_unchecked", None)  # `read` stops here
            found = None if read is None else next_valid_frame(read(page, offset), 0)
            resume = end if found is None or offset + found > end else offset + found
            damaged[offset] = resume
            log.error(
                UNREADABLE if resume < end else UNREADABLE_REST,
                address=self.pager.address.name,
                queue=self.queue.name,
                page=page,
                offset=offset,
                bytes_lost=resume - offset,
            )
        return resume

    def _selected_out(self, page: int) -> bool:
        """True when every consumer with credit has a selector and the page's summary
        proves none of them matches in it: read into memory, it would only fill memory."""
        if self.purging is not None or self.drain_to_queue:
            return False
        ready = [c for c in self.queue.consumers() if c.credit() > 0]
        if not _selective(ready):
            return False
        info = self.pager.pages.get(page)
        if info is None or not self._record_filter(ready).skips(info.summary):
            return False
        return self._wanted() is None

    def _page_done(self, page: int, offset: int) -> bool:
        info = self.pager.pages.get(page)
        return page < self.pager.write_page and (info is None or offset >= info.size)

    def _next_page(self) -> None:
        self.acked.pop(self.page, None)
        self.counts.pop(self.page, None)
        self.page, self.offset = self._following(self.page), 0

    def _readable(self, page: int, offset: int) -> tuple[int, int, int] | None:
        """(page, offset, visible end) of the next bytes to read from (page, offset) on,
        past finished pages; None while they are still being written."""
        while True:
            end = self.pager.visible_end(page)
            if offset < end:
                return page, offset, end
            if not self._page_done(page, offset):
                return None
            page, offset = self._following(page), 0

    def _following(self, page: int) -> int:
        """The next page still stored after `page` (or the head page)."""
        pager = self.pager
        page += 1
        while page < pager.write_page and page not in pager.pages:
            page += 1
        return page

    def _window(self, slot: str, page: int, offset: int) -> _Window | None:
        """The records of `page` from `offset`, or None while they are being read."""
        return self._read(slot, page, offset, _read_window, self.queue.id)

    def _run(self, page: int, offset: int) -> _Run | None:
        """The records to take in order from `offset` of `page`, or None while they are
        being read. The next finished page is read meanwhile (`ahead`), so a drain
        does not wait for the reader at each page's end."""
        windows = self._windows
        ahead = windows.get("ahead")
        if ahead is not None and ahead.covers(page, offset):
            windows["main"] = windows.pop("ahead")
        pager = self.pager
        info = pager.pages.get(page)
        run = self._read(
            "main",
            page,
            offset,
            _read_run,
            pager.visible_end(page),
            self.queue.id,
            info.index_at if info is not None else 0,
        )
        if run is not None and not self._reading:
            following = self._following(page)
            info = pager.pages.get(following)
            # a page written in full: read once, not again each time it grew
            if following < pager.write_page and info is not None and info.visible >= info.size:
                self._read(
                    "ahead", following, 0, _read_run, info.visible, self.queue.id, info.index_at
                )
        return run

    def _read(
        self, slot: str, page: int, offset: int, reader: Callable[..., Any], *args: Any
    ) -> Any:
        """What `reader` made of `page` from `offset` for `slot` (kept until the slot
        reads elsewhere), or None while it is being read."""
        window = self._windows.get(slot)
        end = self.pager.visible_end(page)
        if (
            window is not None
            and window.covers(page, offset)
            and (window.end >= end or self._reading or window.cut)
        ):
            return window  # while another read is on its way, take what this one has
        if self._reading:
            return None
        self._reading = True
        self.reads += 1

        def done(window: _Window | _Run) -> None:
            self._reading = False
            if isinstance(window, _Run) and window.indexed:
                self.indexed_reads += 1
            # the visible bytes are whole frames: a read that ends short met a damaged one
            window.cut = window.end < end
            if not self.closed:
                self._windows[slot] = window
                if self.purging is not None or self.drain_to_queue:
                    self.fill()  # reads on whether or not anyone consumes
                else:
                    self.queue.dispatch()  # fills consumers and browsers, whoever asked

        self.pager.manager.read(reader, (self.pager.store, page, offset, *args), done)
        return None

    def _records(
        self, window: _Window, page: int, offset: int, end: int, keep_taken: bool = False
    ) -> Iterator[_Record]:
        """(offset, next offset, header, payload) of the records from `offset` up to
        `end`; the payload is None for those the queue must not take (routed elsewhere,
        uncommitted, acknowledged, taken ahead, or not durable on a recovered page)."""
        committed = self.pager.committed_txs
        acked = self.acked.get(page)
        taken = self.taken
        recovered = page < self.pager.first_page  # written before this start: durable only
        for record in window.from_offset(offset):
            at, _next, head, payload = record
            if at >= end:
                return
            if payload is None:
                yield record
                continue
            skip = (
                (head[2] and head[2] not in committed)
                or (recovered and not head[3] & 1)
                or (acked is not None and at in acked)
            )
            if not skip and taken and (page, at) in taken:
                if not keep_taken:
                    taken.discard((page, at))
                skip = True
            yield (at, _next, head, None) if skip else record

    def _take(self, run: _Run, end: int) -> bool:
        """Hand the queue the records of `run` from the position up to page offset `end`,
        in order, while its read limits allow and, for a queue that would hand them
        straight to its consumer, its consumer's credit (`_room`). Returns False when
        that credit stopped it short of `end`.

        A drain from pages runs every message through here. While nothing about the
        records needs a look of its own they go as slices of the run (`_take_slices`);
        otherwise one by one (`_take_each`)."""
        first = run.index(self.offset)
        stop = run.index(end)
        if self._plain(run):
            reached, short = self._take_slices(run, first, stop)
        else:
            reached, short = self._take_each(run, first, stop)
        if reached == stop and self.backlog:
            # what follows up to `end` is for other queues (or a summary): passed over
            self.offset = max(self.offset, min(end, run.end))
        return not short

    def _room(self) -> tuple[int, int]:
        """(messages, bytes) the queue may be handed now: its read limits' allowance,
        and no more than its one consumer's credit while it would hand them straight on
        (`deliverable`): the `PagedRef`s a drain hands over are then made just before
        they are sent, not a page ahead of it, and wait in the run, not as objects."""
        messages, size = self._allowance()
        deliverable = self._deliverable
        if deliverable is not None and self.purging is None and not self.drain_to_queue:
            direct = deliverable()
            if direct is not None and direct < messages:
                return direct, size
        return messages, size

    def _plain(self, run: _Run) -> bool:
        """True when the queue may take `run`'s records as they are: none in a
        transaction or large, none acknowledged or with a delivery count before a
        restart, none taken ahead, no journal message held back, no purge, and the
        backlog's priorities counted by one priority for all."""
        page = self.page
        return (
            run.plain
            and not self.taken
            and not self.held
            and self.purging is None
            and page >= self.pager.first_page
            and page not in self.acked
            and page not in self.counts
            and (run.priority >= 0 or not self.priorities_known)
        )

    def _take_slices(self, run: _Run, i: int, stop: int) -> tuple[int, bool]:
        """`_take` for a plain run: each slice of records `_room` allows is counted from
        the run's running sizes and enqueued whole. Returns the index of the first
        record not taken, and whether the consumer's credit stopped it (the read
        limits had room for more)."""
        sizes, nexts = run.sizes, run.nexts
        priority = min(run.priority, 9)
        messages = size = 0  # asked for below
        while i < stop and self.backlog:
            if messages <= 0 or size <= 0:
                messages, size = self._room()
                if messages <= 0 or size <= 0:
                    return i, self.has_room()
            # every record whose bytes before it in the slice are under `size`
            j = bisect_left(sizes, sizes[i] + size, i, min(stop, i + messages, i + self.backlog))
            count, length = j - i, sizes[j] - sizes[i]
            self.offset = nexts[j - 1]
            self.backlog -= count
            self.backlog_bytes -= length
            if self.priorities_known:
                self.paged_priorities[priority] -= count
            elif not self.backlog:
                self.priorities_known = True  # the recovered backlog is read: counts from now
            self.pager.address.add_memory(length, count)
            self._queue_enqueue_all(self._refs(run, i, j))
            messages -= count
            size -= length
            i = j
        return i, False

    def _refs(self, run: _Run, i: int, j: int) -> list[PagedRef]:
        """The references of `run`'s records i to j (plain ones), made as their
        `__init__`s would: a drain makes one of each per message."""
        offsets, ids, expirations, keys, datas = (
            run.offsets,
            run.ids,
            run.expirations,
            run.keys,
            run.datas,
        )
        new, new_ref = _new_message, _new_ref
        queue, page = self.queue, run.page
        seen = -1  # flags << 8 | priority of the last message, whose kind is `kind`
        kind: MessageKind | None = None
        refs: list[PagedRef] = []
        add = refs.append
        for k in range(i, j):
            key = keys[k]
            if key != seen:
                seen = key
                kind = self._kind(key >> 8, key & 0xFF)
            message = new(Message)
            message.id = ids[k]
            message.data = datas[k]
            message.kind = kind
            message.expiration = expirations[k]
            ref = new_ref(PagedRef)
            ref.message = message
            ref.queue = queue
            ref.cursor = self
            ref.page = page
            ref.offset = offsets[k]
            ref.delivery_count = 0
            ref.consumer = None
            add(ref)
        return refs

    def _take_each(self, run: _Run, i: int, stop: int) -> tuple[int, bool]:
        """`_take` one record at a time, those the queue must not take left out;
        enqueued in batches all the same. Returns the index of the first record not
        looked at, and whether the consumer's credit stopped it."""
        page = self.page
        committed = self.pager.committed_txs
        acked = self.acked.get(page)
        taken = self.taken
        counts = self.counts.get(page)
        recovered = page < self.pager.first_page  # written before this start: durable only
        held = self.held
        offsets, nexts, ids, keys, datas = run.offsets, run.nexts, run.ids, run.keys, run.datas
        expirations, txs = run.expirations, run.txs
        batch: list[PagedRef] = []
        batch_bytes = 0
        messages, size = self._room()  # counted down, asked again only when spent
        if messages <= 0 or size <= 0:
            return i, self.has_room()
        while i < stop:
            at, message_id, key = offsets[i], ids[i], keys[i]
            tx_id = txs.get(i, 0)
            self.offset = nexts[i]
            i += 1
            if tx_id and tx_id not in committed:
                continue
            if (recovered and not key >> 8 & DURABLE) or (acked is not None and at in acked):
                continue
            if taken and (page, at) in taken:
                taken.discard((page, at))
                continue
            if held and held[0].message.id < message_id:
                batch_bytes = self._enqueue_all(batch, batch_bytes)
                self._release_held(message_id)
            head = (message_id, expirations[i - 1], tx_id, key >> 8, key & 0xFF, 0)
            message = self._message(head, datas[i - 1])
            if key >> 8 & LARGE:
                hold_body(message.data)
            ref = PagedRef(message, self.queue, self, page, at, counts.get(at, 0) if counts else 0)
            length = len(message.data)
            self.backlog -= 1
            self.backlog_bytes -= length
            if self.priorities_known:
                self.paged_priorities[_priority(message)] -= 1
            elif not self.backlog:
                self.priorities_known = True  # the recovered backlog is read: counts from now
            if self.purging is not None:
                batch_bytes = self._enqueue_all(batch, batch_bytes)
                self._purged(ref)
            else:
                batch.append(ref)
                batch_bytes += length
            if not self.backlog:
                break
            messages -= 1
            size -= length
            if messages <= 0 or size <= 0:
                batch_bytes = self._enqueue_all(batch, batch_bytes)
                messages, size = self._room()
                if messages <= 0 or size <= 0:
                    return i, self.has_room()
        self._enqueue_all(batch, batch_bytes)
        if held and not self.backlog:
            self._release_held(None)  # nothing in pages precedes them any more
        return i, False

    def _enqueue_all(self, batch: list[PagedRef], size: int) -> int:
        """Count `batch` (of `size` bytes) in the address's memory and enqueue it; empties
        it and returns 0, its new size."""
        if batch:
            self.pager.address.add_memory(size, len(batch))
            self._queue_enqueue_all(batch)
            batch.clear()
        return 0

    def _purged(self, ref: PagedRef) -> None:
        """A message read while a purge runs: acknowledged without entering the queue if
        the purge covers it (it counts in memory until the acknowledgement)."""
        message = ref.message
        self.pager.address.add_memory(len(message.data))
        if message.id <= self.purging:  # type: ignore[operator]
            if not self.backlog:
                self.purging = None
            self.pager.broker.discard(ref)
            return
        self.purging = None
        self.queue.enqueue(ref)

    def _deliver(self, page: int, at: int, head: tuple, data: bytes) -> None:
        self._deliver_message(page, at, self._message(head, data))

    def _message(self, head: tuple, data: bytes) -> Message:
        """The message of a record (on the loop, as `_refs` makes a plain run's)."""
        message_id, expiration, _tx, flags, priority, _n = head
        if flags & LARGE:
            data = message_data(flags, data, self.pager.broker.large_messages)
        message = _new_message(Message)
        message.id = message_id
        message.data = data
        message.kind = self._kind(flags, priority)
        message.expiration = expiration
        return message

    def _kind(self, flags: int, priority: int) -> MessageKind:
        """The kind of the address's messages with a record's flags and priority."""
        key = (flags & DURABLE, priority)
        kind = self._kinds.get(key)
        if kind is None:
            kind = self._kinds[key] = kind_of(
                self.pager.address.name,
                self.pager.manager.message_format(),
                bool(flags & DURABLE),
                priority,
            )
        return kind

    def _scan_ahead(self) -> None:
        """Take from further on what must not wait for the cursor's position: what
        consumers whose selectors refuse everything in memory match, and what the queue
        wants first (a priority above everything waiting; taken even without credit,
        one level at a time, so memory grows by a handful of messages at most)."""
        consumers = self.queue.consumers()
        if not consumers or self.drain_to_queue:
            return
        wanted = self._wanted()
        ready = [c for c in consumers if c.credit() > 0]
        if wanted is None and not _selective(ready):
            return
        key = tuple(id(c) for c in consumers)
        if key != self._scan_key:  # new selectors: look again from the position
            self._scan_key = key
            self._scan = (self.page, self.offset)
        page, offset = max(self._scan, (self.page, self.offset))
        budget = SCAN_BATCH
        selecting = self._record_filter(ready) if wanted is None else None
        try:
            while wanted is not None or ready:
                readable = self._readable(page, offset)
                if readable is None:
                    return
                page, offset, end = readable
                if selecting is not None and self._skips(selecting, page):
                    offset = end
                    continue
                window = self._window("scan", page, offset)
                if window is None:
                    return
                for at, next_offset, head, data in self._records(window, page, offset, end):
                    offset = next_offset
                    budget -= 1
                    # a record no selector accepts by its bytes never becomes a Message
                    if (
                        data is not None
                        and (
                            selecting is None
                            or selecting.accepts(head_of(head[3], data)) is not False
                        )
                        and self._scan_take(page, at, head, data, wanted, consumers, ready)
                    ):
                        wanted = self._wanted()
                        ready = [c for c in ready if c.credit() > 0]
                        if wanted is None and not _selective(ready):
                            return
                        selecting = self._record_filter(ready) if wanted is None else None
                    if budget <= 0:
                        asyncio.get_running_loop().call_soon(self.fill)
                        return
                if window.cut and offset >= window.end:
                    offset = self._past_damage(page, offset, end)
        finally:
            self._scan = (page, offset)

    def _scan_take(
        self,
        page: int,
        at: int,
        head: tuple,
        data: bytes,
        wanted: Callable[[Message], bool] | None,
        consumers: list[Consumer],
        ready: list[Consumer],
    ) -> bool:
        """Take the record ahead of the position if the queue wants it first or a
        consumer with credit selects it; True when taken."""
        message = self._message(head, data)
        if wanted is not None:
            takes = wanted(message) and any(
                c.filter is None or c.filter(message) for c in consumers
            )
        else:
            takes = any(c.filter(message) for c in ready)  # type: ignore[misc]
        if takes:
            self.taken.add((page, at))
            self._deliver_message(page, at, message)
        return takes

    def _record_filter(self, consumers: list[Consumer]) -> RecordFilter:
        return RecordFilter([c.filter for c in consumers], self.pager.manager.properties)

    def _skips(self, selecting: RecordFilter, page: int) -> bool:
        """True (and counted) when the page's summary proves no selector matches in it."""
        info = self.pager.pages.get(page)
        if info is None or not selecting.skips(info.summary):
            return False
        self.pages_skipped += 1
        return True

    def _wanted(self) -> Callable[[Message], bool] | None:
        """What the queue wants ahead of the position, while it may hold up to its read
        limits again in messages taken ahead."""
        wanted = self.queue.wanted_from_pages(self.highest_paged_priority())
        if wanted is None:
            return None  # first: asked on every fill, and nearly always None
        settings = self.pager.address.settings
        messages, size = self._allowance()
        if (0 < settings.max_read_page_bytes <= -size) or (
            0 < settings.max_read_page_messages <= -messages
        ):
            return None
        return wanted

    def note_paged(self, message: Message) -> None:
        """One more message for the queue waits in pages."""
        self.backlog += 1
        self.backlog_bytes += len(message.data)
        self.paged_priorities[_priority(message)] += 1

    def highest_paged_priority(self) -> int:
        """The highest priority of a message in the backlog (9 when not known), -1 if none."""
        if not self.priorities_known:
            return 9
        counts = self.paged_priorities
        return next((p for p in range(9, -1, -1) if counts[p]), -1)

    def purge(self, up_to: int) -> None:
        held = self.held
        while held and held[0].message.id <= up_to:
            self.pager.broker.discard(held.popleft())
        if self.backlog:
            self.purging = up_to
            self.fill()

    def _deliver_message(self, page: int, at: int, message: Message) -> None:
        """Hand the queue one record taken out of order (ahead of the position, or
        expired)."""
        ref = self._out_of_pages(page, at, message)
        if self.purging is not None:
            self._purged(ref)
        else:
            self.pager.address.add_memory(len(message.data))
            self.queue.enqueue(ref)
        if self.held and not self.backlog:
            self._release_held(None)  # nothing in pages precedes them any more

    def _out_of_pages(self, page: int, at: int, message: Message) -> PagedRef:
        """The ref of a record taken out of order, no longer counted in the backlog."""
        counts = self.counts.get(page)
        ref = PagedRef(message, self.queue, self, page, at, counts.get(at, 0) if counts else 0)
        self.backlog -= 1
        self.backlog_bytes -= len(message.data)
        if self.priorities_known:
            self.paged_priorities[_priority(message)] -= 1
        elif not self.backlog:
            self.priorities_known = True  # the recovered backlog is read: counts from now
        hold_body(message.data)
        return ref

    # ------------------------------------------------------------------ management

    async def paged(self, up_to: int) -> AsyncIterator[tuple[int, int, Message]]:
        """(page, offset, message) of the queue's messages in pages past the position, in
        order, up to message id `up_to`: for management (browse, move), which must see
        what no consumer made the cursor read. Each page window is read in the reader
        thread; nothing enters the queue. The cursor reads on meanwhile: what it passes
        between two windows is in the queue by then, and `take_paged` refuses it."""
        page, offset = self.page, self.offset
        while not self.closed:
            page, offset = max((page, offset), (self.page, self.offset))
            readable = self._readable(page, offset)
            if readable is None:
                return
            page, offset, end = readable
            window = await asyncio.wrap_future(
                self.pager.manager.reader.submit(
                    _read_window, self.pager.store, page, offset, self.queue.id
                )
            )
            window.cut = window.end < end
            for at, next_offset, head, data in self._records(
                window, page, offset, end, keep_taken=True
            ):
                offset = next_offset
                if data is None:
                    continue
                if head[0] > up_to:
                    return
                yield page, at, self._message(head, data)
            if window.cut and offset >= window.end:
                offset = self._past_damage(page, offset, end)

    def take_paged(self, page: int, at: int, message: Message) -> PagedRef | None:
        """Take a message `paged` found out of the pages for good, as if delivered (its
        memory counted until `broker.discard` acknowledges it); None when the cursor
        took it meanwhile (it is in the queue)."""
        if (page, at) < (self.page, self.offset) or (page, at) in self.taken:
            return None
        acked = self.acked.get(page)
        if acked is not None and at in acked:
            return None
        self.taken.add((page, at))
        ref = self._out_of_pages(page, at, message)
        self.pager.address.add_memory(len(message.data))
        return ref

    def take_held(self, chosen: Callable[[MessageRef], bool]) -> list[MessageRef]:
        """Take the journal's messages held back at recovery (`hold_back`) that `chosen`
        accepts: they are in neither the queue nor the pages until the cursor passes."""
        taken: list[MessageRef] = []
        kept: deque[MessageRef] = deque()
        for ref in self.held:
            (taken if chosen(ref) else kept).append(ref)
        self.held = kept
        return taken

    def hold_back(self, first_paged: int) -> None:
        """At recovery: take out of the queue the journal's messages sent after
        `first_paged` (the id of the queue's first paged message); they join it again as
        the cursor reads past them."""
        queue = self.queue
        refs = queue.take(lambda entry: entry.message.id > first_paged)
        for ref in refs:
            queue.remove_delivering(ref)  # out of the queue's figures until it rejoins
        refs.sort(key=lambda ref: ref.message.id)  # once, at startup
        self.held.extend(refs)

    def _release_held(self, before: int | None) -> None:
        """Enqueue the held messages with an id below `before` (all of them if None)."""
        held = self.held
        queue = self.queue
        while held and (before is None or held[0].message.id < before):
            queue.enqueue(held.popleft())

    # ------------------------------------------------------------------ browsers

    def browse(self, browser: Consumer) -> None:
        """Show a browser paged messages from past the cursor (or where it stopped)."""
        if self._reading or self.closed:
            return
        page, offset = max(self._browsing.get(browser, (0, 0)), (self.page, self.offset))
        slot = f"browse-{id(browser)}"
        selecting = self._record_filter([browser]) if browser.filter is not None else None
        try:
            while browser.credit() > 0:
                readable = self._readable(page, offset)
                if readable is None:
                    return
                page, offset, end = readable
                if selecting is not None and self._skips(selecting, page):
                    offset = end
                    continue
                window = self._window(slot, page, offset)
                if window is None:
                    return
                for at, next_offset, head, data in self._records(
                    window, page, offset, end, keep_taken=True
                ):
                    offset = next_offset
                    if data is None:
                        continue
                    if selecting is not None and selecting.accepts(head_of(head[3], data)) is False:
                        continue
                    message = self._message(head, data)
                    if browser.filter is None or browser.filter(message):
                        browser.deliver(PagedRef(message, self.queue, self, page, at))
                        if browser.credit() <= 0:
                            return
                if window.cut and offset >= window.end:
                    offset = self._past_damage(page, offset, end)
        finally:
            self._browsing[browser] = (page, offset)

    def browsed(self, browser: Consumer, ref: MessageRef) -> bool:
        if ref.__class__ is not PagedRef:
            return False
        seen = self._browsing.get(browser)
        return seen is not None and (ref.page, ref.offset) < seen  # type: ignore[attr-defined]

    def forget(self, consumer: Consumer) -> None:
        self._browsing.pop(consumer, None)
        self._windows.pop(f"browse-{id(consumer)}", None)

    # ------------------------------------------------------------------ expiry

    def expire_scan(self, now: int) -> None:
        """Take expired messages out of pages that hold some, into the queue.

        Only pages whose earliest expiration has passed are read, and each at most once
        until its next expiration is due; the queue's expiry then moves what was taken.
        """
        if self._reading or self.closed:
            return
        pager = self.pager
        for page in sorted(p for p in self.pending if p >= self.page):
            info = pager.pages.get(page)
            if info is None or not 0 < info.expires <= now:
                continue
            if self._next_expiry.get(page, 0) > now:
                continue
            offset = self.offset if page == self.page else 0
            window = self._window("expiry", page, offset)
            if window is None:
                return  # read on its way; the next scan goes on
            upcoming = 0
            for at, _next, head, data in self._records(
                window, page, offset, pager.visible_end(page), keep_taken=True
            ):
                expiration = head[1]
                if data is None or not expiration or (page, at) in self.taken:
                    continue
                if expiration <= now:
                    self.taken.add((page, at))
                    self._deliver(page, at, head, data)
                elif not upcoming or expiration < upcoming:
                    upcoming = expiration
            self._next_expiry[page] = upcoming or 1 << 62

    # ------------------------------------------------------------------ outcomes

    def _record_id(self, page: int) -> int:
        record_id = self.records.get(page)
        if record_id is None:
            broker = self.pager.broker
            record_id = self.records[page] = broker.next_id()
            broker.storage.store_cursor_page(record_id, self.queue.id, page)
        return record_id

    def _journaled(self, ref: PagedRef) -> bool:
        # the kind, not the `durable` property: asked on every acknowledgement
        return ref.message.kind.durable and self.queue.durable and self.pager.broker.persistent

    def journal_ack(self, ref: PagedRef, tx_id: int | None) -> bool:  # type: ignore[override]
        if self.closed or not self._journaled(ref):
            return False
        record_id = self.records.get(ref.page) or self._record_id(ref.page)
        self.pager.broker.storage.cursor_ack(record_id, ref.offset, tx_id=tx_id)
        return True

    def settle(self, ref: PagedRef) -> None:  # type: ignore[override]
        """Noted now, counted once per loop pass (`_settle_noted`): a consumer's
        acknowledgements come a socket read's worth at a time, and a page is only
        deleted once all of its are in."""
        settled = self._settled
        if not settled:
            self.pager.manager.loop.call_soon(self._settle_noted)
        settled.append(ref.page)

    def _settle_noted(self) -> None:
        """Count down the pages of the messages settled since the last pass; delete
        those no one holds any more."""
        pages, self._settled = self._settled, []
        if self.closed:
            return
        pending = self.pending
        for page, count in Counter(pages).items():
            left = pending.get(page, 0) - count
            if left > 0:
                pending[page] = left
            else:
                pending.pop(page, None)
                self.pager.settled(page)
        if self.drain_to_queue and self.backlog and self._handed_over() <= DRAIN_BATCH // 2:
            self.fill()  # the queue stored half of what it was handed: the next batch

    def store_delivery_count(self, ref: PagedRef, on_done: Completion) -> bool:  # type: ignore[override]
        if self.closed or not self._journaled(ref):
            return False
        storage = self.pager.broker.storage
        storage.cursor_delivery_count(
            self._record_id(ref.page), ref.offset, ref.delivery_count, on_done
        )
        return True

    def close(self) -> None:
        """The queue is gone: drop its records and what it held of every page."""
        self._release_held(None)  # the queue's deletion takes them with the rest
        self.closed = True
        storage = self.pager.broker.storage
        if self.pager.broker.persistent:
            for record_id in self.records.values():
                storage.delete_record(record_id)
        self.records.clear()
        self.pending.clear()
        self._windows.clear()
        self.backlog = self.backlog_bytes = 0

    def stats(self) -> dict[str, Any]:
        return {
            "page": self.page,
            "offset": self.offset,
            "messages-paged": self.backlog,
            "paged-bytes": self.backlog_bytes,
            "messages-held": len(self.held),
            "pages-pending": len(self.pending),
            "page-reads": self.reads,
            "page-reads-indexed": self.indexed_reads,
            "pages-skipped": self.pages_skipped,
            "reads-held-by-unsettled": self.reads_held_by_unsettled,
        }


def _enqueue_each(queue: Queue, refs: list[PagedRef]) -> None:
    """`Queue.enqueue_all` for a queue type without it."""
    for ref in refs:
        queue.enqueue(ref)


def _quarter(*limits: int) -> int:
    """A quarter of the smallest limit set (> 0); 0 when none is."""
    return min((limit for limit in limits if limit > 0), default=0) // 4


def _selective(consumers: list[Consumer]) -> bool:
    """Consumers (with credit) that all have selectors: a look-ahead may serve them."""
    return bool(consumers) and all(c.filter is not None for c in consumers)


def _priority(message: Message) -> int:
    return min(max(message.priority, 0), 9)


def _ids(buf: bytes, at: int, n: int) -> tuple[int, ...]:
    return struct.unpack_from(f">{n}Q", buf, at)
