"""The test messages: one pre-encoded message per sender, with a send-time stamp in its
body (and, for --duplicate-ids, an `_AMQ_DUPL_ID`) overwritten in place before each send,
and where to find the stamp again on receipt."""

from __future__ import annotations

import struct

from scow.protocols.amqp.codec import encode_message
from scow.protocols.amqp.perf.errors import PerfError

_STAMP = struct.Struct("<q")
#: --duplicate-ids: each message's `_AMQ_DUPL_ID`, a binary of the producer's own prefix
#: and its sequence number, written over this placeholder.
_ID = struct.Struct("<QQ")
_ID_PLACEHOLDER = b"\xa5" * _ID.size
_DATA_SECTION = b"\x00Su"  # described type 0x75: an AMQP data section


def make_message(
    size: int,
    *,
    durable: bool,
    duplicate_id: bool = False,
    properties: dict[str, str] | None = None,
) -> tuple[bytes, int]:
    """The encoded message with a `size`-byte data body, and the offset of its stamp;
    `duplicate_id`: with an `_AMQ_DUPL_ID` to overwrite (at `id_offset`); `properties`:
    application properties every message carries (for selectors)."""
    if size < _STAMP.size:
        raise PerfError(f"--size {size}: a body needs at least {_STAMP.size} bytes for its stamp")
    body = bytes(range(1, 256)) * (size // 255 + 1)  # no zero bytes: no false section match
    properties = dict(properties or {})
    if duplicate_id:
        properties["_AMQ_DUPL_ID"] = _ID_PLACEHOLDER
    data = encode_message(body[:size], durable=durable, application_properties=properties or None)
    offset = stamp_offset(data)
    if offset is None:
        raise PerfError("encoded message has no data section")
    return data, offset


def id_offset(data: bytes) -> int:
    """Where the `_AMQ_DUPL_ID` placeholder of a `make_message(duplicate_id=True)` is."""
    return data.index(_ID_PLACEHOLDER)


def stamp_offset(data: bytes) -> int | None:
    """Where the first body byte of the data section is, or None without one."""
    at = data.find(_DATA_SECTION)
    if at < 0 or at + 4 > len(data):
        return None
    constructor = data[at + 3]
    if constructor == 0xA0:  # vbin8
        start = at + 5
    elif constructor == 0xB0:  # vbin32
        start = at + 8
    else:
        return None
    return start if start + _STAMP.size <= len(data) else None
