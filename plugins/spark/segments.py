"""The file stream store: a stream's records in append-only segment files of CRC'd frames.

Each record is `RECORD` (sequence number, enqueue time in ms, broker message id) and the
message's bytes as delivered, framed by `scow.core.page_frames`. A segment file is named
by the sequence number of its first record, so a sealed segment ends where the next one
starts; whole files are deleted (retention). The stream's cursors are `cursors.json`
beside the segments, replaced atomically (write, fsync, rename).

Threads: the writer thread appends, syncs and deletes; readers read at the same time.
Both share the list of segments (under a lock): a reader takes a snapshot, and sees a
segment's records up to the size its last synced append left. The sparse index of a
segment (a (sequence, offset, time) entry every `INDEX_EVERY` bytes) is built at open for
the last two segments, as appends go, and for older ones by their first read (one scan
of the file, on the reader's thread).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from scow.core import disk_monitor
from scow.core.descriptors import StreamStoreBackend
from scow.core.interfaces import StreamAppended, StreamContents, StreamRecord, StreamSegment
from scow.core.page_frames import (
    HEADER_SIZE,
    frame_all,
    iter_frames,
    next_valid_frame,
    salvaged_frames,
)
from scow.plugins.spark.records import RECORD

log = structlog.get_logger("scow.stream")

#: What the log says of a frame damaged on disk: its record is lost, never delivered.
UNREADABLE = "stream record unreadable: a damaged frame; read on at its next valid record"
#: Bytes between two sparse index entries.
INDEX_EVERY = 32 << 10
#: Bytes read per positioned read.
READ_CHUNK = 256 << 10
SUFFIX = ".seg"
CURSORS_FILE = "cursors.json"

_IndexEntry = tuple[int, int, int]


@dataclass(slots=True)
class _Segment:
    """One segment file: its first sequence number, synced size and sparse index."""

    first: int
    path: Path
    size: int = 0
    #: (sequence, offset, enqueue time) every INDEX_EVERY bytes; None until built.
    index: list[_IndexEntry] | None = None
    first_time: int = 0
    #: Frames found damaged on disk: offset -> where the next valid one starts (its end
    #: of data when none does). Readers pass over them; each is logged once.
    damaged: dict[int, int] = field(default_factory=dict)

    def info(self) -> StreamSegment:
        return StreamSegment(self.first, self.size, self.first_time)

    def build_index(self) -> list[_IndexEntry]:
        """The index, scanning the file for it the first time (a reader's thread)."""
        index = self.index
        if index is not None:
            return index
        with open(self.path, "rb") as f:
            data = f.read(self.size)
        index = []
        last = -INDEX_EVERY
        for start, payload, _end in self.frames(data):
            if start - last >= INDEX_EVERY:
                seq, enqueued, _mid = RECORD.unpack_from(data, payload)
                index.append((seq, start, enqueued))
                last = start
        self.index = index
        return index

    def frames(
        self, data: bytes, base: int = 0, *, torn_tail: bool = False
    ) -> list[tuple[int, int, int]]:
        """(start, payload, end) of each valid frame of `data` (the segment's bytes from
        `base` on), past any damaged one, which is noted and logged. Bytes after the last
        valid frame are damage too, unless `torn_tail` (a segment read whole at the start,
        whose tail a crash may have torn)."""
        frames, damaged = salvaged_frames(data)
        for start, resume in damaged:
            self.passed_over(base + start, base + resume)
        valid = frames[-1][2] if frames else 0
        if valid < len(data) and not torn_tail:  # nothing valid follows, to the end
            self.passed_over(base + valid, base + len(data))
        return frames

    def passed_over(self, start: int, resume: int) -> None:
        """The frame at `start` is damaged; readers go on at `resume`."""
        if start not in self.damaged:
            self.damaged[start] = resume
            log.error(
                UNREADABLE,
                segment=str(self.path),
                offset=start,
                bytes_lost=resume - start,
            )


@dataclass(slots=True)
class _Undo:
    """The writer's figures before an append, and the files the append sealed and made."""

    fd: int
    size: int
    mark: int
    segments: int
    sealed: list[int] = field(default_factory=list)
    made: list[tuple[int, Path]] = field(default_factory=list)


class FileStreamStore:
    """One stream's segment files under `directory` (see the module docstring)."""

    def __init__(self, directory: Path, name: str, segment_bytes: int, sync: bool = True) -> None:
        self.directory = directory
        self.name = name
        self.segment_bytes = segment_bytes
        self.sync = sync
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._fd = -1  # the last segment's, for appends
        self._mark = -INDEX_EVERY  # offset of the last segment's last index entry

    # ------------------------------------------------------------------ opening

    def open(self) -> StreamContents:
        self.directory.mkdir(parents=True, exist_ok=True)
        segments = []
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            try:
                first = int(path.stem)
            except ValueError:
                continue
            segments.append(_Segment(first, path, path.stat().st_size))
        next_seq = segments[-1].first if segments else 0
        ids: set[int] = set()
        tail = segments[-2:]
        for position, segment in enumerate(tail):
            last = position == len(tail) - 1
            data = segment.path.read_bytes()
            index: list[_IndexEntry] = []
            mark = -INDEX_EVERY
            end = 0
            for start, payload, frame_end in segment.frames(data, torn_tail=True):
                seq, enqueued, message_id = RECORD.unpack_from(data, payload)
                ids.add(message_id)
                if start - mark >= INDEX_EVERY:
                    index.append((seq, start, enqueued))
                    mark = start
                end = frame_end
                if last:
                    next_seq = seq + 1
            if last:
                if end < len(data):
                    log.warning("stream segment tail cut", segment=str(segment.path), at=end)
                    with open(segment.path, "r+b") as f:
                        f.truncate(end)
                        os.fsync(f.fileno())
                segment.size = end
                self._mark = mark
            segment.index = index
        for segment in segments:
            segment.first_time = segment.index[0][2] if segment.index else _first_time(segment)
        self._segments = segments
        if segments:
            self._fd = os.open(segments[-1].path, os.O_WRONLY | os.O_CLOEXEC)
        return StreamContents([s.info() for s in segments], next_seq, ids)

    # ------------------------------------------------------------------ writing

    def append(self, records: Sequence[StreamRecord]) -> StreamAppended:
        appended = StreamAppended()
        segments = self._segments
        undo = _Undo(self._fd, segments[-1].size if segments else 0, self._mark, len(segments))
        size = undo.size
        first = segments[-1].first if segments else -1
        frames: list[bytes] = []
        index: list[tuple[int, _IndexEntry]] = []  # (segment first, entry), applied when in
        pack = RECORD.pack
        try:
            for seq, enqueued, message_id, data in records:
                if self._fd < 0 or size >= self.segment_bytes:
                    self._write(frames, size)
                    if self._fd >= 0:
                        appended.sizes[first] = size
                    first, size = seq, 0
                    self._roll(seq, enqueued, appended, undo)
                record = pack(seq, enqueued, message_id) + data
                if size - self._mark >= INDEX_EVERY:
                    index.append((first, (seq, size, enqueued)))
                    self._mark = size
                frames.append(record)
                size += HEADER_SIZE + len(record)
            self._write(frames, size)
            if self.sync:
                os.fdatasync(self._fd)
        except OSError:
            self._undo(undo)
            raise
        for fd in undo.sealed:
            os.close(fd)
        appended.sizes[first] = size
        with self._lock:
            by_first = {s.first: s for s in self._segments[max(undo.segments - 1, 0) :]}
            for segment_first, entry in index:
                segment_index = by_first[segment_first].index
                if segment_index is not None:
                    segment_index.append(entry)
            for segment_first, segment_size in appended.sizes.items():
                by_first[segment_first].size = segment_size
        return appended

    def _roll(self, first: int, now: int, appended: StreamAppended, undo: _Undo) -> None:
        if self._fd >= 0:
            if self.sync:
                os.fdatasync(self._fd)
            undo.sealed.append(self._fd)  # closed once the append is in
        # the disk monitor checks now, with room for a whole segment (not at its next scan)
        disk_monitor.allocating(self.directory, self.segment_bytes)
        path = self.directory / f"{first:020d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        undo.made.append((fd, path))
        self._fd = fd
        if self.sync:
            _sync_directory(self.directory)
        self._mark = -INDEX_EVERY
        segment = _Segment(first, path, index=[], first_time=now)
        with self._lock:
            self._segments.append(segment)
        appended.new_segments.append(segment.info())

    def _write(self, frames: list[bytes], end: int) -> None:
        """Write `frames`, which end at byte `end` of the last segment."""
        if not frames:
            return
        data = frame_all(frames)
        frames.clear()
        offset = end - len(data)
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            view = view[n:]
            offset += n

    def _undo(self, undo: _Undo) -> None:
        """Put the store back as it was before a failed append: no hole, no new file."""
        with self._lock:
            del self._segments[undo.segments :]
        for fd, path in undo.made:
            os.close(fd)
            path.unlink(missing_ok=True)
        self._fd, self._mark = undo.fd, undo.mark
        if self._fd >= 0:
            try:
                os.ftruncate(self._fd, undo.size)  # frees the space; writes go at offsets
            except OSError:
                log.exception("stream segment not cut back", directory=str(self.directory))

    def delete_segments(self, firsts: Sequence[int]) -> None:
        gone = set(firsts)
        with self._lock:
            # never the one appended to: retention keeps the last segment
            doomed = [s for s in self._segments[:-1] if s.first in gone]
            self._segments = [s for s in self._segments if s not in doomed]
        for segment in doomed:
            segment.path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ reading

    def read(self, seq: int, end: int, limit: int) -> tuple[list[tuple[int, int, bytes]], int]:
        out: list[tuple[int, int, bytes]] = []
        with self._lock:
            segments = [(s, s.size) for s in self._segments]
        if not segments:
            return out, seq
        seq = max(seq, segments[0][0].first)  # retention removed what came before: a gap
        at = bisect.bisect_right([s.first for s, _size in segments], seq) - 1
        while at < len(segments) and len(out) < limit and seq < end:
            segment, size = segments[at]
            with contextlib.suppress(FileNotFoundError):  # deleted by retention meanwhile
                seq = _read_segment(segment, size, seq, end, limit, out)
            if len(out) >= limit or seq >= end:
                break  # stopped inside this segment: go on from `seq` next time
            at += 1
            if at < len(segments):
                seq = max(seq, segments[at][0].first)
        return out, seq

    def seek(self, when: int) -> int | None:
        with self._lock:
            segments = [(s, s.size) for s in self._segments]
        at = max(bisect.bisect_right([s.first_time for s, _size in segments], when) - 1, 0)
        for segment, size in segments[at:]:
            try:
                index = segment.build_index()
                i = max(bisect.bisect_left([e[2] for e in index], when) - 1, 0)
                offset = index[i][1] if index else 0
                with open(segment.path, "rb") as f:
                    f.seek(offset)
                    data = f.read(size - offset)
            except FileNotFoundError:
                continue
            for _start, payload, _end in segment.frames(data, offset):
                seq, enqueued, _mid = RECORD.unpack_from(data, payload)
                if enqueued >= when:
                    return int(seq)
        return None

    # ------------------------------------------------------------------ cursors

    def load_cursors(self) -> dict[str, tuple[int, int]]:
        path = self.directory / CURSORS_FILE
        if not path.exists():
            return {}
        stored = json.loads(path.read_text())
        return {n: (int(c["sequence"]), int(c["used"])) for n, c in stored.items()}

    def save_cursors(self, cursors: Mapping[str, tuple[int, int]]) -> None:
        path = self.directory / CURSORS_FILE
        partial = path.with_suffix(".tmp")
        with open(partial, "w") as f:
            json.dump({n: {"sequence": s, "used": u} for n, (s, u) in cursors.items()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _read_segment(
    segment: _Segment, size: int, seq: int, end: int, limit: int, out: list[tuple[int, int, bytes]]
) -> int:
    """Append to `out` the records of `segment` from `seq` below `end` (up to `limit` in
    `out`); the sequence number to read next.

    Every frame's CRC is checked once per run: a segment's at its first read (the index
    build) or at the start (the last two), and what this run appends it wrote itself.
    In a segment where that found damage, reads check each frame again and pass over the
    damaged ones (`_Segment.passed_over`): never delivered."""
    index = segment.build_index()
    verified = not segment.damaged
    i = bisect.bisect_right(index, (seq, 1 << 62, 0)) - 1
    offset = index[i][1] if i >= 0 else 0
    fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while len(out) < limit and seq < end and offset < size:
            resume = segment.damaged.get(offset)
            if resume is not None:
                offset = resume
                continue
            data = os.pread(fd, min(READ_CHUNK, size - offset), offset)
            consumed = 0
            for _start, payload, frame_end in iter_frames(data, verified=verified):
                rseq, enqueued, _mid = RECORD.unpack_from(data, payload)
                consumed = frame_end
                if rseq < seq:
                    continue
                if rseq >= end or len(out) >= limit:
                    return int(rseq)
                out.append((rseq, enqueued, data[payload + RECORD.size : frame_end]))
                seq = rseq + 1
            if consumed == 0:  # one record larger than a chunk, or a damaged frame
                head = os.pread(fd, HEADER_SIZE, offset)
                length = HEADER_SIZE + int.from_bytes(head[:4], "big")
                if offset + length <= size:
                    data = os.pread(fd, length, offset)
                    for _start, payload, frame_end in iter_frames(data, verified=verified):
                        rseq, enqueued, _mid = RECORD.unpack_from(data, payload)
                        if rseq >= seq:
                            out.append((rseq, enqueued, data[payload + RECORD.size : frame_end]))
                            seq = rseq + 1
                        consumed = frame_end
                if consumed == 0:
                    rest = os.pread(fd, size - offset, offset)
                    found = next_valid_frame(rest, 0)
                    segment.passed_over(offset, size if found is None else offset + found)
                    continue
            offset += consumed
    finally:
        os.close(fd)
    return seq


def _first_time(segment: _Segment) -> int:
    """The enqueue time of the segment's first record; for an empty one (rolled just
    before a stop), when the file was made, so time retention does not take it as old."""
    with open(segment.path, "rb") as f:
        head = f.read(HEADER_SIZE + RECORD.size)
    if len(head) < HEADER_SIZE + RECORD.size:
        return int(segment.path.stat().st_mtime * 1000)
    return int(RECORD.unpack_from(head, HEADER_SIZE)[1])


def _sync_directory(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


#: Where the streams' folders are, under the data dir.
DIRECTORY = "streams"


def directory_name(queue_name: str) -> str:
    """A file name for the queue: safe characters kept, a hash keeps names distinct."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in queue_name)[:100]
    return f"{safe}-{hashlib.sha256(queue_name.encode()).hexdigest()[:12]}"


def open_store(
    data_dir: Path, name: str, segment_bytes: int, settings: Mapping[str, object]
) -> FileStreamStore:
    """The file backend's factory: `<data-dir>/streams/<name, made safe>`."""
    return FileStreamStore(data_dir / DIRECTORY / directory_name(name), name, segment_bytes)


def discard(data_dir: Path, settings: Mapping[str, object]) -> None:
    """Remove every stream's segment files (`<data-dir>/streams`)."""
    directory = data_dir / DIRECTORY
    if directory.exists():
        shutil.rmtree(directory)


BACKEND = StreamStoreBackend(
    "file",
    open_store,
    "segment files, one folder per stream, under <data-dir>/streams",
    discard=discard,
)
