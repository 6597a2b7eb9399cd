"""A paged message as stored in a page: the routing result travels with the message.

    message id  u64
    expiration  u64   absolute, ms since the epoch; 0 = never
    tx id       u64   0 = sent outside a transaction
    flags       u8    bit 0: durable; bit 1: a page summary, not a message
    priority    u8
    queue count u16
    queue ids   u64 x count   the queues the message was routed to
    data              the message's bytes as the producer sent them

The page store frames each record with its length and CRC (`scow.core.page_frames`).

A closed page ends with its summary (`scow.plugins.paging.summary`) in a record of the
same layout: flag SUMMARY, not durable, routed to no queue, so every reader of messages
passes over it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

HEAD = struct.Struct(">QQQBBH")
_QID = struct.Struct(">Q")
DURABLE = 1
SUMMARY = 2


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
    head = HEAD.pack(message_id, expiration, tx_id, DURABLE if durable else 0, priority, n)
    ids = _QID.pack(queue_ids[0]) if n == 1 else struct.pack(f">{n}Q", *queue_ids)
    return b"".join((head, ids, data))


def encode_summary(summary: bytes) -> bytes:
    """The record holding a closed page's summary."""
    return HEAD.pack(0, 0, 0, SUMMARY, 0, 0) + summary
