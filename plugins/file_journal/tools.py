"""Offline tools for the CLI: `scow data print`, `scow data compact`, `scow perf journal`."""

from __future__ import annotations

import dataclasses
import mmap
import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from .files import list_files, read_whole
from .format import (
    ALIGNMENT,
    DATA_START,
    FILE_HEADER,
    FREE_EPOCH,
    HEADER_SIZE,
    MAX_KIND,
    RECORD_HEADER,
    Kind,
    decode_file_header,
)
from .replay import next_valid_record
from .settings import JournalSettings


@dataclass(frozen=True, slots=True)
class RecordView:
    """One record found on disk, valid or not (for `scow data print`)."""

    file: str
    offset: int
    #: the epoch in the file header (0 for a free file)
    file_epoch: int
    #: the epoch in the record header
    epoch: int
    kind: str
    record_id: int
    record_type: int
    tx_id: int
    data_length: int
    valid: bool
    #: why an invalid record is invalid: "stale epoch", "crc mismatch", "truncated"
    reason: str = ""


def iter_records(
    directory: str, prefix: str = "scow-data", ext: str = "scow"
) -> Iterator[RecordView]:
    """Every record in every journal file, in file-number then offset order.

    A file is walked while record headers look sane (known kind, plausible length), so
    the records left over from an earlier use of a recycled file are listed too, marked
    invalid ("stale epoch"), as is what follows them. After a damaged record ("crc
    mismatch", "truncated") the walk goes on at the file's next valid record, as recovery
    does (`replay.next_valid_record`).
    """
    for _number, path in list_files(directory, prefix, ext):
        buf = read_whole(path)
        file_epoch = decode_file_header(bytes(buf[: FILE_HEADER.size]))
        if file_epoch is None:
            continue
        name = os.path.basename(path)
        mv = memoryview(buf)
        off = DATA_START
        end = len(buf)
        still_valid = file_epoch != FREE_EPOCH
        while off + HEADER_SIZE <= end:
            crc, kind, rtype, _flags, epoch, length, rid, tx = RECORD_HEADER.unpack_from(buf, off)
            if kind == 0 or kind > MAX_KIND or length < HEADER_SIZE:
                break
            reason = ""
            if off + length > end:
                reason = "truncated"
            elif zlib.crc32(mv[off + 4 : off + length]) != crc:
                reason = "crc mismatch"
            elif epoch != file_epoch:
                reason = "stale epoch"
            valid = still_valid and not reason
            if not valid:
                still_valid = False
                reason = reason or "after an invalid record"
            yield RecordView(
                name,
                off,
                file_epoch,
                epoch,
                Kind(kind).name,
                rid,
                rtype,
                tx,
                length - HEADER_SIZE,
                valid,
                reason,
            )
            if reason in ("truncated", "crc mismatch"):
                resume = next_valid_record(buf, off + 1, file_epoch)
                if resume is None:
                    break
                off, still_valid = resume, True
                continue
            off += length


def compact_offline(directory: str, settings: JournalSettings | None = None) -> dict[str, int]:
    """Compact a stopped journal: load, compact whatever the thresholds, stop.

    Returns counts of data files before and after and of live records.
    """
    from .journal import FileJournal

    base = settings or JournalSettings()
    s = dataclasses.replace(base, directory=directory)
    journal = FileJournal(s)
    result = journal.load()
    before = len(journal.data_files())
    try:
        journal.compact()
        after = len(journal.data_files())
    finally:
        journal.stop()
    return {"files_before": before, "files_after": after, "records": len(result.records)}


def measure_sync_rate(
    directory: str, seconds: float = 2.0, *, block_size: int = ALIGNMENT, datasync: bool = True
) -> tuple[float, int]:
    """Write and sync aligned blocks for `seconds`; return (syncs per second, the
    `journal-buffer-timeout` in ns that matches: one sync per timeout)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f".scow-sync-test-{os.getpid()}")
    blocks = 256
    buf = mmap.mmap(-1, block_size)
    buf.write(b"S" * block_size)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, blocks * block_size)
        os.fsync(fd)
        sync = os.fdatasync if datasync else os.fsync
        count = 0
        started = time.perf_counter()
        deadline = started + seconds
        while True:
            os.pwrite(fd, buf, (count % blocks) * block_size)
            sync(fd)
            count += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        rate = count / (now - started)
    finally:
        os.close(fd)
        buf.close()
        os.unlink(path)
    return rate, int(1e9 / rate) if rate > 0 else 0
