"""A stream record: its stored header and the annotations written into the message.

A stream stores each message once, as it is delivered: the producer's bytes with a
message-annotations section carrying `x-opt-sequence-number` (long) and
`x-opt-enqueued-time` (timestamp) added when it is appended. Most messages have no
annotations of their own: the section is then spliced in after the header without
parsing anything else; otherwise the codec merges the two entries into the existing map.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any

from scow.core.duplicates import DUPLICATE_ID_PROPERTY
from scow.protocols.amqp import codec

#: Stored in front of each message in a segment: sequence number, enqueue time (ms since
#: the epoch), broker message id (for recovery to skip messages already stored).
RECORD = struct.Struct(">QqQ")

SEQUENCE_ANNOTATION = "x-opt-sequence-number"
TIME_ANNOTATION = "x-opt-enqueued-time"

_HEADER_SECTION = b"\x00\x53\x70"
_DELIVERY_ANNOTATIONS = b"\x00\x53\x71"
_MESSAGE_ANNOTATIONS = b"\x00\x53\x72"


def _section_prefix() -> tuple[bytes, bytes]:
    probe = codec.encode_value(
        {
            codec.Symbol(SEQUENCE_ANNOTATION): codec.Long(1 << 40),
            codec.Symbol(TIME_ANNOTATION): codec.Timestamp(1 << 40),
        }
    )
    # map8: 0xc1 size count, then sym8 key, 0x81 + 8 bytes, sym8 key, 0x83 + 8 bytes
    seq_key = codec.encode_value(codec.Symbol(SEQUENCE_ANNOTATION))
    time_key = codec.encode_value(codec.Symbol(TIME_ANNOTATION))
    head = probe[: len(probe) - (len(seq_key) + 9 + len(time_key) + 9)]
    return _MESSAGE_ANNOTATIONS + head + seq_key + b"\x81", b"\x83"


_SEQ_PREFIX, _TIME_CODE = _section_prefix()
_TIME_KEY = codec.encode_value(codec.Symbol(TIME_ANNOTATION))
LONG = struct.Struct(">q")
_PACK = LONG.pack

#: The section `annotate` splices in, for readers to recognize without decoding it: it
#: starts with STREAM_SECTION_PREFIX, is STREAM_SECTION_SIZE bytes long, and holds the
#: sequence number and the enqueue time as big-endian longs at these offsets.
STREAM_SECTION_PREFIX = _SEQ_PREFIX
SEQUENCE_OFFSET = len(_SEQ_PREFIX)
TIME_OFFSET = SEQUENCE_OFFSET + 8 + len(_TIME_KEY) + len(_TIME_CODE)
STREAM_SECTION_SIZE = TIME_OFFSET + 8


def annotate(data: bytes, seq: int, enqueued: int) -> bytes:
    """`data` with the stream's two annotations (see the module docstring)."""
    start = 0
    if data.startswith(_HEADER_SECTION):
        start = codec.skip_value(data, 3)
    if data.startswith(_MESSAGE_ANNOTATIONS, start) or data.startswith(
        _DELIVERY_ANNOTATIONS, start
    ):
        try:
            return codec.with_annotations(
                data,
                {SEQUENCE_ANNOTATION: codec.Long(seq), TIME_ANNOTATION: codec.Timestamp(enqueued)},
            )
        except codec.DecodeError:
            pass  # a malformed message (accepted as bytes): the section goes in as for others
    section = _SEQ_PREFIX + _PACK(seq) + _TIME_KEY + _TIME_CODE + _PACK(enqueued)
    return data[:start] + section + data[start:]


# --------------------------------------------------------------------------- packs

#: The source filter by which a reader asks for packs: the most records one delivery
#: carries (a uint); without it every record is a delivery of its own.
PACK_FILTER = "scow:stream-pack"
#: Records one pack carries at most, whatever the filter asks.
MAX_PACK_RECORDS = 10_000
#: A pack is closed once it holds this many bytes (a larger record goes alone).
PACK_BYTES = 128 << 10
PACK_ANNOTATION = "x-opt-scow-records"

_UINT = struct.Struct(">I")
_DATA32 = b"\x00\x53\x75\xb0"


def _pack_prefix() -> bytes:
    probe = codec.encode_value({codec.Symbol(PACK_ANNOTATION): codec.UInt(1 << 20)})
    return _MESSAGE_ANNOTATIONS + probe[: -_UINT.size]  # the uint32's 4 bytes follow


#: Every pack starts with these bytes and then its record count (uint32).
PACK_PREFIX = _pack_prefix()

#: A durable message's header section (what encode_message puts before the rest).
DURABLE_HEADER = codec.encode_message(b"", durable=True)[: -len(codec.encode_message(b""))]


def pack(messages: list[bytes], *, durable: bool = False) -> bytes:
    """Several messages as one AMQP message: a message-annotations section
    {x-opt-scow-records: count} and one data section holding each message's bytes after
    its length (uint32); `durable`: after a durable header (a pack staged by the sink must
    be journaled like the rows it holds). Delivered as one transfer, they cost the broker
    and the reader one delivery instead of one each (`scow:stream-pack`)."""
    return _packed(DURABLE_HEADER if durable else b"", messages)


def _packed(head: bytes, messages: list[bytes]) -> bytes:
    """`pack`'s bytes after the header section `head` (or none: b"")."""
    pack_uint = _UINT.pack
    payload = b"".join([part for m in messages for part in (pack_uint(len(m)), m)])
    return (
        head + PACK_PREFIX + pack_uint(len(messages)) + _DATA32 + pack_uint(len(payload)) + payload
    )


def _pack_start(data: bytes) -> int:
    """Where a pack's annotations (PACK_PREFIX) start in `data` (past a header); -1: not a
    pack."""
    at = codec.skip_value(data, 3) if data.startswith(_HEADER_SECTION) else 0
    return at if data.startswith(PACK_PREFIX, at) else -1


def is_pack(data: bytes) -> bool:
    """Whether `data` (a message, or a large message's head) is a pack."""
    return _pack_start(data) >= 0


def grouped(messages: Iterable[bytes], records: int, size: int) -> Iterator[list[bytes]]:
    """`messages` in runs of at most `records` that stop once they hold `size` bytes (so a
    larger message goes alone): what one pack each carries."""
    group: list[bytes] = []
    held = 0
    for message in messages:
        group.append(message)
        held += len(message)
        if len(group) >= records or held >= size:
            yield group
            group, held = [], 0
    if group:
        yield group


class MalformedPack(ValueError):
    """A pack whose record count or sizes do not fit its bytes."""


def _records_at(data: bytes) -> tuple[int, int, int]:
    """(record count, where the first record's size is, where the data section ends) of
    the pack `data`; MalformedPack when it is not a pack or what its annotation and its
    data section's header say runs past its bytes."""
    at = _pack_start(data)
    if at < 0:
        raise MalformedPack("not a pack: it does not begin with the pack annotation")
    at += len(PACK_PREFIX)
    if len(data) < at + _UINT.size + len(_DATA32) + _UINT.size:
        raise MalformedPack(f"pack of {len(data)} bytes: too short for its data section")
    count = _UINT.unpack_from(data, at)[0]
    at += _UINT.size
    if not data.startswith(_DATA32, at):
        raise MalformedPack(f"pack of {count} records: no data section after its annotations")
    at += len(_DATA32)
    size = _UINT.unpack_from(data, at)[0]
    at += _UINT.size
    if at + size > len(data):
        raise MalformedPack(
            f"pack of {count} records: its data section says {size} bytes, {len(data) - at} follow"
        )
    if size < 4 * count:  # refused before a walk of that many
        raise MalformedPack(
            f"pack of {count} records: its data section of {size} bytes cannot hold them "
            "(4 bytes at least each)"
        )
    return count, at, at + size


def unpack(data: bytes, out: list[bytes]) -> bool:
    """Append the records of a pack to `out`; False (and nothing appended) when `data`
    is not a pack but a record of its own (a broker that does not pack). MalformedPack
    (nothing appended) when its sizes do not fit its bytes."""
    if _pack_start(data) < 0:
        return False
    out += _walk(data, True)
    return True


def spans(data: bytes) -> list[tuple[int, int]]:
    """Where each record of the pack `data` lies in it: (start, end), without copying them;
    MalformedPack when its record count and sizes do not fill its data section exactly."""
    return _walk(data, False)


def _walk(data: bytes, cut: bool) -> list[Any]:
    """The records of the pack `data` (`cut`), or where each lies in it; MalformedPack
    unless its record count and sizes fill its data section exactly. (One walk that
    checks and cuts: a reader's hot path.)"""
    count, at, end = _records_at(data)
    unpack_uint = _UINT.unpack_from
    found: list[Any] = []
    append = found.append
    try:
        for _ in range(count):
            stop = at + 4 + unpack_uint(data, at)[0]
            if stop > end:  # its size, or its size's 4 bytes, run past the data section
                break
            append(data[at + 4 : stop] if cut else (at + 4, stop))
            at = stop
    except struct.error:  # its size's 4 bytes run past the pack
        pass
    if len(found) < count:
        raise MalformedPack(
            f"pack of {count} records: record {len(found)} runs past its data section"
        )
    if at != end:
        raise MalformedPack(f"pack of {count} records: {end - at} bytes after its last record")
    return found


def rows_after(data: bytes, first: int) -> bytes:
    """A pack of the rows of the pack `data` from row `first` on, after `data`'s own
    header (a committed pack's durable one); MalformedPack as for `spans`."""
    return _packed(data[: _pack_start(data)], _walk(data, True)[first:])


def rows_in(data: bytes) -> int:
    """How many rows the pack `data` holds, 1 to MAX_PACK_RECORDS, its sizes checked
    against its bytes: MalformedPack saying what does not fit."""
    rows = len(spans(data))
    if not 0 < rows <= MAX_PACK_RECORDS:
        raise MalformedPack(f"pack of {rows} records: expected 1 to {MAX_PACK_RECORDS}")
    return rows


# --------------------------------------------------------------------------- the connector's rows

#: How a row the connector writes (`schema.messages_of`) goes on after its durable header
#: (and, once a stream stored it, the stream's annotations): at once with its body's data
#: section when it is a body and nothing else...
BODY_ROW = b"\x00\x53\x75"
#: ...or, with a duplicate id and no other property, with an application-properties
#: section (this descriptor) holding a map8 (its size byte next)...
APPLICATION_PROPERTIES = b"\x00\x53\x74"
ID_ROW = APPLICATION_PROPERTIES + b"\xc1"
#: ...of one name and its value (a count of 2): the id's name, encoded as this key.
ID_KEY = codec.encode_value(DUPLICATE_ID_PROPERTY)
ID_NAME = b"\x02" + ID_KEY
#: `id_value_at`: a row of a body alone, which carries no id.
NO_ID = -1


def id_value_at(data: bytes, at: int) -> int | None:
    """Where the duplicate id's value (its constructor) is in a row the connector wrote,
    whose sections start at `at` (past its header, and a stream's annotations); NO_ID for
    a row that is a body alone; None for a row not laid out so (its properties are to be
    parsed)."""
    if data.startswith(BODY_ROW, at):
        return NO_ID
    name = at + len(ID_ROW) + 1  # past the map's size
    if data.startswith(ID_ROW, at) and data.startswith(ID_NAME, name):
        return name + len(ID_NAME)
    return None


# --------------------------------------------------------------------------- committed packs

#: The bits of a row's id (below) that number it in its pack: MAX_PACK_RECORDS fits.
_ROW_BITS = 14
_ROW_ID = 1 << 63
assert MAX_PACK_RECORDS < 1 << _ROW_BITS


def row_id(pack_id: int, row: int) -> int:
    """The id a stream stores with row `row` of the committed pack whose message id is
    `pack_id`: unique per row (recovery skips exactly the rows a crash left stored),
    never a broker message id (those stay below 2**49), and the same at every start."""
    return _ROW_ID | pack_id << _ROW_BITS | row
