"""Compaction: copy the live records of every sealed file into fresh files, then drop them.

Appends go on while it runs. The stages, each named after the point it has reached (the
journal's `compaction_hook` is called with these names, so tests can crash at each):

``started``
    Under the lock: the current file is sealed and writing continues in a new file; every
    file before it is marked COMPACTING. A range of epochs between the old files and the
    new one is reserved for the output, so on disk the copies sort before anything
    appended during or after compaction.
``cmp-written``
    The old files were read (as recovery reads them) and the live records, open
    transactions and prepare records were written to `<name>.cmp` files, synced.
``installed``
    Under the lock: the live bookkeeping now refers to the new files. The install checks
    that every reference into an old file found its copy, and gives up otherwise.
``control-written``
    `<prefix>-rename-control.ctr` lists the old files (name, epoch) and the renames. From
    here on recovery finishes the compaction; before it, recovery undoes it (deletes the
    `.cmp` files) and the old files are still the truth.
``renaming`` / ``renamed``
    After the first rename and after all of them.
``old-retired``
    Old files were marked free (or deleted, beyond `journal-pool-files`).
``done``
    The control file is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from typing import TYPE_CHECKING, Any

import structlog

from scow.core import disk_monitor
from scow.core.disk_monitor import is_no_space
from scow.core.model import StorageFull

from .errors import JournalError
from .files import FileState, JFile, UpdatedRecord, fsync_dir, read_block, write_header
from .format import (
    DATA_START,
    FILE_HEADER,
    FLAG_REPLACEABLE,
    FREE_EPOCH,
    HEADER_SIZE,
    RECORD_CRC,
    Kind,
    control_file_name,
    decode_file_header,
    encode_file_header,
    encode_pairs,
    encode_record,
    file_name,
    file_name_pattern,
)
from .replay import Replay

if TYPE_CHECKING:
    from .journal import FileJournal

STAGES = (
    "started",
    "cmp-written",
    "installed",
    "control-written",
    "renaming",
    "renamed",
    "old-retired",
    "done",
)

_ADD_TX = int(Kind.ADD_TX)
_UPDATE_TX = int(Kind.UPDATE_TX)
_DELETE_TX = int(Kind.DELETE_TX)


class CompactionAborted(Exception):
    """Compaction gave up before its control file; nothing on disk changed."""


class ControlFileError(JournalError):
    """The compaction control file cannot be read; recovery cannot tell what to do."""


# ====================================================================== the control file


def write_control(directory: str, prefix: str, content: dict[str, Any]) -> str:
    """Write the control file atomically (temp file, sync, rename, sync the directory)."""
    path = os.path.join(directory, control_file_name(prefix))
    payload = json.dumps(content, sort_keys=True).encode()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(RECORD_CRC.pack(zlib.crc32(payload)) + payload)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_dir(directory)
    return path


def read_control(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < RECORD_CRC.size:
        raise ControlFileError(f"compaction control file {path}: {len(raw)} bytes, too short")
    (crc,) = RECORD_CRC.unpack_from(raw, 0)
    payload = raw[RECORD_CRC.size :]
    if zlib.crc32(payload) != crc:
        raise ControlFileError(
            f"compaction control file {path}: CRC mismatch; restore it or move the journal aside"
        )
    content: dict[str, Any] = json.loads(payload)
    return content


def _finish(directory: str, content: dict[str, Any]) -> None:
    """Complete what a control file describes; safe to repeat."""
    for cmp_name, final_name, _epoch in content["new"]:
        src = os.path.join(directory, cmp_name)
        if os.path.exists(src):
            os.rename(src, os.path.join(directory, final_name))
    fsync_dir(directory)
    for name, epoch in content["old"]:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            continue
        # A file recycled and reused since carries another epoch: leave it alone.
        if decode_file_header(read_block(path, FILE_HEADER.size)) == epoch:
            write_header(path, FREE_EPOCH)


def recover(directory: str, prefix: str, extension: str) -> None:
    """Finish (control file present) or undo (absent) an interrupted compaction, then
    remove the leftovers of interrupted file creation."""
    log = structlog.get_logger()
    control = os.path.join(directory, control_file_name(prefix))
    if os.path.exists(control):
        content = read_control(control)
        _finish(directory, content)
        os.unlink(control)
        fsync_dir(directory)
        log.warning(
            "journal finished a compaction interrupted by a crash",
            directory=directory,
            old=[n for n, _ in content["old"]],
            new=[n for _, n, _ in content["new"]],
        )
    pattern = file_name_pattern(prefix, extension)
    removed = []
    for name in os.listdir(directory):
        for suffix in (".cmp", ".tmp"):
            if name.endswith(suffix) and pattern.match(name[: -len(suffix)]):
                os.unlink(os.path.join(directory, name))
                removed.append(name)
        if name == control_file_name(prefix) + ".tmp":
            os.unlink(os.path.join(directory, name))
            removed.append(name)
    if removed:
        fsync_dir(directory)
        log.info("journal removed unfinished files", directory=directory, files=sorted(removed))


# ====================================================================== compaction


class _Output:
    """Writes the compacted records into `.cmp` files, tracking where each one went."""

    def __init__(self, j: FileJournal, first_epoch: int, max_files: int) -> None:
        self.j = j
        self.first_epoch = first_epoch
        self.max_files = max_files
        self.files: list[JFile] = []
        self.cmp_paths: list[str] = []
        self.buf = bytearray()
        self.pos = 0
        self.cur: JFile | None = None
        self.limit = j._file_size - HEADER_SIZE

    def _open_next(self) -> None:
        if len(self.files) >= self.max_files:
            raise CompactionAborted(
                f"compacted data needs more than the {self.max_files} files reserved"
            )
        j = self.j
        with j._lock:
            number = j._next_no
            j._next_no += 1
        s = j.settings
        final = os.path.join(j.directory, file_name(s.prefix, number, s.extension))
        f = JFile(final, number, j._file_size, self.first_epoch + len(self.files))
        f.state = FileState.COMPACTED
        self.files.append(f)
        self.cmp_paths.append(final + ".cmp")
        self.cur = f
        self.buf = bytearray(j._file_size)
        self.buf[:DATA_START] = encode_file_header(f.epoch)
        self.pos = DATA_START

    def _close_current(self) -> None:
        f = self.cur
        if f is None:
            return
        eof = encode_record(Kind.EOF, 0, 0, f.epoch, 0, 0, b"")
        self.buf[self.pos : self.pos + len(eof)] = eof
        f.used = self.pos + len(eof)
        fd = os.open(self.cmp_paths[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(self.buf)
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            os.fsync(fd)
        finally:
            os.close(fd)
        self.cur = None

    def put(
        self,
        kind: int,
        rtype: int,
        flags: int,
        rid: int,
        tx_id: int,
        body: bytes,
        *,
        positive: bool,
    ) -> JFile:
        size = HEADER_SIZE + len(body)
        if self.cur is None or self.pos + size > self.limit:
            self._close_current()
            self._open_next()
        f = self.cur
        assert f is not None
        rec = encode_record(kind, rtype, flags, f.epoch, rid, tx_id, body)
        self.buf[self.pos : self.pos + size] = rec
        self.pos += size
        if positive:
            f.written += 1
        return f

    def finish(self) -> None:
        self._close_current()
        if self.files:
            fsync_dir(self.j.directory)

    def discard(self) -> None:
        for path in self.cmp_paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def compact(j: FileJournal) -> bool:
    """Run one compaction of `j` on the calling thread (never the writer thread)."""
    log = structlog.get_logger()
    hook = j.compaction_hook

    def stage(name: str) -> None:
        if hook is not None:
            hook(name)

    # ---------------------------------------------------------------- started
    with j._lock:
        if j._failed is not None or j._stopping or j._compacting:
            return False
        old = list(j._files)
        if not old or (len(old) == 1 and j._pos == DATA_START):
            return False  # nothing written yet
        reserved = len(old) + 2
        if not _room_to_compact(j, old):
            return False
        try:
            spare = j._take_spare()
        except StorageFull:
            return False
        first_epoch = j._next_epoch
        j._next_epoch += reserved
        j._seal_current()
        j._start_file(spare)
        j._update_add_limit()
        for f in old:
            f.state = FileState.COMPACTING
        j._compacting = True
    out = _Output(j, first_epoch, reserved)
    try:
        stage("started")
        j.flush()  # the old files must be on disk before they are read

        # ------------------------------------------------------------ cmp-written
        replay = Replay(old, directory=j.directory, progress=False)
        replay.run()
        where: dict[int, list[Any]] = {}
        tx_where: dict[int, list[tuple[tuple[int, int, int, int], JFile]]] = {}
        prep_where: dict[int, JFile] = {}
        for info, _f, repl in replay.live_entries():
            if info.is_update:
                g = out.put(
                    Kind.UPDATE,
                    info.type,
                    FLAG_REPLACEABLE if repl else 0,
                    info.id,
                    0,
                    info.data,
                    positive=True,
                )
                w = where[info.id]
                if repl:
                    w[2][info.type] = g
                else:
                    w[1].append(g)
            else:
                g = out.put(Kind.ADD, info.type, 0, info.id, 0, info.data, positive=True)
                where[info.id] = [g, [], {}]
        prepared, others = replay.open_transactions()
        for tx in (*prepared, *(t for t in others if not t.invalid)):
            placed = tx_where[tx.tx_id] = []
            counts: dict[JFile, int] = {}
            for kind, rid, rtype, flags, body, _g in tx.ops:
                g = out.put(
                    kind, rtype, flags, rid, tx.tx_id, body, positive=kind != Kind.DELETE_TX
                )
                placed.append(((kind, rid, rtype, flags), g))
                counts[g] = counts.get(g, 0) + 1
            if tx.prepare_file is not None:
                body = encode_pairs(
                    [(g.epoch, n) for g, n in counts.items()], tx.prepare_data or b""
                )
                prep_where[tx.tx_id] = out.put(
                    Kind.PREPARE, 0, 0, 0, tx.tx_id, body, positive=False
                )
        out.finish()
        stage("cmp-written")
        if j._stopping:
            raise CompactionAborted("the journal is stopping")

        # ------------------------------------------------------------ installed
        _install(j, old, out.files, where, tx_where, prep_where)
    except CompactionAborted as exc:
        out.discard()
        with j._lock:
            for f in old:
                f.state = FileState.DATA
            j._compacting = False
        log.warning("journal compaction abandoned", directory=j.directory, reason=str(exc))
        return False
    except BaseException as exc:
        out.discard()
        with j._lock:
            for f in old:
                f.state = FileState.DATA
            j._compacting = False
        if is_no_space(exc):  # before the install: the live state is untouched
            log.warning(
                "journal compaction abandoned: file system full",
                directory=j.directory,
                error=str(exc),
            )
            return False
        raise
    stage("installed")

    # ---------------------------------------------------------------- control-written
    s = j.settings
    control = write_control(
        j.directory,
        s.prefix,
        {
            "version": 1,
            "old": [[f.name, f.epoch] for f in old],
            "new": [
                [os.path.basename(c), f.name, f.epoch]
                for c, f in zip(out.cmp_paths, out.files, strict=True)
            ],
        },
    )
    stage("control-written")

    # ---------------------------------------------------------------- renaming / renamed
    for n, (cmp_path, f) in enumerate(zip(out.cmp_paths, out.files, strict=True)):
        os.rename(cmp_path, f.path)
        if n == 0:
            stage("renaming")
    fsync_dir(j.directory)
    stage("renamed")

    # ---------------------------------------------------------------- old-retired
    for f in old:
        f.state = FileState.RETIRED
        j._recycle(f)
    stage("old-retired")

    # ---------------------------------------------------------------- done
    os.unlink(control)
    fsync_dir(j.directory)
    with j._lock:
        for f in out.files:
            if f.state is FileState.COMPACTED:
                f.state = FileState.DATA
        j._compacting = False
        j._maint_kicks += 1  # copies that died meanwhile can be reclaimed now
        j._maint_cond.notify()
    j.counters.compactions += 1
    log.info(
        "journal compacted",
        directory=j.directory,
        old_files=len(old),
        new_files=len(out.files),
        records=len(where),
    )
    stage("done")
    return True


def _room_to_compact(j: FileJournal, old: list[JFile]) -> bool:
    """Whether the file system can take the compacted copies with a file to spare (lock held).

    Compaction writes its copies before it frees anything, and a file system that fills
    after the copies are installed would fail the control file: better not to start.
    """
    live = j._live_ratio() * len(old) * (j._file_size - DATA_START)
    need = (int(live) // j._file_size + 2) * j._file_size
    try:
        return disk_monitor.free_bytes(j.directory) >= need
    except OSError:
        return False


def _install(
    j: FileJournal,
    old: list[JFile],
    new: list[JFile],
    where: dict[int, list[Any]],
    tx_where: dict[int, list[tuple[tuple[int, int, int, int], JFile]]],
    prep_where: dict[int, JFile],
) -> None:
    """Point the live bookkeeping at the copies (lock taken here); all or nothing."""
    old_set = set(old)
    with j._lock:
        expected = sum(f.pos for f in old)
        moved = 0
        tx_plan = []
        copied_deletes: list[tuple[JFile, int]] = []
        for tx_id in set(tx_where) | set(prep_where):
            placed = tx_where.get(tx_id, [])
            rt = j._txs.get(tx_id)
            if rt is not None:
                old_ops = [i for i, op in enumerate(rt.ops) if op[4] in old_set]
                prep_old = rt.prep in old_set
                if old_ops or prep_old:
                    if len(old_ops) != len(placed) or (prep_old and tx_id not in prep_where):
                        raise CompactionAborted(
                            f"transaction {tx_id}: {len(old_ops)} records in old files, "
                            f"{len(placed)} copied"
                        )
                    ops = list(rt.ops)
                    for i, (_op, g) in zip(old_ops, placed, strict=True):
                        ops[i] = (*ops[i][:4], g)
                    tx_plan.append((rt, ops, prep_where[tx_id] if prep_old else rt.prep))
                    moved += len(old_ops) + prep_old
                    continue
            # Committed (or rolled back) during compaction: its copies are where its
            # records now live, and its copied deletes act like deletes written there.
            for (kind, rid, rtype, flags), g in placed:
                if kind == _ADD_TX:
                    where.setdefault(rid, [g, [], {}])
                elif kind == _UPDATE_TX and rid in where:
                    if flags & FLAG_REPLACEABLE:
                        where[rid][2][rtype] = g
                    else:
                        where[rid][1].append(g)
                elif kind == _DELETE_TX:
                    copied_deletes.append((g, rid))
        rec_plan: list[tuple[int, JFile, list[JFile] | None, dict[int, JFile] | None]] = []
        records = j._records
        for rid, (cadd, cupds, crepl) in where.items():
            st = records.get(rid)
            if st is None:
                continue  # deleted meanwhile: its copies are dead
            if st.__class__ is JFile:
                if st in old_set:
                    rec_plan.append((rid, cadd, None, None))
                    moved += 1
                continue
            assert isinstance(st, UpdatedRecord)
            add = st.add
            if add in old_set:
                add = cadd
                moved += 1
            keep = [u for u in st.upd if u not in old_set]
            n_old = len(st.upd) - len(keep)
            if n_old != len(cupds) and n_old:
                raise CompactionAborted(
                    f"record {rid}: {n_old} updates in old files, {len(cupds)} copied"
                )
            upd = keep + cupds if n_old else keep
            moved += n_old
            repl: dict[int, JFile] | None = None
            if st.repl:
                repl = {}
                for t, g in st.repl.items():
                    if g in old_set:
                        c = crepl.get(t)
                        if c is None:
                            raise CompactionAborted(
                                f"record {rid}: replaceable update of type {t} not copied"
                            )
                        repl[t] = c
                        moved += 1
                    else:
                        repl[t] = g
            rec_plan.append((rid, add, upd, repl))
        if moved != expected:
            raise CompactionAborted(
                f"{expected} live references into the old files, {moved} found in the copies"
            )

        # apply: from here on nothing can fail
        new_set = set(new)
        for rid, add, upd, repl in rec_plan:
            if upd is None:
                records[rid] = add
                add.pos += 1
                continue
            st = records[rid]
            assert isinstance(st, UpdatedRecord)
            st.add = add
            st.upd = upd
            st.repl = repl or None
            for g in (add, *upd, *(repl.values() if repl else ())):
                if g in new_set:
                    g.pos += 1
        for rt, ops, prep in tx_plan:
            rt.ops = ops
            rt.counts = {}
            for op in ops:
                g = op[4]
                rt.counts[g] = rt.counts.get(g, 0) + 1
                if g in new_set:
                    g.pos += 1
            rt.prep = prep
            if prep in new_set:
                prep.pos += 1
        for g, rid in copied_deletes:
            # The copy of a committed DELETE_TX must outlive the copies of what it deleted,
            # or recovery would bring the record back. Unknown target: pin to them all.
            w = where.get(rid)
            targets = {w[0], *w[1], *w[2].values()} if w else new_set
            g.neg |= targets - {g}
        for f in j._files:
            if f not in old_set and f.neg & old_set:
                # Deletes written during compaction refer to old files; their copies are
                # somewhere in the new ones (precisely where is not tracked).
                f.neg = (f.neg - old_set) | new_set
        j._files = sorted([*new, *(f for f in j._files if f not in old_set)], key=lambda f: f.epoch)
        assert sum(f.pos for f in new) == expected
