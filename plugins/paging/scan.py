"""Reading whole page stores off-line: what recovery, `scow data` and export need.

`durable_records` walks an address's pages and yields the durable, committed messages
with the queues that have not acknowledged them; nothing else of a page is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import structlog

from scow.core.interfaces import PageStore
from scow.core.page_frames import salvaged_frames
from scow.plugins.paging.pager import PageInfo
from scow.plugins.paging.record import (
    DURABLE,
    HEAD,
    INDEX,
    LARGE,
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
        buf = memoryview(read(page))
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
