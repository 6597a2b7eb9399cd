"""Rebuilding journal state by reading files: used by `load()` and by the compactor.

`Replay` reads files in epoch order and applies their records to a model of the journal:
live records in journal order, updates attached to their record, replaceable updates
collapsed, transactions buffered until their COMMIT. Each file is read up to its first
invalid record (see `format`); what stops the read is reported in `Replay.stops`.

When a file meets a record whose CRC fails (or whose header is damaged) instead of zeros, a
stale record or its EOF marker, reading goes on at the next valid record of that file (one
of its epoch whose CRC holds), as Artemis's journal does, and a warning names the file,
the offset and the bytes skipped: a flipped bit costs the record it hit, not the rest of
its file. With no valid record after the damage, the rest of the file is ignored (said in
the warning). Transactions with records in a skipped part fail their COMMIT's count check
and are dropped whole.
"""

from __future__ import annotations

import gc
import struct
import time
import zlib
from dataclasses import dataclass, field

import structlog

from scow.core.interfaces import PreparedTransaction, RecordInfo

from .files import JFile, read_whole
from .format import (
    DATA_START,
    FLAG_REPLACEABLE,
    HEADER_SIZE,
    MAX_KIND,
    RECORD_HEADER,
    Kind,
    decode_pairs,
    whole_record,
)

#: Log load progress after this many records or seconds since the last progress line.
PROGRESS_RECORDS = 1_000_000
PROGRESS_SECONDS = 5.0

_ADD = int(Kind.ADD)
_UPDATE = int(Kind.UPDATE)
_DELETE = int(Kind.DELETE)
_PAD = int(Kind.PAD)
_EOF = int(Kind.EOF)
_ADD_TX = int(Kind.ADD_TX)
_UPDATE_TX = int(Kind.UPDATE_TX)
_DELETE_TX = int(Kind.DELETE_TX)
_PREPARE = int(Kind.PREPARE)
_COMMIT = int(Kind.COMMIT)
_ROLLBACK = int(Kind.ROLLBACK)
_ZERO_HEADER = bytes(HEADER_SIZE)


@dataclass(slots=True)
class FileStop:
    """Where and why reading one file stopped."""

    file: JFile
    offset: int
    #: "eof" (sealed), "end" (zeros: the writer stopped here), "stale" (a record from an
    #: earlier use of the file), "truncated" (file ends inside a record), "corrupt"
    reason: str
    records: int


class _LRec:
    """A loaded record with updates: indexes into `Replay.infos`."""

    __slots__ = ("add", "repl", "upds")

    def __init__(self, add: int) -> None:
        self.add = add
        self.upds: list[int] = []
        self.repl: dict[int, int] | None = None

    def indexes(self) -> list[int]:
        out = [self.add, *self.upds]
        if self.repl:
            out.extend(self.repl.values())
        return out


@dataclass(slots=True)
class LoadedTx:
    """A transaction seen in the files and not (yet) resolved."""

    tx_id: int
    #: (kind, record id, record type, flags, body, file) per ADD_TX/UPDATE_TX/DELETE_TX
    ops: list[tuple[int, int, int, int, bytes, JFile]] = field(default_factory=list)
    found: dict[int, int] = field(default_factory=dict)
    prepare_data: bytes | None = None
    prepare_file: JFile | None = None
    invalid: bool = False

    def to_prepared(self) -> PreparedTransaction:
        prepared = PreparedTransaction(self.tx_id, self.prepare_data or b"")
        for kind, rid, rtype, _flags, body, _f in self.ops:
            if kind == _DELETE_TX:
                prepared.deletes.append(rid)
            else:
                prepared.records.append(RecordInfo(rid, rtype, body, kind == _UPDATE_TX))
        return prepared


def classify_stop(buf: bytes | bytearray | memoryview, off: int, epoch: int) -> str:
    """Why a record cannot be read at `off` (see `FileStop.reason`)."""
    end = len(buf)
    if off >= end:
        return "end"
    if off + HEADER_SIZE > end:
        return "end" if not any(bytes(buf[off:end])) else "truncated"
    if bytes(buf[off : off + HEADER_SIZE]) == _ZERO_HEADER:
        return "end"
    crc, kind, _rt, _fl, ep, length, _id, _tx = RECORD_HEADER.unpack_from(buf, off)
    sane = 0 < kind <= MAX_KIND and length >= HEADER_SIZE
    if sane and off + length > end:
        return "truncated"
    if sane and ep != epoch and zlib.crc32(memoryview(buf)[off + 4 : off + length]) == crc:
        return "stale"
    return "corrupt"


#: Where a record header holds its file's epoch (see `format.RECORD_HEADER`).
_EPOCH_AT = 8
_EPOCH = struct.Struct("<I")


def next_valid_record(buf: bytes | bytearray, start: int, epoch: int) -> int | None:
    """The offset of the first whole record of `epoch` at or after `start` whose CRC holds
    (a damaged record's successor), or None. Candidates are found by the epoch's bytes."""
    end = len(buf)
    needle = _EPOCH.pack(epoch)
    at = start + _EPOCH_AT
    while (at := buf.find(needle, at, end - HEADER_SIZE + _EPOCH_AT + len(needle))) >= 0:
        off = at - _EPOCH_AT
        at += 1
        if whole_record(buf, off):
            return off
    return None


class Replay:
    """Journal state rebuilt from files; `run()` reads them, then read the attributes."""

    def __init__(self, files: list[JFile], *, directory: str = "", progress: bool = True) -> None:
        self.files = files
        self.directory = directory
        self.progress = progress
        self.present = {f.epoch for f in files}
        #: live entries in journal order; None where an entry died
        self.infos: list[RecordInfo | None] = []
        #: the file holding each entry of `infos`
        self.where: list[JFile] = []
        #: indexes of `infos` that are replaceable updates
        self.repl_idx: set[int] = set()
        #: record id -> index of its add in `infos`, or an `_LRec` once it has updates
        self.idx: dict[int, int | _LRec] = {}
        self.txs: dict[int, LoadedTx] = {}
        #: per file, the earlier files its deletes, commits and rollbacks refer to
        self.neg: dict[JFile, set[JFile]] = {}
        #: positive records per file, for the live-data estimate
        self.written: dict[JFile, int] = {}
        self.stops: list[FileStop] = []
        self.dropped_commits: list[int] = []
        self.max_id = 0
        self.records_read = 0
        self._log = structlog.get_logger()

    # ------------------------------------------------------------------ reading

    def run(self, buffers: dict[JFile, bytes | bytearray] | None = None) -> None:
        """Read every file in order (from `buffers` where given, else from disk)."""
        # Millions of small acyclic objects are created here; collecting cycles while they
        # pile up would rescan them again and again for nothing.
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._run(buffers)
        finally:
            if enabled:
                gc.enable()

    def _run(self, buffers: dict[JFile, bytes | bytearray] | None) -> None:
        started = last_log = time.monotonic()
        last_count = 0
        for n, f in enumerate(self.files):
            buf = buffers[f] if buffers and f in buffers else read_whole(f.path)
            self.scan(f, buf, last=n == len(self.files) - 1)
            now = time.monotonic()
            if self.progress and (
                self.records_read - last_count >= PROGRESS_RECORDS
                or now - last_log >= PROGRESS_SECONDS
            ):
                last_log, last_count = now, self.records_read
                self._log.info(
                    "journal load progress",
                    directory=self.directory,
                    files_done=n + 1,
                    files=len(self.files),
                    records=self.records_read,
                    seconds=round(now - started, 2),
                )

    def scan(self, f: JFile, buf: bytes | bytearray, *, last: bool) -> FileStop:
        """Apply the records of one file; return where reading stopped and why."""
        mv = memoryview(buf)
        end = len(buf)
        epoch = f.epoch
        unpack = RECORD_HEADER.unpack_from
        crc32 = zlib.crc32
        infos = self.infos
        infos_append = infos.append
        where_append = self.where.append
        idx = self.idx
        fneg = self.neg.setdefault(f, set())
        max_id = self.max_id
        off = DATA_START
        count = 0
        written = 0
        reason = ""
        while True:
            while off + HEADER_SIZE <= end:
                crc, kind, rtype, flags, ep, length, rid, tx = unpack(buf, off)
                if (
                    ep != epoch
                    or kind == 0
                    or kind > MAX_KIND
                    or length < HEADER_SIZE
                    or off + length > end
                ):
                    break
                if crc32(mv[off + 4 : off + length]) != crc:
                    break
                count += 1
                if kind == _ADD:
                    written += 1
                    if rid > max_id:
                        max_id = rid
                    if rid not in idx:
                        idx[rid] = len(infos)
                        infos_append(
                            RecordInfo(rid, rtype, bytes(mv[off + HEADER_SIZE : off + length]))
                        )
                        where_append(f)
                elif kind == _UPDATE:
                    written += 1
                    if rid > max_id:
                        max_id = rid
                    self._update(rid, rtype, flags, bytes(mv[off + HEADER_SIZE : off + length]), f)
                elif kind == _DELETE:
                    self._delete(rid, f, fneg)
                elif kind == _EOF:
                    reason = "eof"
                    break
                elif kind != _PAD:
                    if kind in (_ADD_TX, _UPDATE_TX):
                        written += 1
                        if rid > max_id:
                            max_id = rid
                    self._tx_record(
                        kind, rid, rtype, flags, tx, mv[off + HEADER_SIZE : off + length], f, fneg
                    )
                off += length
            if reason or classify_stop(buf, off, epoch) not in ("corrupt", "truncated"):
                break
            resume = next_valid_record(buf, off + 1, epoch)
            if resume is None:
                break
            self._log.warning(
                "journal file damaged: skipped to its next valid record",
                file=f.path,
                offset=off,
                skipped=resume - off,
                records_read=count,
            )
            off = resume
        self.max_id = max_id
        self.records_read += count
        self.written[f] = self.written.get(f, 0) + written
        f.used = off
        if not reason:
            reason = classify_stop(buf, off, epoch)
            if reason == "corrupt" or (reason == "truncated" and not last):
                self._log.warning(
                    "journal file damaged: ignoring the rest of the file (no valid record "
                    "after it)",
                    file=f.path,
                    offset=off,
                    reason=reason,
                    records_read=count,
                )
            elif not last and reason != "eof":
                # A sealed file always ends with EOF; one that does not was cut short.
                self._log.warning(
                    "journal file ends without its end marker",
                    file=f.path,
                    offset=off,
                    reason=reason,
                    records_read=count,
                )
        stop = FileStop(f, off, reason, count)
        self.stops.append(stop)
        return stop

    # ------------------------------------------------------------------ applying

    def _add(self, rid: int, rtype: int, data: bytes, f: JFile) -> None:
        if rid in self.idx:
            return  # a duplicate add is ignored, as the live journal ignores it at commit
        self.idx[rid] = len(self.infos)
        self.infos.append(RecordInfo(rid, rtype, data))
        self.where.append(f)

    def _update(self, rid: int, rtype: int, flags: int, data: bytes, f: JFile) -> None:
        st = self.idx.get(rid)
        if st is None:
            return  # its add was deleted and reclaimed already; the update is dead too
        if st.__class__ is int:
            st = self.idx[rid] = _LRec(st)
        assert isinstance(st, _LRec)
        i = len(self.infos)
        self.infos.append(RecordInfo(rid, rtype, data, True))
        self.where.append(f)
        if flags & FLAG_REPLACEABLE:
            if st.repl is None:
                st.repl = {}
            old = st.repl.get(rtype)
            if old is not None:
                self.infos[old] = None
                self.repl_idx.discard(old)
            st.repl[rtype] = i
            self.repl_idx.add(i)
        else:
            st.upds.append(i)

    def _delete(self, rid: int, f: JFile, fneg: set[JFile]) -> None:
        st = self.idx.pop(rid, None)
        if st is None:
            return
        infos = self.infos
        where = self.where
        for i in (st,) if st.__class__ is int else st.indexes():  # type: ignore[union-attr]
            infos[i] = None
            t = where[i]
            if t is not f:
                fneg.add(t)
            self.repl_idx.discard(i)

    def _complete(self, tx: LoadedTx, pairs: list[tuple[int, int]]) -> bool:
        # A file that is gone was reclaimed: its records were all dead, nothing to check.
        return all(e not in self.present or tx.found.get(e, 0) == n for e, n in pairs)

    def _tx_record(
        self,
        kind: int,
        rid: int,
        rtype: int,
        flags: int,
        tx_id: int,
        body: memoryview,
        f: JFile,
        fneg: set[JFile],
    ) -> None:
        txs = self.txs
        if kind in (_ADD_TX, _UPDATE_TX, _DELETE_TX):
            tx = txs.get(tx_id)
            if tx is None:
                tx = txs[tx_id] = LoadedTx(tx_id)
            tx.ops.append((kind, rid, rtype, flags, bytes(body), f))
            tx.found[f.epoch] = tx.found.get(f.epoch, 0) + 1
            return
        if kind == _PREPARE:
            tx = txs.get(tx_id)
            if tx is None:
                tx = txs[tx_id] = LoadedTx(tx_id)
            try:
                pairs, data = decode_pairs(body)
            except ValueError:
                pairs, data, tx.invalid = [], b"", True
            if not self._complete(tx, pairs):
                self._log.warning(
                    "journal prepared transaction incomplete; it will be rolled back",
                    tx_id=tx_id,
                    file=f.path,
                )
                tx.invalid = True
            tx.prepare_data = data
            tx.prepare_file = f
            return
        tx = txs.pop(tx_id, None)
        if tx is None:
            return  # an empty transaction, or one whose records were all reclaimed
        touched = {op[5] for op in tx.ops}
        if tx.prepare_file is not None:
            touched.add(tx.prepare_file)
        touched.discard(f)
        fneg.update(touched)
        if kind != _COMMIT:
            return
        try:
            pairs, _ = decode_pairs(body)
        except ValueError:
            pairs = [(f.epoch, -1)]
        if tx.invalid or not self._complete(tx, pairs):
            self._log.warning(
                "journal commit found but some records of its transaction are missing; "
                "dropping the transaction",
                tx_id=tx_id,
                file=f.path,
                expected=pairs,
                found=sorted(tx.found.items()),
            )
            self.dropped_commits.append(tx_id)
            return
        for okind, rid, rtype, oflags, data, of in tx.ops:
            if okind == _ADD_TX:
                self._add(rid, rtype, data, of)
            elif okind == _UPDATE_TX:
                self._update(rid, rtype, oflags, data, of)
            else:
                self._delete(rid, of, self.neg.setdefault(of, set()))

    # ------------------------------------------------------------------ results

    def live_entries(self) -> list[tuple[RecordInfo, JFile, bool]]:
        """(record, file, replaceable) for every live entry, in journal order."""
        repl = self.repl_idx
        return [
            (info, self.where[i], i in repl)
            for i, info in enumerate(self.infos)
            if info is not None
        ]

    def records(self) -> list[RecordInfo]:
        """Live records in journal order."""
        return [info for info in self.infos if info is not None]

    def open_transactions(self) -> tuple[list[LoadedTx], list[LoadedTx]]:
        """(prepared and intact, everything else still open) after `run()`."""
        prepared: list[LoadedTx] = []
        other: list[LoadedTx] = []
        for tx in self.txs.values():
            (prepared if tx.prepare_file is not None and not tx.invalid else other).append(tx)
        return prepared, other
