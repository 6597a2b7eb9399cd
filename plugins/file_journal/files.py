"""Journal files on disk: the in-memory `JFile` (and `UpdatedRecord`, the files a record
with updates lives in), creating, recycling and listing files."""

from __future__ import annotations

import contextlib
import errno
import os
from enum import IntEnum

from .format import (
    DATA_START,
    FREE_EPOCH,
    HEADER_SIZE,
    RECORD_HEADER,
    encode_file_header,
    file_name_pattern,
    whole_record,
)

_ZEROS = bytes(1 << 20)
_fallocate = getattr(os, "posix_fallocate", None)


class FileState(IntEnum):
    """Where a file is in its life."""

    FREE = 0  #: recycled or new, header says FREE_EPOCH; in the pool
    DATA = 1  #: holds records (the newest DATA file is the one being written)
    COMPACTING = 2  #: a DATA file whose live records the compactor is copying out
    COMPACTED = 3  #: a compactor output file not yet installed as DATA
    RETIRED = 4  #: reclaimed; no longer referenced, about to be recycled or deleted


class JFile:
    """One journal file and its reclaim bookkeeping.

    `pos` counts what in this file is still needed: live adds and updates plus one pin per
    record of an open transaction. `neg` holds the earlier files this file's deletes,
    commits and rollbacks refer to: this file must outlive them, or recovery would
    resurrect what those records cancel.
    """

    __slots__ = (
        "entry_unsynced",
        "epoch",
        "fd",
        "neg",
        "number",
        "path",
        "pos",
        "size",
        "state",
        "used",
        "written",
    )

    def __init__(self, path: str, number: int, size: int, epoch: int = FREE_EPOCH) -> None:
        self.path = path
        self.number = number
        self.size = size
        self.epoch = epoch
        self.pos = 0
        #: positive records (adds, updates) ever written, for the live-data estimate
        self.written = 0
        #: bytes in use (end of the last record)
        self.used = DATA_START
        self.neg: set[JFile] = set()
        self.state = FileState.FREE
        self.fd = -1
        #: Made without a sync (`create_file`): its directory entry, its size and its
        #: header are synced with the first records synced in it.
        self.entry_unsynced = False

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def __repr__(self) -> str:
        return (
            f"JFile({self.name}, epoch={self.epoch}, state={self.state.name}, "
            f"pos={self.pos}, neg={sorted(f.epoch for f in self.neg)})"
        )


class UpdatedRecord:
    """A live record that has updates (a record with only an add is just its `JFile`)."""

    __slots__ = ("add", "repl", "upd")

    def __init__(self, add: JFile) -> None:
        self.add = add
        self.upd: list[JFile] = []
        self.repl: dict[int, JFile] | None = None

    def files(self) -> list[JFile]:
        out = [self.add, *self.upd]
        if self.repl:
            out.extend(self.repl.values())
        return out


def fsync_dir(directory: str) -> None:
    """Make renames and unlinks in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_fd(fd: int, datasync: bool) -> None:
    """fdatasync or fsync, as `journal-datasync` says."""
    if datasync:
        os.fdatasync(fd)
    else:
        os.fsync(fd)


def create_file(path: str, size: int, *, sync: bool = True) -> None:
    """Create a zero-filled free file atomically (written as `<path>.tmp`, then renamed).

    Zero-filling up front means later appends never extend the file, so fdatasync has no
    size metadata to write and the blocks are allocated before the hot path needs them.
    The blocks are reserved first (fallocate), so a full file system refuses at once
    instead of after most of the zeros; on any failure the partial file is removed, so a
    full disk is never left fuller.

    Without `sync` (a file made while appends wait for it) nothing waits on the disk:
    fallocate's blocks read as zeros unwritten, and neither the file nor its directory
    entry is synced; whoever first syncs records in it syncs the entry too
    (`JFile.entry_unsynced`).
    """
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        reserved = False
        if _fallocate is not None:
            try:
                _fallocate(fd, 0, size)
                reserved = True
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS):
                    raise
        os.write(fd, encode_file_header(FREE_EPOCH))
        done = DATA_START if sync or not reserved else size
        while done < size:
            done += os.write(fd, _ZEROS[: min(len(_ZEROS), size - done)])
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    if sync:
        fsync_dir(os.path.dirname(path) or ".")


def write_header(path: str, epoch: int) -> None:
    """Rewrite a file's header and sync it. A file marked free (FREE_EPOCH) also loses
    its first record's header: its old records stay behind it, and with its own header
    damaged, a first record whose CRC holds would make it a data file again
    (`first_record_epoch`)."""
    block = encode_file_header(epoch)
    if epoch == FREE_EPOCH:
        block += bytes(HEADER_SIZE)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, block, 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def first_record_epoch(path: str) -> int | None:
    """The epoch a file's first record names, if a whole one whose CRC holds is there:
    what a file whose own header is damaged had (every record names its file's epoch)."""
    buf = read_whole(path)
    if len(buf) < DATA_START + HEADER_SIZE or not whole_record(buf, DATA_START):
        return None
    epoch = int(RECORD_HEADER.unpack_from(buf, DATA_START)[4])
    return None if epoch == FREE_EPOCH else epoch


def read_block(path: str, length: int = DATA_START) -> bytes:
    """The first `length` bytes of a file (fewer if the file is shorter)."""
    with open(path, "rb", buffering=0) as f:
        return f.read(length)


def read_whole(path: str) -> bytearray:
    """A whole file in one read: recovery parses it in place."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        view = memoryview(buf)
        done = 0
        while done < size:
            n = f.readinto(view[done:])
            if not n:
                break
            done += n
        view.release()
        if done < size:
            del buf[done:]
        return buf


def list_files(directory: str, prefix: str, extension: str) -> list[tuple[int, str]]:
    """(number, path) of every journal file of this prefix and extension, by number."""
    pattern = file_name_pattern(prefix, extension)
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        m = pattern.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(directory, name)))
    found.sort()
    return found


def move_to_attic(path: str) -> str:
    """Move a damaged file into `attic/` beside it, keeping it for inspection."""
    attic = os.path.join(os.path.dirname(path), "attic")
    os.makedirs(attic, exist_ok=True)
    target = os.path.join(attic, os.path.basename(path))
    n = 1
    while os.path.exists(target):
        target = os.path.join(attic, f"{os.path.basename(path)}.{n}")
        n += 1
    os.rename(path, target)
    return target
