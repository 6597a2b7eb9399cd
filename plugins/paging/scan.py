"""Reading whole page stores off-line: what recovery, `scow data` and export need.

`durable_records` walks an address's pages and yields the durable, committed messages
with the queues that have not acknowledged them; nothing else of a page is kept.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from scow.core.interfaces import PageStore
from scow.core.page_frames import HEADER_SIZE as FRAME_HEADER
from scow.core.page_frames import iter_frames, salvaged_frames
from scow.plugins.paging import index as page_index
from scow.plugins.paging.pager import PageInfo
from scow.plugins.paging.record import (
    DURABLE,
    HEAD,
    INDEX,
    LARGE,
    LARGE_REF_SIZE,
    SUMMARY,
    UNREADABLE,
    UNREADABLE_REST,
    head_of,
    large_ref,
)
from scow.plugins.paging.summary import PageSummary

log = structlog.get_logger("scow.paging")


@dataclass(slots=True)
class PagedRecord:
    page: int
    offset: int
    message_id: int
    expiration: int
    priority: int
    #: The routed queues (of those asked for) that still hold it.
    queue_ids: list[int]
    #: The message's bytes; a large message's head.
    data: memoryview
    #: A large message's (file id, head size, length); None for others.
    large: tuple[int, int, int] | None = None


def durable_records(
    store: PageStore,
    queue_ids: set[int],
    acked: Mapping[tuple[int, int], set[int]],
    committed: set[int],
    pages: dict[int, PageInfo] | None = None,
    properties: Callable[[bytes], Mapping[str, object]] | None = None,
) -> Iterator[PagedRecord]:
    """Durable committed records routed to any of `queue_ids` and not acknowledged there.

    `acked` maps (queue id, page) to acknowledged offsets; when `pages` is given, it is
    filled with each page's record count, size, transactions and summary: the one stored
    in the page, else one rebuilt from its durable messages with `properties` (the
    message format's), else none. A page's index (`scow.plugins.paging.index`) is passed
    over as the summary is; where it is goes in `pages` too, for the cursors.
    """
    # the bytes as stored, so that the records after a damaged frame are found
    read = getattr(store, "read_unchecked", store.read)
    for page in store.page_numbers():
        yield from _page_records(
            store, page, memoryview(read(page)), queue_ids, acked, committed, pages, properties
        )


def durable_counts(
    store: PageStore,
    queue_ids: set[int],
    acked: Mapping[tuple[int, int], set[int]],
    committed: set[int],
    pages: dict[int, PageInfo],
    properties: Callable[[bytes], Mapping[str, object]] | None = None,
) -> tuple[dict[int, list[Any]], list[tuple[int, int, int]]]:
    """What `durable_records` yields, counted: per queue [messages, bytes of them, {page:
    messages}, lowest message id], and each large message's (file id, head size, length).

    What a restart reads of every page. A closed page whose index checks out is counted
    from the index's columns, with no Python per record where the page holds the common
    case (every record durable, outside transactions, routed to the same queues); other
    pages are walked frame by frame. `pages` is filled as `durable_records` fills it."""
    queues = new_counts()
    large: list[tuple[int, int, int]] = []
    read = getattr(store, "read_unchecked", store.read)
    for page in store.page_numbers():
        buf = read(page)
        indexed = _indexed(buf)
        if indexed is not None:
            pages[page] = _count_indexed(
                page, buf, *indexed, queue_ids, acked, committed, queues, large
            )
            continue
        records = _page_records(
            store, page, memoryview(buf), queue_ids, acked, committed, pages, properties
        )
        add_counts(records, queues, large)
    return dict(queues), large


def new_counts() -> defaultdict[int, list[Any]]:
    """Per queue id: [messages, bytes of them, {page: messages}, lowest message id]."""
    return defaultdict(lambda: [0, 0, {}, 0])


def add_counts(
    records: Iterable[PagedRecord],
    queues: defaultdict[int, list[Any]],
    large: list[tuple[int, int, int]],
) -> None:
    """Count `records` in `queues` (`new_counts`), and note their large messages."""
    for rec in records:
        if rec.large is not None:
            large.append(rec.large)
        for queue_id in rec.queue_ids:
            _count(queues[queue_id], rec.page, 1, len(rec.data), rec.message_id)


def _count(figures: list[Any], page: int, messages: int, size: int, lowest: int) -> None:
    if not figures[0] or lowest < figures[3]:
        figures[3] = lowest
    figures[0] += messages
    figures[1] += size
    figures[2][page] = figures[2].get(page, 0) + messages


#: How an index record's payload starts: its head (flag INDEX, routed nowhere), then the
#: index's version; `_indexed` looks for it from the page's end.
_INDEX_START = HEAD.pack(0, 0, 0, INDEX, 0, 0) + b"\x01"


def _indexed(buf: bytes) -> tuple[page_index.Columns, PageSummary] | None:
    """A closed page's checked index and its summary (the frame after it, the page's
    last), or None: no index, one that does not check out, no summary after it."""
    at = len(buf)
    for _ in range(4):  # the index is near the end: only a message's bytes could fool it
        found = buf.rfind(_INDEX_START, 0, at)
        if found < FRAME_HEADER:
            return None
        at = found
        columns = page_index.read(buf, found - FRAME_HEADER)
        if columns is None:
            continue
        frames = list(iter_frames(buf, columns.end))
        if len(frames) != 2 or frames[1][2] != len(buf):
            return None
        _start, pstart, pend = frames[1]
        if not HEAD.unpack_from(buf, pstart)[3] & SUMMARY:
            return None
        summary = PageSummary.decode(memoryview(buf)[pstart + HEAD.size : pend])
        return (columns, summary) if summary is not None else None
    return None


def _count_indexed(
    page: int,
    buf: bytes,
    columns: page_index.Columns,
    summary: PageSummary,
    queue_ids: set[int],
    acked: Mapping[tuple[int, int], set[int]],
    committed: set[int],
    queues: dict[int, list[Any]],
    large: list[tuple[int, int, int]],
) -> PageInfo:
    """`_page_records`, counted, for a page whose index checked out."""
    offsets, ids, keys, routes = columns.offsets, columns.ids, columns.keys, columns.routes
    route_ids, txs = columns.route_ids, columns.txs
    count = len(offsets)
    info = PageInfo(page, summary=summary)
    info.size = info.visible = len(buf)
    info.index_at = columns.end
    info.records = count
    info.expires = min(filter(None, columns.expirations), default=0)
    info.txs = set(txs.values())
    # queues counted record by record (None: every queue the page is routed to)
    walked: list[int] | None = None
    if len(route_ids) == 1 and not txs and {key >> 8 for key in set(keys)} == {DURABLE}:
        # the common page: its records all count, for every queue with no acks in it
        route = route_ids[0]
        whole = [q for q in route if q in queue_ids and not acked.get((q, page))]
        if whole and count:
            size = columns.end - offsets[0] - count * (FRAME_HEADER + HEAD.size + 8 * len(route))
            lowest = min(ids)
            for queue_id in whole:
                _count(queues[queue_id], page, count, size, lowest)
        walked = [q for q in route if q in queue_ids and acked.get((q, page))]
        if not walked:
            return info
    nexts = [*offsets[1:], columns.end]
    for k in range(count):
        flags = keys[k] >> 8
        tx_id = txs.get(k, 0)
        if not flags & DURABLE or (tx_id and tx_id not in committed):
            continue
        route = route_ids[routes[k]]
        at = offsets[k]
        holders = [
            q
            for q in (route if walked is None else walked)
            if q in queue_ids and ((done := acked.get((q, page))) is None or at not in done)
        ]
        if not holders:
            continue
        data_at = at + FRAME_HEADER + HEAD.size + 8 * len(route)
        size = nexts[k] - data_at
        if flags & LARGE:
            ref = large_ref(memoryview(buf)[data_at:])
            large.append(ref)
            info.large.append(ref[0])
            size -= LARGE_REF_SIZE
        for queue_id in holders:
            _count(queues[queue_id], page, 1, size, ids[k])
    return info


def _page_records(
    store: PageStore,
    page: int,
    buf: memoryview,
    queue_ids: set[int],
    acked: Mapping[tuple[int, int], set[int]],
    committed: set[int],
    pages: dict[int, PageInfo] | None,
    properties: Callable[[bytes], Mapping[str, object]] | None,
) -> Iterator[PagedRecord]:
    """`durable_records` of one page (`buf`: its bytes as stored), by a walk of its frames."""
    info = PageInfo(page, summary=None)
    frames, damaged = salvaged_frames(buf)
    _report_unreadable(store, page, buf, damaged, frames[-1][2] if frames else 0)
    info.damaged = dict(damaged)
    if frames and HEAD.unpack_from(buf, frames[-1][1])[3] & SUMMARY:
        _start, pstart, pend = frames.pop()
        info.size = info.visible = pend
        info.summary = PageSummary.decode(buf[pstart + HEAD.size : pend])
    elif properties is not None and pages is not None:
        info.summary = _rebuilt(buf, frames, properties)
    for start, pstart, pend in frames:
        info.size = max(info.size, pend)
        info.visible = info.size
        message_id, expiration, tx_id, flags, priority, n = HEAD.unpack_from(buf, pstart)
        if flags & INDEX:
            info.index_at = start  # the cursors read the page through it
            continue
        info.records += 1
        info.note_expiration(expiration)
        if tx_id:
            info.txs.add(tx_id)
        if not flags & 1 or (tx_id and tx_id not in committed):
            continue
        ids_at = pstart + HEAD.size
        holders = []
        for i in range(n):
            queue_id = int.from_bytes(buf[ids_at + 8 * i : ids_at + 8 * i + 8], "big")
            if queue_id in queue_ids:
                done = acked.get((queue_id, page))
                if done is None or start not in done:
                    holders.append(queue_id)
        if holders:
            data = buf[ids_at + 8 * n : pend]
            ref = None
            if flags & LARGE:
                ref = large_ref(data)
                info.large.append(ref[0])
            yield PagedRecord(
                page,
                start,
                message_id,
                expiration,
                priority,
                holders,
                head_of(flags, data),
                ref,
            )
    if pages is not None:
        pages[page] = info


def _report_unreadable(
    store: PageStore,
    page: int,
    buf: memoryview,
    damaged: list[tuple[int, int]],
    valid: int,
) -> None:
    """Log each damaged stretch of a page (its records are lost, not those after it),
    and what follows the last valid frame unless it is zeros (unwritten space; a torn
    tail was cut when the store opened)."""
    address = getattr(store, "address", None)
    for start, resume in damaged:
        log.error(UNREADABLE, address=address, page=page, offset=start, bytes_lost=resume - start)
    rest = buf[valid:]
    if rest.nbytes and bytes(rest).strip(b"\0"):
        log.error(UNREADABLE_REST, address=address, page=page, offset=valid, bytes_lost=rest.nbytes)


def _rebuilt(
    buf: memoryview,
    frames: list[tuple[int, int, int]],
    properties: Callable[[bytes], Mapping[str, object]],
) -> PageSummary:
    """The summary of a page stored without one, from its durable messages (the only
    ones a recovered page delivers)."""
    summary = PageSummary()
    for _start, pstart, pend in frames:
        _id, _expiration, _tx, flags, _priority, n = HEAD.unpack_from(buf, pstart)
        if flags & DURABLE:
            try:
                summary.add(
                    properties(bytes(head_of(flags, buf[pstart + HEAD.size + 8 * n : pend])))
                )
            except ValueError:
                summary.unknown()
                break
    summary.close()
    return summary
