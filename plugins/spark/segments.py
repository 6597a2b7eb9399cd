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

from scow.core import disk_monitor
from scow.core.disk_monitor import is_no_space
from scow.core.page_frames import HEADER_SIZE, frame_all, iter_frames
from scow.plugins.spark.records import RECORD

log = structlog.get_logger("scow.stream")

#: Bytes between two sparse index entries.
INDEX_EVERY = 32 << 10
#: Bytes read per positioned read.
READ_CHUNK = 256 << 10
SUFFIX = ".seg"
#: Seconds between attempts to write what a full file system refused.
RETRY = 1.0


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


_Item = tuple[int, int, bytes, object]


@dataclass(slots=True)
class _Undo:
    """The writer's figures before a batch, and the files the batch sealed and made."""

    fd: int
    first: int
    size: int
    mark: int
    sealed: list[int] = field(default_factory=list)
    made: list[tuple[int, Path]] = field(default_factory=list)


class Log:
    """The writer side of one stream's segments: a thread that appends and syncs.

    `append(seq, message_id, data, token)` queues a record (sequence numbers given in
    order by the loop); the thread writes what is queued, fdatasyncs once, and calls
    `on_written(Written)` (which must hand over to the loop itself). The thread keeps its
    own figures of the segment it writes: `Segment` objects belong to the loop.

    A batch lands whole or not at all: a write, sync or new segment the file system
    refuses for lack of space undoes the batch (the segment cut back to where it was,
    segments it made removed) and holds its records, with everything queued after them,
    to be written again every `RETRY` seconds (at once when more comes) until space
    returns. Meanwhile the disk monitor holds producers back (`out_of_space`), and no
    token is handed back, so the stream acknowledges nothing that is not on disk; a
    segment never has a hole that would hide what follows it.
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
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self.errors = 0
        #: Records a full file system refused, waiting to be written again (their number).
        self.held = 0
        self._owner = f"stream {directory}"
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
        held: list[_Item] = []
        problem: str | None = None  # why held records wait (reported to the disk monitor)
        while True:
            batch, held = held, []
            stopping = False
            try:  # with records held, new work tries again at once, else every RETRY s
                item = get(timeout=RETRY if batch else None)
                while item is not None:
                    batch.append(item)
                    item = get_nowait()
                stopping = True
            except queue.Empty:
                pass
            try:
                held = self._write(batch)
            except OSError:
                self.errors += 1
                log.exception("stream write failed", directory=str(self.directory))
            self.held = len(held)
            if held and problem is None:
                problem = disk_monitor.describe_no_room(self.directory, "a stream write")
                log.warning(
                    "stream write refused: file system full; producers held back and the "
                    "write tried again until space returns",
                    directory=str(self.directory),
                    records=len(held),
                )
                disk_monitor.out_of_space(self.directory, self._owner, problem)
            elif not held and problem is not None:
                problem = None
                log.info("stream writes go on: the file system has room again")
                disk_monitor.out_of_space(self.directory, self._owner, None)
            if stopping:
                if held:
                    # still journaled (not acknowledged): recovery appends them again
                    log.error(
                        "stream records not written at shutdown: file system full",
                        directory=str(self.directory),
                        records=len(held),
                    )
                    disk_monitor.out_of_space(self.directory, self._owner, None)
                return

    def _roll(self, first: int, now: int, written: Written, undo: _Undo) -> None:
        if self._fd >= 0:
            if self.sync:
                os.fdatasync(self._fd)
            undo.sealed.append(self._fd)  # closed once the batch is in
            written.sizes[self._first] = self._size
        # the disk monitor checks now, with room for a whole segment (not at its next scan)
        disk_monitor.allocating(self.directory, self.segment_bytes)
        path = _segment_path(self.directory, first)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        undo.made.append((fd, path))
        self._fd = fd
        if self.sync:
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._first, self._size, self._mark = first, 0, -INDEX_EVERY
        written.new_segments.append(Segment(first, path, index=[], first_time=now))

    def _write(self, batch: list[_Item]) -> list[_Item]:
        """Write and sync `batch`; the records a full file system refused (the whole batch's,
        in order), or [] once they are in."""
        records: list[bytes] = []
        items: list[_Item] = []
        for item in batch:
            if item[0] < 0:  # retention: older segments than any a write touches
                for path in item[3]:  # type: ignore[attr-defined]
                    path.unlink(missing_ok=True)
            else:
                items.append(item)
        if not items:
            return []
        written = Written(last_seq=-1)
        undo = _Undo(self._fd, self._first, self._size, self._mark)
        annotate, pack = self.annotate, RECORD.pack
        try:
            for seq, message_id, data, token in items:
                now = max(int(time.time() * 1000), self._last_time)
                self._last_time = now
                if self._fd < 0 or self._size >= self.segment_bytes:
                    self._flush(records)
                    self._roll(seq, now, written, undo)
                record = pack(seq, now, message_id) + annotate(data, seq, now)
                if self._size - self._mark >= INDEX_EVERY:
                    written.index.append((self._first, (seq, self._size, now)))
                    self._mark = self._size
                records.append(record)
                self._size += HEADER_SIZE + len(record)
                written.last_seq = seq
                written.tokens.append(token)
            self._flush(records)
            if self.sync:
                os.fdatasync(self._fd)
        except OSError as exc:
            self._undo(undo)
            if is_no_space(exc):
                return items
            raise  # the batch is dropped, still journaled: recovery appends it again
        for fd in undo.sealed:
            os.close(fd)
        written.sizes[self._first] = self._size
        self.on_written(written)
        return []

    def _undo(self, undo: _Undo) -> None:
        """Put the log back as it was before a batch that failed: no hole, no new file."""
        for fd, path in undo.made:
            os.close(fd)
            path.unlink(missing_ok=True)
        self._fd, self._first, self._size, self._mark = undo.fd, undo.first, undo.size, undo.mark
        if self._fd >= 0:
            try:
                os.ftruncate(self._fd, self._size)  # frees the space; writes go at offsets
            except OSError:
                log.exception("stream segment not cut back", directory=str(self.directory))

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
