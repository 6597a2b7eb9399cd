"""A stream's log: append-only segment files of CRC'd frames, indexed sparsely.

Each record is one message as it will be delivered: `RECORD` (sequence number, enqueue
time in ms, broker message id) and the message's bytes, framed by
`scow.core.page_frames`. A segment file is named by the sequence number of its first
record, so sequence numbers are contiguous within a stream and a sealed segment ends
where the next one starts. A segment is the unit of retention: whole files are deleted.

Threads: the event loop owns the list of segments and the visible end, and reads (see
`StreamQueue._serve` for why there); the `Log`'s writer thread appends and syncs (group
commit) and deletes files, keeping its own figures of the segment it writes. The sparse
index of a segment (a (sequence, offset, time) entry every `INDEX_EVERY` bytes) is built
at open for the last two segments, and for older ones by their first read (one scan).
"""

from __future__ import annotations

import bisect
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from scow.core.page_frames import HEADER_SIZE, frame_all, iter_frames
from scow.plugins.spark.records import RECORD

log = structlog.get_logger("scow.stream")

#: Bytes between two sparse index entries.
INDEX_EVERY = 32 << 10
#: Bytes read per positioned read.
READ_CHUNK = 256 << 10
SUFFIX = ".seg"


@dataclass(slots=True)
class Segment:
    """One segment file: its first sequence number and its sparse index."""

    first: int
    path: Path
    size: int = 0
    #: (sequence, offset, enqueue time) every INDEX_EVERY bytes; None until built.
    index: list[tuple[int, int, int]] | None = None
    first_time: int = 0

    def build_index(self) -> list[tuple[int, int, int]]:
        """Scan the file for its index (reader thread, or at open)."""
        if self.index is not None:
            return self.index
        with open(self.path, "rb") as f:
            data = f.read(self.size)
        index: list[tuple[int, int, int]] = []
        last = -INDEX_EVERY
        for start, payload, _end in iter_frames(data, verified=True):
            if start - last >= INDEX_EVERY:
                seq, enqueued, _mid = RECORD.unpack_from(data, payload)
                index.append((seq, start, enqueued))
                last = start
        self.index = index
        return index


@dataclass(slots=True)
class Written:
    """What one write batch did, handed back to the loop."""

    last_seq: int
    new_segments: list[Segment] = field(default_factory=list)
    #: index entries for segments already known to the loop: (segment first, entry)
    index: list[tuple[int, tuple[int, int, int]]] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)
    tokens: list[object] = field(default_factory=list)


def _segment_path(directory: Path, first: int) -> Path:
    return directory / f"{first:020d}{SUFFIX}"


def open_segments(directory: Path) -> tuple[list[Segment], int, set[int]]:
    """The segments in `directory`, the next sequence number, and the broker message ids
    of the last two segments (for recovery to skip messages already stored).

    The last segment's torn or corrupt tail is cut off.
    """
    directory.mkdir(parents=True, exist_ok=True)
    segments = []
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            first = int(path.stem)
        except ValueError:
            continue
        segments.append(Segment(first, path, path.stat().st_size))
    next_seq = segments[-1].first if segments else 0
    ids: set[int] = set()
    for position, segment in enumerate(segments[-2:]):
        last = position == len(segments[-2:]) - 1
        data = segment.path.read_bytes()
        index: list[tuple[int, int, int]] = []
        mark = -INDEX_EVERY
        end = 0
        for start, payload, frame_end in iter_frames(data):
            seq, enqueued, message_id = RECORD.unpack_from(data, payload)
            ids.add(message_id)
            if start - mark >= INDEX_EVERY:
                index.append((seq, start, enqueued))
                mark = start
            end = frame_end
            if last:
                next_seq = seq + 1
        if last and end < len(data):
            log.warning("stream segment tail cut", segment=str(segment.path), at=end)
            with open(segment.path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        segment.size = end if last else segment.size
        segment.index = index
    for segment in segments:
        if segment.index:
            segment.first_time = segment.index[0][2]
        else:
            segment.first_time = _first_time(segment)
    return segments, next_seq, ids


def _first_time(segment: Segment) -> int:
    """The enqueue time of the segment's first record; for an empty one (rolled just
    before a stop), when the file was made, so time retention does not take it as old."""
    with open(segment.path, "rb") as f:
        head = f.read(HEADER_SIZE + RECORD.size)
    if len(head) < HEADER_SIZE + RECORD.size:
        return int(segment.path.stat().st_mtime * 1000)
    return int(RECORD.unpack_from(head, HEADER_SIZE)[1])


class Log:
    """The writer side of one stream's segments: a thread that appends and syncs.

    `append(seq, message_id, data, token)` queues a record (sequence numbers given in
    order by the loop); the thread writes what is queued, fdatasyncs once, and calls
    `on_written(Written)` (which must hand over to the loop itself). The thread keeps its
    own figures of the segment it writes: `Segment` objects belong to the loop.
    """

    def __init__(
        self,
        directory: Path,
        active: Segment | None,
        segment_bytes: int,
        sync: bool,
        on_written: Callable[[Written], None],
        annotate: Callable[[bytes, int, int], bytes],
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.sync = sync
        self.on_written = on_written
        self.annotate = annotate
        self._fd = -1
        self._first = -1  # the active segment's first sequence number
        self._size = 0
        self._mark = -INDEX_EVERY
        if active is not None:
            self._fd = os.open(active.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._first, self._size = active.first, active.size
            self._mark = active.index[-1][1] if active.index else -INDEX_EVERY
        self._last_time = 0
        self._queue: queue.SimpleQueue[tuple[int, int, bytes, object] | None] = queue.SimpleQueue()
        self.errors = 0
        self._thread = threading.Thread(
            target=self._run, name=f"scow-stream-{directory.name}", daemon=True
        )
        self._thread.start()

    def append(self, seq: int, message_id: int, data: bytes, token: object) -> None:
        self._queue.put((seq, message_id, data, token))

    def delete(self, paths: list[Path]) -> None:
        """Delete whole segment files (retention) on the writer thread."""
        self._queue.put((-1, 0, b"", paths))

    def close(self) -> None:
        """Write what is queued, stop the thread, close the file. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        while True:
            item = get()
            batch = []
            while item is not None:
                batch.append(item)
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            try:
                self._write(batch)
            except OSError:
                self.errors += 1
                log.exception("stream write failed", directory=str(self.directory))
            if item is None:
                return

    def _roll(self, first: int, now: int, written: Written) -> None:
        if self._fd >= 0:
            if self.sync:
                os.fdatasync(self._fd)
            os.close(self._fd)
            written.sizes[self._first] = self._size
        path = _segment_path(self.directory, first)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        if self.sync:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._first, self._size, self._mark = first, 0, -INDEX_EVERY
        written.new_segments.append(Segment(first, path, index=[], first_time=now))

    def _write(self, batch: list[tuple[int, int, bytes, object]]) -> None:
        records: list[bytes] = []
        written = Written(last_seq=-1)
        annotate, pack = self.annotate, RECORD.pack
        for seq, message_id, data, token in batch:
            if seq < 0:
                self._flush(records)
                for path in token:  # type: ignore[attr-defined]
                    path.unlink(missing_ok=True)
                continue
            now = max(int(time.time() * 1000), self._last_time)
            self._last_time = now
            if self._fd < 0 or self._size >= self.segment_bytes:
                self._flush(records)
                self._roll(seq, now, written)
            record = pack(seq, now, message_id) + annotate(data, seq, now)
            if self._size - self._mark >= INDEX_EVERY:
                written.index.append((self._first, (seq, self._size, now)))
                self._mark = self._size
            records.append(record)
            self._size += HEADER_SIZE + len(record)
            written.last_seq = seq
            written.tokens.append(token)
        self._flush(records)
        if written.last_seq < 0 and not written.new_segments:
            return
        if self.sync and self._fd >= 0:
            os.fdatasync(self._fd)
        written.sizes[self._first] = self._size
        self.on_written(written)

    def _flush(self, records: list[bytes]) -> None:
        if not records:
            return
        data = frame_all(records)
        records.clear()
        offset = self._size - len(data)
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view = view[n:]
            offset += n


def read_range(
    segments: list[Segment], seq: int, end: int, limit: int
) -> tuple[list[tuple[int, int, bytes]], int]:
    """Up to `limit` records from sequence `seq` (or the first kept after it) below `end`:
    [(sequence, enqueue time, message bytes)], and the sequence number to read next.

    Only records below `end` (synced ones) are returned; a segment deleted meanwhile is
    skipped (retention made a gap).
    """
    out: list[tuple[int, int, bytes]] = []
    if not segments:
        return out, seq
    if seq < segments[0].first:
        seq = segments[0].first  # retention removed what came before: a gap
    at = bisect.bisect_right([s.first for s in segments], seq) - 1
    while at < len(segments) and len(out) < limit and seq < end:
        segment = segments[at]
        index = segment.index if segment.index is not None else segment.build_index()
        i = bisect.bisect_right(index, (seq, 1 << 62, 0)) - 1
        offset = index[i][1] if i >= 0 else 0
        size = segment.size
        try:
            fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            at += 1  # deleted by retention meanwhile
            continue
        try:
            while len(out) < limit and seq < end and offset < size:
                data = os.pread(fd, min(READ_CHUNK, size - offset), offset)
                consumed = 0
                for _start, payload, frame_end in iter_frames(data, verified=True):
                    rseq, enqueued, _mid = RECORD.unpack_from(data, payload)
                    consumed = frame_end
                    if rseq < seq:
                        continue
                    if rseq >= end or len(out) >= limit:
                        return out, rseq
                    out.append((rseq, enqueued, data[payload + RECORD.size : frame_end]))
                    seq = rseq + 1
                if consumed == 0:
                    if len(data) >= READ_CHUNK:  # one record larger than a chunk
                        head = os.pread(fd, HEADER_SIZE, offset)
                        length = int.from_bytes(head[:4], "big")
                        data = os.pread(fd, HEADER_SIZE + length, offset)
                        for _s, payload, frame_end in iter_frames(data, verified=True):
                            rseq, enqueued, _mid = RECORD.unpack_from(data, payload)
                            if rseq >= seq:
                                out.append(
                                    (rseq, enqueued, data[payload + RECORD.size : frame_end])
                                )
                                seq = rseq + 1
                            consumed = frame_end
                    if consumed == 0:
                        break
                offset += consumed
        finally:
            os.close(fd)
        at += 1
        if at < len(segments):
            seq = max(seq, segments[at].first)
    return out, seq


def seek_time(segments: list[Segment], when: int, next_seq: int) -> int:
    """The sequence number of the first record enqueued at or after `when` (ms)."""
    if not segments:
        return next_seq
    at = max(bisect.bisect_right([s.first_time for s in segments], when) - 1, 0)
    while at < len(segments):
        segment = segments[at]
        index = segment.build_index()
        i = max(bisect.bisect_left([e[2] for e in index], when) - 1, 0)
        offset = index[i][1] if index else 0
        with open(segment.path, "rb") as f:
            f.seek(offset)
            data = f.read(segment.size - offset)
        for _start, payload, _end in iter_frames(data, verified=True):
            seq, enqueued, _mid = RECORD.unpack_from(data, payload)
            if enqueued >= when:
                return int(seq)
        at += 1
    return next_seq
