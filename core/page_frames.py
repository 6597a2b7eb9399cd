"""How page stores frame records: length, CRC32, payload.

A frame is `>II` (payload length, zlib.crc32 of the payload) and the payload. Reading
stops at the first frame that is incomplete, zero (unwritten) or fails its CRC, so a torn
or corrupt tail is never taken for data.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence

_HEADER = struct.Struct(">II")
HEADER_SIZE = _HEADER.size


def frame(record: bytes) -> bytes:
    return _HEADER.pack(len(record), zlib.crc32(record)) + record


def frame_all(records: Sequence[bytes]) -> bytes:
    parts = []
    for record in records:
        parts.append(_HEADER.pack(len(record), zlib.crc32(record)))
        parts.append(record)
    return b"".join(parts)


def iter_frames(
    buf: bytes | memoryview, offset: int = 0, *, verified: bool = False
) -> Iterator[tuple[int, int, int]]:
    """(frame start, payload start, payload end) of each valid frame from `offset`.

    `verified`: the bytes come from `PageStore.read`, which returns valid frames only,
    so the CRCs need not be computed again.
    """
    view = memoryview(buf)
    size = len(view)
    unpack = _HEADER.unpack_from
    crc32 = zlib.crc32
    while offset + HEADER_SIZE <= size:
        length, crc = unpack(view, offset)
        start = offset + HEADER_SIZE
        end = start + length
        if length == 0 or end > size or (not verified and crc32(view[start:end]) != crc):
            return
        yield offset, start, end
        offset = end


def valid_length(buf: bytes | memoryview, offset: int = 0) -> int:
    """The byte offset just past the last valid frame from `offset`."""
    end = offset
    for _start, _pstart, pend in iter_frames(buf, offset):
        end = pend
    return end
