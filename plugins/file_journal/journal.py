"""`FileJournal`: the append-only record journal on fixed-size files.

Threads:

* the caller (the broker's event loop) appends: one struct.pack, a CRC and a few list and
  dict operations under `_lock`, nothing that touches the disk;
* the writer thread takes everything appended so far as one `Batch`, writes it and syncs
  once (group commit), then hands all its completions to the dispatcher in one call;
  with `journal-max-io` > 1 a syncer thread syncs and completes while the writer already
  writes the next batch;
* the files thread keeps a spare file ready, so rolling to a new file does not wait for
  a 10 MiB zero fill;
* the maintenance thread reclaims dead files after each roll and starts compaction.

A full file system: appends never meet it, since they write into files zero-filled in
advance; making the next file does. When the files thread cannot make a spare for lack of
space, the journal goes on with the file it has: it tells the disk monitor (which blocks
producers), keeps the second half of the current file for records that free space or
settle what exists (deletes, updates, commits, rollbacks) and refuses new records there,
and refuses any record that would need a new file, with `StorageFull` and nothing changed.
The files thread retries every `_RETRY` seconds (or as soon as reclaim frees a file) and
lifts all of it once a spare is at hand. Nothing is ever half-done: a roll takes its spare
before it seals the current file.

Reclaim bookkeeping (see `files.JFile`): every reference from the live state to a file
(a live add or update, an open transaction's record, a prepare record) counts one in that
file's `pos`; deletes, commits and rollbacks add the earlier files they refer to to their
own file's `neg`. A file is reclaimable when its `pos` is zero and every file in its
`neg` is reclaimable or gone.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import structlog

from scow.core import critical, disk_monitor, open_files
from scow.core.disk_monitor import NO_FILES_ERRNOS, is_no_room, no_room_reason
from scow.core.interfaces import Completion, LoadResult
from scow.core.model import StorageFull

from . import compactor
from .errors import JournalError
from .files import (
    FileState,
    JFile,
    UpdatedRecord,
    create_file,
    first_record_epoch,
    fsync_dir,
    list_files,
    move_to_attic,
    read_block,
    write_header,
)
from .format import (
    ALIGNMENT,
    DATA_START,
    FILE_HEADER,
    FLAG_REPLACEABLE,
    FREE_EPOCH,
    HEADER_SIZE,
    RECORD_CRC,
    RECORD_REST,
    Kind,
    decode_file_header,
    encode_file_header,
    encode_pairs,
    encode_record,
    file_name,
)
from .replay import LoadedTx, Replay
from .settings import JournalSettings
from .writer import Batch, FileWriter, JournalCounters, Segment, probe_direct_io

_PACK_REST = RECORD_REST.pack
_PACK_CRC = RECORD_CRC.pack
_crc32 = zlib.crc32
_NEVER = 1 << 62
_SPARES = 1
#: Seconds between attempts to make a spare file while the file system is full.
_RETRY = 1.0

_ADD = int(Kind.ADD)
_UPDATE = int(Kind.UPDATE)
_DELETE = int(Kind.DELETE)
_ADD_TX = int(Kind.ADD_TX)
_UPDATE_TX = int(Kind.UPDATE_TX)
_DELETE_TX = int(Kind.DELETE_TX)

# lifecycle
_NEW, _OPEN, _CLOSING, _STOPPED = 0, 1, 2, 3


class _Tx:
    """An open transaction: its records (kind, id, type, flags, file) and pins."""

    __slots__ = ("counts", "ops", "prep")

    def __init__(self) -> None:
        self.ops: list[tuple[int, int, int, int, JFile]] = []
        self.counts: dict[JFile, int] = {}
        self.prep: JFile | None = None

    def pairs(self) -> list[tuple[int, int]]:
        return [(f.epoch, n) for f, n in self.counts.items()]


def _run_completions(completions: list[Completion]) -> None:
    """Default dispatcher: run the completions right here, on the writer thread."""
    for done in completions:
        try:
            done()
        except Exception:
            structlog.get_logger().exception("journal completion raised")


class FileJournal:
    """A `Journal` stored in `<prefix>-<n>.<extension>` files under `settings.directory`.

    `compaction_hook`, when given, is called with the name of each compaction stage as it
    is reached (see `compactor.STAGES`); tests use it to crash at every stage.
    """

    def __init__(
        self,
        settings: JournalSettings,
        *,
        dispatcher: Callable[[list[Completion]], None] | None = None,
        compaction_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.directory = os.path.abspath(settings.directory)
        self.counters = JournalCounters()
        self._dispatch: Callable[[list[Completion]], None] = dispatcher or _run_completions
        self.compaction_hook = compaction_hook
        self._file_size = settings.journal_file_size
        # room for the EOF record that seals a file is always kept free
        self._limit = self._file_size - HEADER_SIZE
        #: Where the add path stops to think (`_make_room`): `_limit`, or while no spare
        #: file is at hand, `_limit - _reserve`, the rest of the file being kept for
        #: records that free space when no spare can be made. One comparison, as before.
        self._add_limit = self._limit
        self._reserve = (self._file_size - DATA_START) // 2
        #: Why no spare file can be made (the file system is full), or None.
        self._no_room: str | None = None
        #: Record types whose adds are refused in the reserve (None: every add).
        self._held: frozenset[int] | None = None
        self._sync_nontx = settings.journal_sync_non_transactional
        self._sync_tx = settings.journal_sync_transactional
        self._timeout = (settings.journal_buffer_timeout or 0) / 1e9
        self._bufsize = settings.journal_buffer_size
        self._max_io = settings.journal_max_io or 1
        #: "AIO" or "NIO": what is actually used (AIO falls back to NIO)
        self.effective_type = settings.journal_type

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # wakes the writer
        self._done_cond = threading.Condition(self._lock)  # wakes flush() callers
        self._files_cond = threading.Condition(self._lock)  # wakes the files thread
        self._maint_cond = threading.Condition(self._lock)  # wakes the maintenance thread
        self._maint_lock = threading.Lock()  # one reclaim or compaction at a time
        self._state = _NEW
        self._failed: BaseException | None = None
        self._stopping = False  # background threads: finish up
        self._writer_stop = False  # writer: exit once the buffer is empty

        # live state
        self._records: dict[int, JFile | UpdatedRecord] = {}
        self._txs: dict[int, _Tx] = {}
        self._files: list[JFile] = []  # DATA files by epoch; the last one is written
        self._free: collections.deque[JFile] = collections.deque()
        self._ready: collections.deque[JFile] = collections.deque()
        self._next_epoch = 1
        self._next_no = 1
        self._compacting = False

        # the append buffer
        self._cur: JFile | None = None
        self._pos = DATA_START
        self._cur_sealed = False
        self._chunks: list[bytes] = []
        self._seg_start = 0
        self._sealed: list[Segment] = []
        self._comps: list[Completion] = []
        self._want_sync = False
        self._force = False
        self._pending = 0
        self._wake_at = _NEVER
        #: Bytes appended and not yet taken by the writer past which producers are held
        #: back (`hold_producers`): a disk whose syncs stall must not let them fill memory.
        self._max_pending = self._file_size
        self._on_backlog: Callable[[bool], None] | None = None
        self._holding = False
        self._batch_no = 0
        self._done_no = 0
        self._last_flush = 0.0
        self._flush_waiters = 0
        self._maint_kicks = 0

        self._writer: FileWriter | None = None
        self._threads: list[threading.Thread] = []
        self._writer_thread: threading.Thread | None = None
        self._syncer_thread: threading.Thread | None = None
        self._inflight: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._io_slots = threading.BoundedSemaphore(self._max_io)
        #: Bytes taken by the writer and not yet synced. The writer takes no batch while
        #: they are `_max_pending` or more, so that appends then hold producers: with
        #: `journal-max-io` > 1 a stalled sync must not let the writer run ahead by
        #: `_max_io` batches, whatever their size.
        self._unsynced = 0
        self._aio = False

    # ================================================================== public API

    def set_dispatcher(self, dispatch: Callable[[list[Completion]], None]) -> None:
        """Route completions: `dispatch` receives each durable batch's completions at once."""
        self._dispatch = dispatch

    def hold_back(self, record_types: set[int] | frozenset[int]) -> None:
        """While the file system is full, refuse adds of these record types (new data, such
        as messages) once the current file is down to its reserve; other adds (bookkeeping
        that consumers need) may use it. By default every add is held back."""
        self._held = frozenset(record_types)

    def hold_producers(self, on_backlog: Callable[[bool], None]) -> None:
        """`on_backlog(True)` once the writer is a file behind the appends (its disk's
        syncs stall), `on_backlog(False)` once it has taken them; called from the loop or
        the writer thread, with the journal's lock held (hand it to the loop)."""
        self._on_backlog = on_backlog

    def load(self) -> LoadResult:
        """Open (creating if needed) and recover; call once, before any append."""
        if self._state != _NEW:
            raise RuntimeError(f"journal {self.directory}: load() may be called only once")
        s = self.settings
        os.makedirs(self.directory, exist_ok=True)
        log = structlog.get_logger()
        started = time.monotonic()
        compactor.recover(self.directory, s.prefix, s.extension)

        data: list[JFile] = []
        free: list[JFile] = []
        numbers = [0]
        for number, path in list_files(self.directory, s.prefix, s.extension):
            epoch = decode_file_header(read_block(path, FILE_HEADER.size))
            if epoch is None and (epoch := first_record_epoch(path)) is not None:
                write_header(path, epoch)
                log.warning(
                    "journal file header damaged; written again with the epoch its first "
                    "record names",
                    file=path,
                    epoch=epoch,
                )
            if epoch is None:  # a free file's (or no journal file's): nothing to lose
                target = move_to_attic(path)
                log.warning(
                    "journal file has no valid header; moved to the attic",
                    file=path,
                    moved_to=target,
                )
                continue
            numbers.append(number)
            f = JFile(path, number, os.path.getsize(path), epoch)
            if epoch == FREE_EPOCH:
                free.append(f)
            else:
                f.state = FileState.DATA
                data.append(f)
        data.sort(key=lambda f: (f.epoch, f.number))
        self._next_no = max(numbers) + 1
        self._next_epoch = max([f.epoch for f in data], default=0) + 1

        replay = Replay(data, directory=self.directory)
        replay.run()
        prepared, abandoned = self._adopt(replay)
        self._seal_recovered(replay)

        self._files = data
        for f in free:
            if f.size != self._file_size or not self._pool_allows():
                self._delete_file(f)
            else:
                self._free.append(f)

        self._aio = s.journal_type == "AIO"
        if self._aio:
            error = probe_direct_io(self.directory)
            if error is not None:
                self._aio = False
                log.warning(
                    "journal AIO unavailable: O_DIRECT refused; falling back to NIO",
                    directory=self.directory,
                    error=str(error),
                )
        self.effective_type = "AIO" if self._aio else "NIO"
        self._writer = FileWriter(
            aio=self._aio,
            datasync=s.journal_datasync,
            buffer_size=self._bufsize,
            counters=self.counters,
        )

        missing = s.journal_min_files - len(data) - len(self._free)
        for _ in range(max(missing, 0)):
            self._free.append(self._new_file())

        with self._lock:
            self._open_first_file()
            self._state = _OPEN
        self._start_threads()
        # A transaction still open after a restart can never commit: write its rollback so
        # that a later transaction reusing the id does not pick its records up.
        for tx_id in abandoned:
            self.rollback(tx_id, sync=False)
        log.info(
            "journal loaded",
            directory=self.directory,
            files=len(data),
            records=len(replay.idx),
            prepared=len(prepared),
            rolled_back=len(abandoned),
            seconds=round(time.monotonic() - started, 3),
            type=self.effective_type,
        )
        return LoadResult(
            records=replay.records(),
            prepared=[tx.to_prepared() for tx in prepared],
            max_id=replay.max_id,
        )

    def stats(self) -> dict[str, Any]:
        """Live records, open transactions, data files and the bytes they use."""
        with self._lock:
            files = list(self._files)
            return {
                "records": len(self._records),
                "transactions": len(self._txs),
                "files": len(files),
                "free-files": len(self._free) + len(self._ready),
                "bytes-used": sum(f.used for f in files),
                "no-room": self._no_room,
            }

    def append_add(
        self,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        sync: bool,
        on_done: Completion | None = None,
    ) -> None:
        """Add a record; `record_id` must not be live already."""
        # `_put` and `_complete_with` written out: this runs once per durable message
        size = HEADER_SIZE + len(data)
        with self._lock:
            if self._state != _OPEN or self._failed is not None:
                self._raise_closed()
            if record_id in self._records:
                raise ValueError(
                    f"journal {self.directory}: add of record id {record_id}: "
                    "a live record already has that id"
                )
            if self._pos + size > self._add_limit:
                self._make_room(size, _ADD, record_type)
            f = self._cur
            try:
                rest = _PACK_REST(_ADD, record_type, 0, f.epoch, size, record_id, 0)  # type: ignore[union-attr]
            except struct.error:
                raise self._bad_args(record_id, record_type) from None
            chunks = self._chunks
            chunks.append(_PACK_CRC(_crc32(data, _crc32(rest))) + rest)
            chunks.append(data)
            self._pos += size
            self._records[record_id] = f  # type: ignore[assignment]
            f.pos += 1  # type: ignore[union-attr]
            f.written += 1  # type: ignore[union-attr]
            if on_done is not None:
                self._comps.append(on_done)
            if sync and self._sync_nontx:
                self._want_sync = True
            self._pending += size
            if self._pending >= self._wake_at:
                self._cond.notify()
                if self._pending >= self._max_pending:
                    self._hold()

    def append_update(
        self,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        sync: bool,
        on_done: Completion | None = None,
        replaceable: bool = False,
    ) -> None:
        """Attach data to a live record; a replaceable update supersedes earlier
        replaceable updates of the same type."""
        with self._lock:
            if self._state != _OPEN or self._failed is not None:
                self._raise_closed()
            st = self._records.get(record_id)
            if st is None:
                raise self._unknown("update", record_id)
            flags = FLAG_REPLACEABLE if replaceable else 0
            f = self._put(_UPDATE, record_type, flags, record_id, 0, data)
            self._attach(record_id, st, record_type, replaceable, f)
            f.pos += 1
            f.written += 1
            self._complete_with(sync and self._sync_nontx, on_done)

    def append_delete(
        self, record_id: int, *, sync: bool, on_done: Completion | None = None
    ) -> None:
        """Delete a live record and its updates."""
        with self._lock:
            if self._state != _OPEN or self._failed is not None:
                self._raise_closed()
            st = self._records.get(record_id)
            if st is None:
                raise self._unknown("delete", record_id)
            f = self._put(_DELETE, 0, 0, record_id, 0, b"")  # may refuse: nothing changed yet
            del self._records[record_id]
            self._kill(st, f)
            self._complete_with(sync and self._sync_nontx, on_done)

    def append_add_tx(self, tx_id: int, record_id: int, record_type: int, data: bytes) -> None:
        """Add a record when transaction `tx_id` commits."""
        self._tx_op(_ADD_TX, tx_id, record_id, record_type, 0, data)

    def append_update_tx(
        self,
        tx_id: int,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        replaceable: bool = False,
    ) -> None:
        """Update a record when transaction `tx_id` commits."""
        self._tx_op(
            _UPDATE_TX, tx_id, record_id, record_type, FLAG_REPLACEABLE if replaceable else 0, data
        )

    def append_delete_tx(self, tx_id: int, record_id: int) -> None:
        """Delete a record when transaction `tx_id` commits."""
        self._tx_op(_DELETE_TX, tx_id, record_id, 0, 0, b"")

    def prepare(
        self, tx_id: int, data: bytes, *, sync: bool, on_done: Completion | None = None
    ) -> None:
        """Make transaction `tx_id` survive a restart undecided, with `data` (e.g. an XID)."""
        with self._lock:
            if self._state != _OPEN or self._failed is not None:
                self._raise_closed()
            tx = self._txs.get(tx_id) or _Tx()
            if tx.prep is not None:
                raise ValueError(
                    f"journal {self.directory}: prepare of transaction {tx_id}: "
                    "it is prepared already; commit or roll it back"
                )
            body = encode_pairs(tx.pairs(), data)
            f = self._put(Kind.PREPARE, 0, 0, 0, tx_id, body)
            self._txs[tx_id] = tx
            tx.prep = f
            f.pos += 1
            self._complete_with(sync and self._sync_tx, on_done)

    def commit(self, tx_id: int, *, sync: bool, on_done: Completion | None = None) -> None:
        """Apply transaction `tx_id`; an unknown id commits an empty transaction."""
        with self._lock:
            if self._state != _OPEN or self._failed is not None:
                self._raise_closed()
            tx = self._txs.get(tx_id)
            body = encode_pairs(tx.pairs() if tx else [])
            f = self._put(Kind.COMMIT, 0, 0, 0, tx_id, body)
            self._txs.pop(tx_id, None)
            if tx is not None:
                self._apply_commit(tx, f)
            self._complete_with(sync and self._sync_tx, on_done)

    def rollback(self, tx_id: int, *, sync: bool, on_done: Completion | None = None) -> None:
        """Discard transaction `tx_id`; an unknown id is a no-op that still completes."""
        with self._lock:
            if self._state != _OPEN or self._failed is not None:
                self._raise_closed()
            tx = self._txs.get(tx_id)
            f = self._put(Kind.ROLLBACK, 0, 0, 0, tx_id, b"")
            self._txs.pop(tx_id, None)
            if tx is not None:
                for _k, _rid, _rt, _fl, g in tx.ops:
                    g.pos -= 1
                    if g is not f:
                        f.neg.add(g)
                if tx.prep is not None:
                    tx.prep.pos -= 1
                    if tx.prep is not f:
                        f.neg.add(tx.prep)
            self._complete_with(sync and self._sync_tx, on_done)

    def flush(self) -> None:
        """Block until everything appended so far is durable and its completions ran."""
        self._check_not_own_thread("flush")
        with self._lock:
            if self._failed is not None:
                raise JournalError(f"journal {self.directory} failed: {self._failed}")
            if self._state not in (_OPEN, _CLOSING):
                return
            self._force = True
            target = self._batch_no + 1
            self._cond.notify()  # a writer waiting for work takes the batch at once
            self._flush_waiters += 1
            try:
                while self._done_no < target and self._failed is None:
                    self._done_cond.wait()
            finally:
                self._flush_waiters -= 1
            if self._failed is not None:
                raise JournalError(f"journal {self.directory} failed: {self._failed}")

    def stop(self) -> None:
        """Flush, stop background work and close files. Idempotent."""
        self._check_not_own_thread("stop")
        with self._lock:
            if self._state != _OPEN:
                if self._state == _NEW:
                    self._state = _STOPPED
                return
            self._state = _CLOSING  # appends are refused from here on
            self._stopping = True
            self._maint_cond.notify_all()
            self._files_cond.notify_all()
        # Background work first: a running compaction gives up or finishes (it may flush).
        for t in self._threads:
            if t is not self._writer_thread and t is not self._syncer_thread:
                t.join()
        with self._lock:
            if self._failed is None:
                # A sealed last file tells the next load that this was a clean stop.
                self._seal_current()
        with contextlib.suppress(JournalError):
            self.flush()
        with self._lock:
            self._writer_stop = True
            self._cond.notify_all()
        if self._writer_thread is not None:
            self._writer_thread.join()
        if self._syncer_thread is not None:
            self._inflight.put(None)
            self._syncer_thread.join()
        with self._lock:
            self._state = _STOPPED
            self._done_cond.notify_all()
        assert self._writer is not None
        self._writer.close_all([*self._files, *self._free, *self._ready])

    def compact(self) -> bool:
        """Compact now, whatever the thresholds; False if there was nothing to compact."""
        self._check_not_own_thread("compact")
        with self._lock:
            if self._state != _OPEN:
                self._raise_closed()
        with self._maint_lock:
            return compactor.compact(self)

    def reclaim(self) -> int:
        """Run a reclaim pass now (it also runs after every file roll); files retired."""
        self._check_not_own_thread("reclaim")
        with self._lock:
            if self._state != _OPEN:
                self._raise_closed()
        with self._maint_lock:
            return self._reclaim()

    # ----------------------------------------------------------------- introspection

    def data_files(self) -> list[str]:
        """Paths of the files holding data, oldest first (the last one is being written)."""
        with self._lock:
            return [f.path for f in self._files]

    def free_files(self) -> list[str]:
        """Paths of the files in the pool (free and spare)."""
        with self._lock:
            return [f.path for f in (*self._free, *self._ready)]

    def live_ratio(self) -> float:
        """Estimated live data / bytes in data files, as the compaction trigger sees it."""
        with self._lock:
            return self._live_ratio()

    # ================================================================== append internals

    def _raise_closed(self) -> None:
        if self._failed is not None:
            raise JournalError(f"journal {self.directory} failed: {self._failed}")
        if self._state == _NEW:
            raise RuntimeError(f"journal {self.directory}: call load() before appending")
        raise RuntimeError(f"journal {self.directory}: stopped; no more appends")

    def _unknown(self, what: str, record_id: int) -> ValueError:
        return ValueError(
            f"journal {self.directory}: {what} of record id {record_id}: no live record has that id"
        )

    def _bad_args(self, record_id: int, record_type: int) -> ValueError:
        return ValueError(
            f"journal {self.directory}: record id {record_id!r} / type {record_type!r} out of "
            f"range; ids are 0..2**64-1 and types 0..255"
        )

    def _check_not_own_thread(self, what: str) -> None:
        me = threading.current_thread()
        if me is self._writer_thread or me is self._syncer_thread:
            raise RuntimeError(
                f"journal {self.directory}: {what}() called from a completion "
                "running on the journal's writer thread; it would deadlock"
            )

    def _put(
        self, kind: int, rtype: int, flags: int, record_id: int, tx_id: int, body: bytes
    ) -> JFile:
        """Append one record to the buffer (lock held); returns the file it goes into."""
        size = HEADER_SIZE + len(body)
        if self._pos + size > self._add_limit:
            self._make_room(size, kind, rtype)
        f = self._cur
        assert f is not None
        try:
            rest = _PACK_REST(kind, rtype, flags, f.epoch, size, record_id, tx_id)
        except struct.error:
            raise ValueError(
                f"journal {self.directory}: record id {record_id!r}, type {rtype!r} or "
                f"transaction id {tx_id!r} out of range; ids are 0..2**64-1, types 0..255"
            ) from None
        self._chunks.append(_PACK_CRC(_crc32(body, _crc32(rest))) + rest)
        if body:
            self._chunks.append(body)
        self._pos += size
        self._pending += size
        return f

    def _complete_with(self, sync: bool, on_done: Completion | None) -> None:
        if on_done is not None:
            self._comps.append(on_done)
        if sync:
            self._want_sync = True
        if self._pending >= self._wake_at:
            self._cond.notify()
            if self._pending >= self._max_pending:
                self._hold()

    def _hold(self) -> None:
        """The writer is `_max_pending` bytes behind (lock held): producers wait until it
        takes them (`_cut`). It is busy meanwhile, so `_wake_at` is `_max_pending`:
        appends test it as they test whether to wake the writer, at no cost of their own."""
        if not self._holding and self._on_backlog is not None:
            self._holding = True
            structlog.get_logger().warning(
                "journal behind its disk: producers held until it catches up",
                directory=self.directory,
                pending_bytes=self._pending,
            )
            self._on_backlog(True)

    def _tx_op(
        self, kind: int, tx_id: int, record_id: int, record_type: int, flags: int, data: bytes
    ) -> None:
        with self._lock:
            if self._state != _OPEN or self._failed is not None:
                self._raise_closed()
            f = self._put(kind, record_type, flags, record_id, tx_id, data)
            tx = self._txs.get(tx_id)
            if tx is None:
                tx = self._txs[tx_id] = _Tx()
            tx.ops.append((kind, record_id, record_type, flags, f))
            tx.counts[f] = tx.counts.get(f, 0) + 1
            f.pos += 1  # pinned until commit or rollback
            if kind != _DELETE_TX:
                f.written += 1
            if self._pending >= self._wake_at:
                self._cond.notify()
                if self._pending >= self._max_pending:
                    self._hold()

    def _attach(
        self,
        record_id: int,
        st: JFile | UpdatedRecord,
        record_type: int,
        replaceable: bool,
        f: JFile,
    ) -> None:
        """Record that `f` holds an update of `record_id` (the caller counts f.pos)."""
        if st.__class__ is JFile:
            st = self._records[record_id] = UpdatedRecord(st)
        assert isinstance(st, UpdatedRecord)
        if replaceable:
            if st.repl is None:
                st.repl = {}
            old = st.repl.get(record_type)
            if old is not None:
                old.pos -= 1  # superseded: recovery keeps only the newest
            st.repl[record_type] = f
        else:
            st.upd.append(f)

    def _kill(self, st: JFile | UpdatedRecord, f: JFile) -> None:
        """A delete in `f` removed the record `st`: release its files, remember them."""
        if st.__class__ is JFile:
            st.pos -= 1
            if st is not f:
                f.neg.add(st)
            return
        for g in st.files():  # type: ignore[union-attr]
            g.pos -= 1
            if g is not f:
                f.neg.add(g)

    def _apply_commit(self, tx: _Tx, f: JFile) -> None:
        records = self._records
        for kind, rid, rtype, flags, g in tx.ops:
            if kind == _ADD_TX:
                if rid in records:
                    g.pos -= 1  # a duplicate id: recovery ignores it too
                else:
                    records[rid] = g
            elif kind == _UPDATE_TX:
                st = records.get(rid)
                if st is None:
                    g.pos -= 1  # the record is gone: the update is dead
                else:
                    self._attach(rid, st, rtype, bool(flags & FLAG_REPLACEABLE), g)
            else:
                g.pos -= 1
                st = records.pop(rid, None)
                if st is not None:
                    self._kill(st, g)
            if g is not f:
                f.neg.add(g)
        if tx.prep is not None:
            tx.prep.pos -= 1
            if tx.prep is not f:
                f.neg.add(tx.prep)

    # ================================================================== files

    def _pool_allows(self, extra: int = 0) -> bool:
        pool = self.settings.journal_pool_files
        return pool < 0 or len(self._files) + len(self._free) + len(self._ready) + extra < pool

    def _new_file(self) -> JFile:
        """Create a zero-filled free file (any thread; takes the lock for its number)."""
        self._check_room()
        with self._lock:
            number = self._next_no
            self._next_no += 1
        return self._create(number)

    def _check_room(self) -> None:
        """Tell the disk monitor a file is coming; OSError(ENOSPC) if it cannot fit.

        One statvfs per file made: a full file system refuses before any zero is written
        and before a file number is used.
        """
        disk_monitor.allocating(self.directory, self._file_size)
        free = disk_monitor.free_bytes(self.directory)
        if free < self._file_size:
            raise OSError(
                errno.ENOSPC,
                f"{free} bytes free, a journal file needs {self._file_size}",
                self.directory,
            )

    def _create(self, number: int, *, sync: bool = True) -> JFile:
        s = self.settings
        path = os.path.join(self.directory, file_name(s.prefix, number, s.extension))
        create_file(path, self._file_size, sync=sync)
        self.counters.files_created += 1
        f = JFile(path, number, self._file_size)
        f.entry_unsynced = not sync
        return f

    def _no_room_for(self, exc: OSError, what: str = "") -> str:
        """What a failed file creation (or `what`) means, for logs and refusals (no lock
        needed)."""
        what = what or f"a new {self._file_size}-byte journal file"
        if exc.errno in NO_FILES_ERRNOS:
            return (
                f"{self.directory}: cannot open {what}: {exc.strerror} (the open-file limit "
                f"is {open_files.limit()})"
            )
        if exc.errno == errno.EDQUOT:  # free bytes do not tell it: say so
            what += f" ({exc.strerror})"
        return disk_monitor.describe_no_room(self.directory, what)

    def _set_no_room(self, problem: str | None) -> None:
        """Enter (a problem) or leave (None) the state where no spare can be made (lock held)."""
        self._no_room = problem
        self._update_add_limit()

    def _update_add_limit(self) -> None:
        """Without a spare at hand, new records stop at the reserve (lock held); see
        `_make_room` for what happens there."""
        if self._ready or self._free:
            self._add_limit = self._limit
        else:
            self._add_limit = self._limit - self._reserve

    def _storage_full(self) -> StorageFull:
        return StorageFull(
            f"journal: not stored: {self._no_room}; producers resume once it has room again"
        )

    def _delete_file(self, f: JFile) -> None:
        os.unlink(f.path)
        fsync_dir(self.directory)
        f.state = FileState.RETIRED
        self.counters.files_deleted += 1

    def _take_spare(self) -> JFile:
        """A file to roll into (lock held): a spare, a free one, or a new one made now.

        Raises StorageFull, changing nothing, when there is none and none can be made.
        """
        if self._ready:
            f = self._ready.popleft()
        elif self._free:
            f = self._free.popleft()
        elif self._no_room is not None:
            raise self._storage_full()
        else:
            # The files thread fell behind (its syncs may stall): the loop makes the file,
            # with nothing that waits on the disk, and the writer syncs it with its first
            # records. Producers are held if the writer falls a file behind (`_hold`).
            try:
                self._check_room()
                f = self._create(self._next_no, sync=False)
            except OSError as exc:
                if not is_no_room(exc):
                    raise
                self._set_no_room(self._no_room_for(exc))
                self._files_cond.notify()  # the files thread reports it and retries
                raise self._storage_full() from None
            self._next_no += 1
            self.counters.files_created_inline += 1
            structlog.get_logger().info(
                "journal spare file not ready; created one inline", file=f.path
            )
        self._files_cond.notify()
        return f

    def _make_room(self, size: int, kind: int, record_type: int) -> None:
        """A record of `size` bytes goes past `_add_limit` (lock held): roll when the file
        is full; else let it into the reserve, or refuse it when it is new data and no
        spare file can be made.

        The reserve exists while no spare is at hand. The first new record to reach it
        looks at the file system (once per file): with room for a file, the files thread
        is still making the spare and the reserve is lifted; without, the journal knows it
        is out of room before the files thread says so, and what frees space still fits.
        """
        if self._pos + size > self._limit:
            self._roll(size)
            return
        if kind not in (_ADD, _ADD_TX) or (
            self._held is not None and record_type not in self._held
        ):
            return  # frees space or settles what exists: the reserve is for it
        if self._ready or self._free:
            self._add_limit = self._limit
            return
        if self._no_room is None:
            if disk_monitor.free_bytes(self.directory) >= self._file_size:
                self._add_limit = self._limit
                return
            error = OSError(errno.ENOSPC, "no room for the next file")
            self._set_no_room(self._no_room_for(error))
            self._files_cond.notify()  # the files thread reports it and retries
        raise self._storage_full()

    def _open_first_file(self) -> None:
        """Start writing into a fresh file (lock held); old files are never appended to."""
        f = self._take_spare()
        self._start_file(f)
        self._update_add_limit()

    def _start_file(self, f: JFile) -> None:
        f.epoch = self._next_epoch
        self._next_epoch += 1
        f.state = FileState.DATA
        f.pos = f.written = 0
        f.neg = set()
        f.used = DATA_START
        self._files.append(f)
        self._cur = f
        self._cur_sealed = False
        # The header travels with the first records: until both are durable, recovery sees
        # a free file (its header still says FREE_EPOCH) and ignores the records.
        self._chunks = [encode_file_header(f.epoch)]
        self._seg_start = 0
        self._pos = DATA_START
        self._pending += DATA_START

    def _seal_current(self) -> None:
        """End the current file with an EOF record and queue its last segment (lock held)."""
        cur = self._cur
        assert cur is not None
        if not self._cur_sealed:
            self._chunks.append(encode_record(Kind.EOF, 0, 0, cur.epoch, 0, 0, b""))
            self._pos += HEADER_SIZE
            self._pending += HEADER_SIZE
            self._cur_sealed = True
            cur.used = self._pos
        if self._chunks:
            self._sealed.append(Segment(cur, self._seg_start, self._chunks, True))
            self._chunks = []

    def _roll(self, size: int) -> None:
        """Seal the current file and continue in a spare (lock held)."""
        if DATA_START + size > self._limit:
            raise ValueError(
                f"journal {self.directory}: record of {size} bytes (with its "
                f"{HEADER_SIZE}-byte header) does not fit in a journal file; at most "
                f"{self._limit - DATA_START} bytes fit with journal-file-size "
                f"{self._file_size}"
            )
        spare = self._take_spare()  # first: without one, the current file stays open
        self._seal_current()
        self._start_file(spare)
        self._update_add_limit()
        self._maint_kicks += 1
        self._maint_cond.notify()

    # ================================================================== threads

    def _start_threads(self) -> None:
        def spawn(target: Callable[[], None], name: str) -> threading.Thread:
            t = threading.Thread(target=target, name=f"{name} {self.directory}", daemon=True)
            self._threads.append(t)
            t.start()
            return t

        self._writer_thread = spawn(self._writer_loop, "journal-writer")
        if self._max_io > 1:
            self._syncer_thread = spawn(self._syncer_loop, "journal-syncer")
        spawn(self._files_loop, "journal-files")
        spawn(self._maint_loop, "journal-maintenance")

    def _fail(self, exc: BaseException) -> None:
        structlog.get_logger().error(
            "journal failed; no more appends", directory=self.directory, error=repr(exc)
        )
        with self._lock:
            first = self._failed is None
            if first:
                self._failed = exc
            self._done_cond.notify_all()
            self._cond.notify_all()
            self._maint_cond.notify_all()
            self._files_cond.notify_all()
        if first and not self._stopping:
            critical.storage_failed(f"journal {self.directory}", exc)

    def _take(self) -> Batch | None:
        """Wait for work, let the buffer fill until the timeout, take a batch (once what
        was taken but not synced is under `_max_pending`)."""
        with self._lock:
            while self._unsynced >= self._max_pending and self._failed is None:
                self._done_cond.wait()
            while not (self._pending or self._sealed or self._force):
                if self._writer_stop or self._failed is not None:
                    return None
                self._wake_at = 1
                self._cond.wait()
            if self._timeout > 0 and not self._force:
                deadline = self._last_flush + self._timeout
                while (
                    self._pending < self._bufsize
                    and not self._force
                    and not self._stopping
                    and self._failed is None
                ):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._wake_at = self._bufsize
                    self._cond.wait(left)
            self._wake_at = self._max_pending  # busy: appends past it hold producers
            if self._failed is not None:
                return None
            return self._cut()

    def _cut(self) -> Batch:
        """Take everything buffered as one batch (lock held)."""
        segments = self._sealed
        self._sealed = []
        if self._chunks:
            cur = self._cur
            assert cur is not None
            if self._aio and self._writer is not None and self._writer.aio:
                self._pad_to_alignment()
            if self._chunks:
                segments.append(Segment(cur, self._seg_start, self._chunks, self._cur_sealed))
                self._chunks = []
            self._seg_start = self._pos
        self._batch_no += 1
        batch = Batch(
            self._batch_no, segments, self._comps, self._want_sync or self._force, self._pending
        )
        self._comps = []
        self._want_sync = self._force = False
        self._unsynced += self._pending
        self._pending = 0
        self._last_flush = time.monotonic()
        if self._holding:
            self._holding = False
            structlog.get_logger().info(
                "journal caught up with its disk: producers resume", directory=self.directory
            )
            self._on_backlog(False)  # type: ignore[misc]
        return batch

    def _pad_to_alignment(self) -> None:
        """O_DIRECT writes whole blocks: end the batch on a block boundary (lock held).

        A PAD record fills the gap so the next batch starts aligned and a reader never has
        to guess across it; when the file has no room for it, the file is sealed instead.
        """
        if self._cur_sealed:
            return
        gap = -self._pos % ALIGNMENT
        if gap == 0:
            return
        if gap < HEADER_SIZE:
            gap += ALIGNMENT
        cur = self._cur
        assert cur is not None
        if self._pos + gap > self._limit:
            self._chunks.append(encode_record(Kind.EOF, 0, 0, cur.epoch, 0, 0, b""))
            self._cur_sealed = True
            cur.used = self._pos + HEADER_SIZE
            # No record fits any more: the next append must roll.
            self._pos = self._file_size
            return
        self._chunks.append(
            encode_record(Kind.PAD, 0, 0, cur.epoch, 0, 0, bytes(gap - HEADER_SIZE))
        )
        self._pos += gap

    def _writer_loop(self) -> None:
        writer = self._writer
        assert writer is not None
        try:
            while True:
                batch = self._take()
                if batch is None:
                    return
                self.counters.batches += 1
                if self._max_io > 1:
                    self._io_slots.acquire()
                    self._write(writer, batch)
                    self._inflight.put(batch)
                else:
                    self._write(writer, batch)
                    self._complete([batch])
        except BaseException as exc:
            self._fail(exc)

    def _write(self, writer: FileWriter, batch: Batch) -> None:
        """Write a batch; a write refused for lack of space is tried again until it fits.

        Files are zero-filled in advance, so this only happens where overwriting needs
        new blocks (copy-on-write file systems such as btrfs or ZFS). Rewriting the same
        bytes at the same offsets is harmless; the batch completes once written.
        """
        problem: str | None = None
        owner = f"journal writer {self.directory}"
        try:
            while True:
                try:
                    writer.write(batch)
                    return
                except OSError as exc:
                    if not is_no_room(exc) or self._stopping:
                        raise
                    if problem is None:
                        problem = self._no_room_for(exc, "a write")
                        structlog.get_logger().warning(
                            f"journal write refused: {no_room_reason(exc)}; tried again "
                            "until it has room",
                            directory=self.directory,
                            error=str(exc),
                        )
                        disk_monitor.out_of_space(self.directory, owner, problem)
                    time.sleep(_RETRY)
        finally:
            if problem is not None:
                disk_monitor.out_of_space(self.directory, owner, None)

    def _syncer_loop(self) -> None:
        try:
            while True:
                first = self._inflight.get()
                if first is None:
                    return
                batches = [first]
                stop = False
                while True:
                    try:
                        more = self._inflight.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                        break
                    batches.append(more)
                self._complete(batches)
                for _ in batches:
                    self._io_slots.release()
                if stop:
                    return
        except BaseException as exc:
            self._fail(exc)

    def _complete(self, batches: list[Batch]) -> None:
        """Sync what needs it, close sealed files, dispatch all completions at once."""
        writer = self._writer
        assert writer is not None
        if any(b.sync for b in batches):
            started = time.monotonic()
            writer.sync()
            disk_monitor.synced(f"journal {self.directory}", started)
        for b in batches:
            for seg in b.segments:
                if seg.last:
                    writer.close(seg.file)
        completions: list[Completion] = []
        for b in batches:
            completions.extend(b.completions)
        if completions:
            try:
                self._dispatch(completions)
            except Exception:
                structlog.get_logger().exception(
                    "journal dispatcher raised", directory=self.directory
                )
        with self._lock:
            self._done_no = batches[-1].number
            behind = self._unsynced >= self._max_pending
            self._unsynced -= sum(b.size for b in batches)
            if behind:  # the writer may be waiting for this
                self._done_cond.notify_all()
            if self._flush_waiters:
                self._done_cond.notify_all()

    def _files_loop(self) -> None:
        owner = f"journal {self.directory}"
        reported = False  # the disk monitor was told we are out of room
        log = structlog.get_logger()
        try:
            while True:
                with self._lock:
                    while len(self._ready) >= _SPARES and not self._stopping:
                        self._files_cond.wait()
                    if self._stopping:
                        return
                    f = self._free.popleft() if self._free else None
                if f is None:
                    try:
                        f = self._new_file()
                    except OSError as exc:
                        if not is_no_room(exc):
                            raise
                        problem = self._no_room_for(exc)
                        with self._lock:
                            self._set_no_room(problem)
                            # deletes may have left whole files to reclaim: a file back
                            # in the pool (or space freed) ends this at once
                            self._maint_kicks += 1
                            self._maint_cond.notify()
                        if not reported:
                            reported = True
                            log.warning(
                                f"journal {no_room_reason(exc)}: new records refused until "
                                "it has room again",
                                directory=self.directory,
                                reason=problem,
                            )
                            disk_monitor.out_of_space(self.directory, owner, problem)
                        with self._lock:
                            if not self._stopping and not self._free:
                                self._files_cond.wait(_RETRY)
                        continue
                with self._lock:
                    self._ready.append(f)
                    self._set_no_room(None)  # and lifts the reserve
                if reported:
                    reported = False
                    log.info("journal has room again", directory=self.directory)
                    disk_monitor.out_of_space(self.directory, owner, None)
        except BaseException as exc:
            self._fail(exc)
        finally:
            if reported:
                disk_monitor.out_of_space(self.directory, owner, None)

    def _maint_loop(self) -> None:
        seen = 0
        try:
            while True:
                with self._lock:
                    while self._maint_kicks == seen and not self._stopping:
                        self._maint_cond.wait()
                    if self._stopping or self._failed is not None:
                        return
                    seen = self._maint_kicks
                with self._maint_lock:
                    try:
                        self._reclaim()
                        if self._should_compact():
                            compactor.compact(self)
                    except OSError as exc:
                        if not is_no_room(exc):
                            raise
                        # nothing of the live state changed: the next kick tries again
                        structlog.get_logger().warning(
                            f"journal maintenance postponed: {no_room_reason(exc)}",
                            directory=self.directory,
                            error=str(exc),
                        )
        except BaseException as exc:
            self._fail(exc)

    # ================================================================== reclaim

    def _reclaimable(self) -> list[JFile]:
        """Files whose records are all dead and whose cancelling records are unneeded."""
        dead: set[JFile] = set()
        out: list[JFile] = []
        for f in self._files[:-1]:
            if f.state is not FileState.DATA or f.pos:
                continue
            if all(t in dead or t.state in (FileState.FREE, FileState.RETIRED) for t in f.neg):
                dead.add(f)
                out.append(f)
        return out

    def _reclaim(self) -> int:
        """Retire reclaimable files: recycle them into the pool or delete them."""
        with self._lock:
            victims = self._reclaimable()
            if not victims:
                return 0
            gone = set(victims)
            for f in victims:
                f.state = FileState.RETIRED
            self._files = [f for f in self._files if f not in gone]
            for f in self._files:
                if f.neg:
                    f.neg -= gone
        # The deletes that killed these files' records must be durable before the records
        # themselves disappear.
        self.flush()
        for f in victims:
            self._recycle(f)
        with self._lock:
            if self._no_room is not None:
                self._files_cond.notify()  # recycled or deleted: the files thread retries now
        structlog.get_logger().debug(
            "journal reclaimed files", directory=self.directory, files=[f.name for f in victims]
        )
        return len(victims)

    def _recycle(self, f: JFile) -> None:
        """Put a retired file back in the pool (marked free) or delete it."""
        assert f.fd < 0, f"{f.path} still open"
        with self._lock:
            keep = f.size == self._file_size and self._pool_allows()
        if not keep:
            self._delete_file(f)
            return
        write_header(f.path, FREE_EPOCH)
        f.epoch = FREE_EPOCH
        f.pos = f.written = 0
        f.neg = set()
        f.used = DATA_START
        f.state = FileState.FREE
        self.counters.files_recycled += 1
        with self._lock:
            self._free.append(f)
            self._update_add_limit()
            self._files_cond.notify()

    # ================================================================== compaction

    def _live_ratio(self) -> float:
        files = self._files[:-1]
        if not files:
            return 1.0
        live = 0.0
        for f in files:
            if f.written:
                live += (f.used - DATA_START) * min(f.pos, f.written) / f.written
            elif f.pos:
                live += f.used - DATA_START
        return live / (len(files) * (self._file_size - DATA_START))

    def _should_compact(self) -> bool:
        s = self.settings
        with self._lock:
            if s.journal_compact_min_files == 0 or self._stopping or self._no_room is not None:
                return False
            if len(self._files) - 1 < s.journal_compact_min_files:
                return False
            return self._live_ratio() * 100 < s.journal_compact_percentage

    # ================================================================== load helpers

    def _seal_recovered(self, replay: Replay) -> None:
        """Write the EOF record a file lacks because the process stopped while writing it.

        Nothing is ever appended to a recovered file again, so this fixes its end for good:
        bytes past it (a torn batch) can never be read, and later loads see a sealed file.
        A file that stopped at a damaged record keeps its damage for inspection.
        """
        for stop in replay.stops:
            if stop.reason not in ("end", "stale", "truncated"):
                continue
            f = stop.file
            fd = os.open(f.path, os.O_WRONLY)
            try:
                os.pwrite(fd, encode_record(Kind.EOF, 0, 0, f.epoch, 0, 0, b""), stop.offset)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            f.used = stop.offset + HEADER_SIZE
            if stop is replay.stops[-1]:
                structlog.get_logger().info(
                    "journal was not stopped cleanly; recovered up to the end of valid data",
                    file=f.path,
                    offset=stop.offset,
                    reason=stop.reason,
                )

    def _adopt(self, replay: Replay) -> tuple[list[LoadedTx], list[int]]:
        """Build the live bookkeeping from what recovery found."""
        where = replay.where
        records = self._records
        for rid, st in replay.idx.items():
            if st.__class__ is int:
                f = where[st]
                records[rid] = f
                f.pos += 1
                continue
            add = where[st.add]  # type: ignore[union-attr]
            add.pos += 1
            rec = UpdatedRecord(add)
            for i in st.upds:  # type: ignore[union-attr]
                g = where[i]
                g.pos += 1
                rec.upd.append(g)
            if st.repl:  # type: ignore[union-attr]
                rec.repl = {}
                for t, i in st.repl.items():  # type: ignore[union-attr]
                    g = where[i]
                    g.pos += 1
                    rec.repl[t] = g
            records[rid] = rec
        for f, negs in replay.neg.items():
            f.neg = {t for t in negs if t.state is FileState.DATA}
        for f, n in replay.written.items():
            f.written = n
        prepared, others = replay.open_transactions()
        # Open transactions keep their files pinned; the abandoned ones are rolled back
        # right after load, which releases the pins and records the rollback's references.
        for ltx in (*prepared, *others):
            tx = _Tx()
            for kind, rid, rtype, flags, _body, g in ltx.ops:
                tx.ops.append((kind, rid, rtype, flags, g))
                tx.counts[g] = tx.counts.get(g, 0) + 1
                g.pos += 1
            tx.prep = ltx.prepare_file
            if tx.prep is not None:
                tx.prep.pos += 1
            self._txs[ltx.tx_id] = tx
        return prepared, [tx.tx_id for tx in others]
