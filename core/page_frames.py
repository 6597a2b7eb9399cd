"""How page stores frame records: length, CRC32, payload.

A frame is `>II` (payload length, CRC-32 of the payload) and the payload. Reading
stops at the first frame that is incomplete, zero (unwritten) or fails its CRC, so a torn
or corrupt tail is never taken for data. That is also why a record cannot be empty: its
frame would read as zero fill. A frame damaged on disk after it was written (a flipped
bit) need not cost the frames after it: `next_valid_frame` finds where they resume.

This is on the paging read path (every paged message passes through it), so it yields
positions rather than payloads: callers slice only what they need. The CRC is zlib's
CRC-32 as ISA-L computes it (the same values, some 30 times faster on 1 KiB records than
`zlib.crc32`, which dominated the cost of reading a page back).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Sequence
from typing import Final

from isal.isal_zlib import crc32

_HEADER = struct.Struct(">II")
HEADER_SIZE: Final = _HEADER.size
#: The largest payload a frame's 32-bit length can describe.
MAX_RECORD_SIZE: Final = 0xFFFF_FFFF
_NONZERO = re.compile(rb"[^\x00]")


def _unframeable(index: int, record: bytes) -> ValueError:
    if not record:
        return ValueError(
            f"record {index} is empty; a frame holds 1 to {MAX_RECORD_SIZE} bytes "
            "(an empty one would read as unwritten space)"
        )
    return ValueError(
        f"record {index} has {len(record)} bytes; a frame holds 1 to {MAX_RECORD_SIZE} bytes"
    )


def frame(record: bytes) -> bytes:
    """`record` with its frame header in front; ValueError if it is empty or too large."""
    if not record:
        raise _unframeable(0, record)
    try:
        return _HEADER.pack(len(record), crc32(record)) + record
    except struct.error:
        raise _unframeable(0, record) from None


def frame_all(records: Sequence[bytes]) -> bytes:
    """Every record framed, in one buffer, so a store can write a batch with one call."""
    pack = _HEADER.pack
    parts: list[bytes] = []
    for index, record in enumerate(records):
        if not record:
            raise _unframeable(index, record)
        try:
            parts.append(pack(len(record), crc32(record)))
        except struct.error:
            raise _unframeable(index, record) from None
        parts.append(record)
    return b"".join(parts)


def iter_frames(
    buf: bytes | memoryview, offset: int = 0, *, verified: bool = False
) -> Iterator[tuple[int, int, int]]:
    """(frame start, payload start, payload end) of each valid frame from `offset`.

    Stops silently at the first frame that is incomplete, zero or fails its CRC.
    `verified`: the bytes come from `PageStore.read`, which returns valid frames only,
    so the CRCs need not be computed again.
    """
    if offset < 0:
        raise ValueError(f"frame offset {offset} is negative; offsets count from 0")
    view = memoryview(buf)
    size = len(view)
    unpack = _HEADER.unpack_from
    while offset + HEADER_SIZE <= size:
        length, crc = unpack(view, offset)
        start = offset + HEADER_SIZE
        end = start + length
        if length == 0 or end > size or (not verified and crc32(view[start:end]) != crc):
            return
        yield offset, start, end
        offset = end


def valid_length(buf: bytes | memoryview, offset: int = 0) -> int:
    """The byte offset just past the last valid frame from `offset` (`offset` if none)."""
    if offset < 0:
        raise ValueError(f"frame offset {offset} is negative; offsets count from 0")
    # `iter_frames`' loop written out: every page read checks every frame's CRC here
    view = memoryview(buf)
    size = len(view)
    unpack = _HEADER.unpack_from
    end = offset
    while end + HEADER_SIZE <= size:
        length, crc = unpack(view, end)
        start = end + HEADER_SIZE
        stop = start + length
        if length == 0 or stop > size or crc32(view[start:stop]) != crc:
            break
        end = stop
    return end


def next_valid_frame(buf: bytes | memoryview, damaged: int) -> int | None:
    """Where valid frames resume after the frame at `damaged`, which is not valid (see
    `valid_length`); None when none follows (a torn tail, zero fill).

    Every later offset is a candidate, taken when a whole frame starts there and its CRC
    holds (a chance match is one in 2**32); runs of zeros, unwritten space, are passed
    over in one search. The damaged frame's own length is not trusted: bit rot in it
    would skip the frames it no longer ends at.
    """
    view = memoryview(buf)
    size = len(view)
    unpack = _HEADER.unpack_from
    at = damaged + 1
    while at + HEADER_SIZE < size:
        length, crc = unpack(view, at)
        if length == 0:  # a candidate's length has a non-zero byte among its first four
            found = _NONZERO.search(view, at)
            if found is None:
                return None
            at = max(at + 1, found.start() - 3)
            continue
        end = at + HEADER_SIZE + length
        if end <= size and crc32(view[at + HEADER_SIZE : end]) == crc:
            return at
        at += 1
    return None


def salvaged_frames(
    buf: bytes | memoryview,
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """Every valid frame of `buf` as `iter_frames` gives them, read on past damaged
    frames at `next_valid_frame`; and the (start, end) of each damaged stretch passed
    over. A tail where no valid frame follows (torn, zero fill) is neither."""
    frames: list[tuple[int, int, int]] = []
    damaged: list[tuple[int, int]] = []
    at = 0
    while True:
        frames.extend(iter_frames(buf, at))
        at = frames[-1][2] if frames and frames[-1][2] > at else at
        resume = next_valid_frame(buf, at)
        if resume is None:
            return frames, damaged
        damaged.append((at, resume))
        at = resume
