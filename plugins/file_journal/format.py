"""The on-disk format of journal files: file header, record header, record kinds.

A journal file is `journal-file-size` bytes. Its first `DATA_START` bytes hold the file
header (the rest of that block is zeros, so O_DIRECT writers can start records on an
aligned offset). Records follow back to back, each starting with a 32-byte header:

    offset size field
    0      4    crc      CRC32 of bytes 4 .. length (rest of the header and the body)
    4      1    kind     one of the `Kind` values
    5      1    rtype    the caller's record type
    6      2    flags    `FLAG_REPLACEABLE` on updates
    8      4    epoch    the epoch of the file the record was written into
    12     4    length   header + body, in bytes
    16     8    id       record id; for COMMIT and PREPARE unused (0)
    24     8    tx       transaction id, 0 outside transactions
    32     ...  body

All integers are little-endian. The epoch makes a record written during an earlier use of
a recycled file invalid in its new life, the CRC makes a torn or damaged record invalid,
so a reader simply stops at the first record that is not valid. A sealed file ends with
an EOF record; a file without one is the file the writer was using when it stopped.
"""

from __future__ import annotations

import re
import struct
import zlib
from enum import IntEnum

#: Bytes reserved at the start of every file for the header; records start here.
DATA_START = 4096
#: Alignment of O_DIRECT writes (offset, length and buffer address).
ALIGNMENT = 4096
#: Written in every file header; `load()` refuses files with another version.
FORMAT_VERSION = 1
MAGIC = b"SCOWJRNL"
#: Epoch stored in the header of a file that holds no data (new or recycled).
FREE_EPOCH = 0

# magic, version, reserved, epoch, crc (of the preceding 16 bytes)
FILE_HEADER = struct.Struct("<8sHHII")
# The record header without its leading CRC, and the whole of it.
RECORD_REST = struct.Struct("<BBHIIQQ")
RECORD_CRC = struct.Struct("<I")
RECORD_HEADER = struct.Struct("<IBBHIIQQ")
HEADER_SIZE = RECORD_HEADER.size  # 32
# Body of COMMIT and PREPARE: count of (epoch, records) pairs, then the pairs.
PAIR_COUNT = struct.Struct("<I")
PAIR = struct.Struct("<II")

FLAG_REPLACEABLE = 0x1

MAX_ID = (1 << 64) - 1
MAX_TYPE = 255


class Kind(IntEnum):
    """Record kinds. Zero is never used, so a zero-filled region is never a record."""

    ADD = 1
    UPDATE = 2
    DELETE = 3
    ADD_TX = 4
    UPDATE_TX = 5
    DELETE_TX = 6
    PREPARE = 7
    COMMIT = 8
    ROLLBACK = 9
    #: Filler written by the O_DIRECT writer to reach an aligned offset.
    PAD = 10
    #: Marks the end of a sealed file.
    EOF = 11


MAX_KIND = max(Kind)
TX_OP_KINDS = frozenset((Kind.ADD_TX, Kind.UPDATE_TX, Kind.DELETE_TX))


def encode_record(
    kind: int, rtype: int, flags: int, epoch: int, record_id: int, tx_id: int, body: bytes
) -> bytes:
    """One complete record (header and body) as bytes."""
    length = HEADER_SIZE + len(body)
    rest = RECORD_REST.pack(kind, rtype, flags, epoch, length, record_id, tx_id)
    return RECORD_CRC.pack(zlib.crc32(body, zlib.crc32(rest))) + rest + body


def whole_record(buf: bytes | bytearray | memoryview, off: int) -> bool:
    """Whether a whole record whose CRC holds starts at `off` of `buf` (whatever its
    epoch; `buf` holds at least a header from `off`)."""
    crc, kind, _type, _flags, _epoch, length, _id, _tx = RECORD_HEADER.unpack_from(buf, off)
    return (
        0 < kind <= MAX_KIND
        and HEADER_SIZE <= length <= len(buf) - off
        and zlib.crc32(memoryview(buf)[off + 4 : off + length]) == crc
    )


def encode_pairs(pairs: list[tuple[int, int]], extra: bytes = b"") -> bytes:
    """The body of a COMMIT or PREPARE: (file epoch, tx record count) pairs, then `extra`."""
    return PAIR_COUNT.pack(len(pairs)) + b"".join(PAIR.pack(e, n) for e, n in pairs) + extra


def decode_pairs(body: bytes | memoryview) -> tuple[list[tuple[int, int]], bytes]:
    """Inverse of `encode_pairs`; raises ValueError when the body is too short."""
    if len(body) < PAIR_COUNT.size:
        raise ValueError(f"transaction summary of {len(body)} bytes: shorter than its count")
    (n,) = PAIR_COUNT.unpack_from(body, 0)
    end = PAIR_COUNT.size + n * PAIR.size
    if end > len(body):
        raise ValueError(f"transaction summary announces {n} pairs but holds {len(body)} bytes")
    pairs = [PAIR.unpack_from(body, PAIR_COUNT.size + i * PAIR.size) for i in range(n)]
    return pairs, bytes(body[end:])


def encode_file_header(epoch: int) -> bytes:
    """The full `DATA_START` block that starts a file with this epoch."""
    head = FILE_HEADER.pack(MAGIC, FORMAT_VERSION, 0, epoch, 0)[:-4]
    head += RECORD_CRC.pack(zlib.crc32(head))
    return head + bytes(DATA_START - len(head))


def decode_file_header(block: bytes | memoryview) -> int | None:
    """The epoch in a file header, or None when the block is not a valid header."""
    if len(block) < FILE_HEADER.size:
        return None
    magic, version, _reserved, epoch, crc = FILE_HEADER.unpack_from(block, 0)
    if magic != MAGIC or version != FORMAT_VERSION:
        return None
    if zlib.crc32(bytes(block[: FILE_HEADER.size - 4])) != crc:
        return None
    return int(epoch)


def file_name(prefix: str, number: int, extension: str) -> str:
    """`<prefix>-<number>.<extension>`, e.g. `scow-data-3.scow`."""
    return f"{prefix}-{number}.{extension}"


def file_name_pattern(prefix: str, extension: str) -> re.Pattern[str]:
    """Matches the names `file_name` produces and captures the number."""
    return re.compile(rf"^{re.escape(prefix)}-(\d+)\.{re.escape(extension)}$")


def control_file_name(prefix: str) -> str:
    """Name of the file that records an interrupted compaction (see `compactor`)."""
    return f"{prefix}-rename-control.ctr"
