"""Writing batches to journal files: buffered writes (NIO) or O_DIRECT writes (AIO).

The journal hands over `Batch`es: a list of `Segment`s (bytes for one file from one
offset) with the completions of every record in them. `FileWriter.write` puts the bytes
on disk; `FileWriter.sync` makes every file written since the last sync durable with
one fdatasync (or fsync) per file. The journal's writer thread decides when, so that one
sync covers many records (group commit).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from dataclasses import dataclass

import structlog

from scow.core.interfaces import Completion

from .files import JFile, fsync_dir, sync_fd
from .format import ALIGNMENT


@dataclass(slots=True)
class JournalCounters:
    """Instrumentation; read it from tests and stats, never reset it."""

    #: write batches taken from the append buffer
    batches: int = 0
    #: pwrite calls
    writes: int = 0
    #: fdatasync / fsync calls on journal files
    syncs: int = 0
    bytes_written: int = 0
    #: files created (zero-filled) and recycled (reclaimed and put back in the pool)
    files_created: int = 0
    files_recycled: int = 0
    files_deleted: int = 0
    #: files created on the appending thread because no spare was ready
    files_created_inline: int = 0
    compactions: int = 0


@dataclass(slots=True)
class Segment:
    """Bytes to write into `file` starting at `offset`; `last` when the file is sealed."""

    file: JFile
    offset: int
    chunks: list[bytes]
    last: bool = False


@dataclass(slots=True)
class Batch:
    """What the writer thread takes from the append buffer in one go."""

    number: int
    segments: list[Segment]
    completions: list[Completion]
    sync: bool
    #: bytes appended into it
    size: int = 0


def round_up(n: int, align: int = ALIGNMENT) -> int:
    return (n + align - 1) // align * align


class FileWriter:
    """Owns the write file descriptors; used by the writer (and syncer) threads only."""

    def __init__(
        self, *, aio: bool, datasync: bool, buffer_size: int, counters: JournalCounters
    ) -> None:
        self.aio = aio
        self.datasync = datasync
        self.counters = counters
        self._dirty: set[JFile] = set()
        self._dirty_lock = threading.Lock()
        self._stage: mmap.mmap | None = None
        self._stage_view: memoryview | None = None
        if aio:
            self._make_stage(buffer_size)

    def _make_stage(self, buffer_size: int) -> None:
        # Anonymous mmap memory is page-aligned, which is what O_DIRECT needs.
        size = round_up(max(buffer_size, 256 * 1024))
        self._stage = mmap.mmap(-1, size)
        self._stage_view = memoryview(self._stage)

    def fall_back_to_nio(self, path: str, error: OSError) -> None:
        """Switch to buffered writes for good, with one log line saying why."""
        if not self.aio:
            return
        self.aio = False
        structlog.get_logger().warning(
            "journal AIO unavailable: O_DIRECT refused; falling back to NIO",
            file=path,
            error=str(error),
        )

    def _open(self, f: JFile) -> int:
        if f.fd >= 0:
            return f.fd
        if self.aio:
            try:
                f.fd = os.open(f.path, os.O_WRONLY | getattr(os, "O_DIRECT", 0))
                return f.fd
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                    raise
                self.fall_back_to_nio(f.path, exc)
        f.fd = os.open(f.path, os.O_WRONLY)
        return f.fd

    def write(self, batch: Batch) -> None:
        """Write every segment of `batch` (no sync)."""
        for seg in batch.segments:
            if not seg.chunks:
                continue
            fd = self._open(seg.file)
            if self.aio:
                self._write_direct(fd, seg)
            else:
                data = b"".join(seg.chunks)
                self._pwrite_all(fd, data, seg.offset)
            with self._dirty_lock:
                self._dirty.add(seg.file)

    def _pwrite_all(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)
            self.counters.writes += 1
        self.counters.bytes_written += done

    def _write_direct(self, fd: int, seg: Segment) -> None:
        # O_DIRECT: copy into the aligned staging buffer, write whole blocks.
        if seg.offset % ALIGNMENT:
            raise AssertionError(f"O_DIRECT segment at unaligned offset {seg.offset}")
        stage = self._stage
        view = self._stage_view
        assert stage is not None and view is not None
        cap = len(stage)
        fill = 0
        offset = seg.offset
        for chunk in seg.chunks:
            n = len(chunk)
            if n <= cap - fill:
                stage[fill : fill + n] = chunk
                fill += n
                if fill == cap:
                    self._pwrite_all(fd, view, offset)
                    offset += cap
                    fill = 0
                continue
            src = memoryview(chunk)
            p = 0
            while p < n:
                k = min(cap - fill, n - p)
                stage[fill : fill + k] = src[p : p + k]
                fill += k
                p += k
                if fill == cap:
                    self._pwrite_all(fd, view, offset)
                    offset += cap
                    fill = 0
        if fill:
            padded = round_up(fill)
            stage[fill:padded] = bytes(padded - fill)
            self._pwrite_all(fd, view[:padded], offset)

    def sync(self) -> None:
        """Make everything written so far durable."""
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
        for f in dirty:
            if f.fd >= 0:
                self._sync(f)

    def _sync(self, f: JFile) -> None:
        """Make what was written to `f` durable, and `f` itself when it was made unsynced."""
        if f.entry_unsynced:
            os.fsync(f.fd)  # its size and allocation too, whatever journal-datasync says
            fsync_dir(os.path.dirname(f.path) or ".")
            f.entry_unsynced = False
        else:
            sync_fd(f.fd, self.datasync)
        self.counters.syncs += 1

    def close(self, f: JFile) -> None:
        """Sync and close a sealed file: later syncs no longer need to cover it."""
        with self._dirty_lock:
            dirty = f in self._dirty
            self._dirty.discard(f)
        if f.fd >= 0:
            try:
                if dirty:
                    self._sync(f)
            finally:
                os.close(f.fd)
                f.fd = -1

    def close_all(self, files: list[JFile]) -> None:
        for f in files:
            if f.fd >= 0:
                self.close(f)
        if self._stage is not None:
            if self._stage_view is not None:
                self._stage_view.release()
                self._stage_view = None
            self._stage.close()
            self._stage = None


def probe_direct_io(directory: str) -> OSError | None:
    """None when O_DIRECT works in `directory`, else the error that refused it."""
    if not hasattr(os, "O_DIRECT"):
        return OSError(errno.EINVAL, "O_DIRECT is not available on this platform")
    path = os.path.join(directory, f".scow-odirect-probe-{os.getpid()}-{threading.get_ident()}")
    buf = mmap.mmap(-1, ALIGNMENT)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        try:
            os.pwrite(fd, memoryview(buf), 0)
        finally:
            os.close(fd)
        return None
    except OSError as exc:
        return exc
    finally:
        buf.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
