"""Where bodies that flowed to disk wait: segment files of appended bodies.

Run-time storage, not persistence (durable messages are in the journal anyway): the
directory is emptied at start, nothing is synced, and a segment file is deleted once
every body in it has been read back or its message has gone.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from scow.core.message import OnDisk

#: Bytes per segment file before the next one starts.
SEGMENT_SIZE = 64 << 20


class _Segment:
    __slots__ = ("fd", "live", "number", "path", "size")

    def __init__(self, directory: Path, number: int) -> None:
        self.number = number
        self.path = directory / f"{number:06d}.flow"
        self.fd = os.open(self.path, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o600)
        self.size = 0
        self.live = 0  # bodies in it not read back yet


class Spilled(OnDisk):
    """One body in a segment."""

    __slots__ = ("length", "offset", "segment", "store")

    def __init__(self, store: SpillStore, segment: _Segment, offset: int, length: int) -> None:
        self.store = store
        self.segment = segment
        self.offset = offset
        self.length = length

    def __len__(self) -> int:
        return self.length

    def load(self) -> bytes:
        data = os.pread(self.segment.fd, self.length, self.offset)
        if len(data) != self.length:
            raise OSError(
                f"flow-to-disk file {self.segment.path}: {len(data)} of {self.length} bytes "
                f"at offset {self.offset}"
            )
        self.store.restored += self.length
        self._release()
        return data

    def _release(self) -> None:
        if self.segment is not None:
            self.store.release(self.segment, self.length)
            self.segment = None  # type: ignore[assignment]

    def __del__(self) -> None:  # its message went without being read back
        if self.segment is not None:
            self.store.release(self.segment, self.length)


class SpillStore:
    """Appends bodies to the current segment; counts what is on disk."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        shutil.rmtree(directory, ignore_errors=True)  # left by a previous run
        directory.mkdir(parents=True, exist_ok=True)
        self._segments: dict[int, _Segment] = {}
        self._current = self._new_segment()
        #: Bytes of bodies on disk now; bytes written and read back since start.
        self.on_disk = 0
        self.evacuated = 0
        self.restored = 0

    def _new_segment(self) -> _Segment:
        number = max(self._segments, default=0) + 1
        segment = self._segments[number] = _Segment(self.directory, number)
        return segment

    def write(self, bodies: list[bytes]) -> list[Spilled]:
        """Append `bodies` (one write per segment) and return their places."""
        segment = self._current
        if segment.size >= SEGMENT_SIZE:
            segment = self._current = self._new_segment()
            for old in list(self._segments.values()):
                self._drop_if_done(old)
        places = []
        offset = segment.size
        for body in bodies:
            places.append(Spilled(self, segment, offset, len(body)))
            offset += len(body)
        os.pwrite(segment.fd, b"".join(bodies), segment.size)
        written = offset - segment.size
        segment.size = offset
        segment.live += len(bodies)
        self.on_disk += written
        self.evacuated += written
        return places

    def release(self, segment: _Segment, length: int) -> None:
        segment.live -= 1
        self.on_disk -= length
        self._drop_if_done(segment)

    def _drop_if_done(self, segment: _Segment) -> None:
        if segment.live or self._segments.get(segment.number) is not segment:
            return  # still in use, or closed with the store
        if segment is self._current:
            segment.size = 0  # everything in it was read back: write from the start again
            return
        del self._segments[segment.number]
        os.close(segment.fd)
        segment.path.unlink(missing_ok=True)

    def files(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        for segment in self._segments.values():
            os.close(segment.fd)
        self._segments.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
