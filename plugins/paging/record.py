"""A paged message as stored in a page: the routing result travels with the message.

    message id  u64
    expiration  u64   absolute, ms since the epoch; 0 = never
    tx id       u64   0 = sent outside a transaction
    flags       u8    bit 0: durable; bit 1: a page summary, not a message; bit 2: large
                      (`scow.core.large_messages`); bit 3: a page index, not a message
    priority    u8
    queue count u16
    queue ids   u64 x count   the queues the message was routed to
    data              the message's bytes as the producer sent them; for a large
                      message, its file's reference (file id, head size, length: u64
                      each) then its head

The page store frames each record with its length and CRC (`scow.core.page_frames`).

A closed page ends with its index (`scow.plugins.paging.index`) and then its summary
(`scow.plugins.paging.summary`), each in a record of the same layout: flag INDEX or
SUMMARY, not durable, routed to no queue, so every reader of messages passes over them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from scow.core.large_messages import LargeHead, LargeMessageStore, large_body

HEAD = struct.Struct(">QQQBBH")
_QID = struct.Struct(">Q")
_LARGE_REF = struct.Struct(">QQQ")
#: Bytes of a large message's file reference, ahead of its head in a record's data.
LARGE_REF_SIZE = _LARGE_REF.size
DURABLE = 1
SUMMARY = 2
LARGE = 4
INDEX = 8


def encode(
    message_id: int,
    expiration: int,
    tx_id: int,
    durable: bool,
    priority: int,
    queue_ids: Sequence[int],
    data: bytes,
) -> bytes:
    n = len(queue_ids)
    flags = DURABLE if durable else 0
    if data.__class__ is not bytes and (body := large_body(data)) is not None:
        flags |= LARGE
        data = _LARGE_REF.pack(body.file_id, body.head_size, body.length) + data
    head = HEAD.pack(message_id, expiration, tx_id, flags, priority, n)
    ids = _QID.pack(queue_ids[0]) if n == 1 else struct.pack(f">{n}Q", *queue_ids)
    return b"".join((head, ids, data))


def encode_summary(summary: bytes) -> bytes:
    """The record holding a closed page's summary."""
    return HEAD.pack(0, 0, 0, SUMMARY, 0, 0) + summary


def large_ref(data: bytes | memoryview) -> tuple[int, int, int]:
    """(file id, head size, length) at the start of a large message's record data."""
    return _LARGE_REF.unpack_from(data)  # type: ignore[return-value]


def message_data(flags: int, data: bytes, store: LargeMessageStore) -> bytes:
    """A record's message bytes as the broker holds them: for a large message its head,
    with the body its address's pages hold (see `LargeMessageStore.page_hold`)."""
    if not flags & LARGE:
        return data
    return LargeHead(bytes(data[_LARGE_REF.size :]), store.paged_body(*large_ref(data)))


def head_of(flags: int, data: memoryview) -> memoryview:
    """A record's message bytes, less a large message's file reference."""
    return data[_LARGE_REF.size :] if flags & LARGE else data


#: What the log says of a frame damaged on disk: its record is lost, not those after it
#: (`scow.core.page_frames.next_valid_frame`), unless no valid one follows in its page.
UNREADABLE = "page record unreadable: a damaged frame; read on at its next valid record"
UNREADABLE_REST = "page record unreadable: a damaged frame, and no valid record after it"
