"""One broker per data dir: a kernel lock on `<data-dir>/broker.lock`.

The lock is `flock(2)` on an open file, so it belongs to the process holding the file
open: a broker that exits, crashes or is killed with SIGKILL frees it at once. A file
left by a killed broker is not a stale lock (only the kernel lock counts); a clean stop
removes it. On Linux,
flock on NFSv4 is carried by the server's byte-range locks, so it also holds between
machines sharing the directory. The holder writes its pid and host into the file, for
the refusal message of the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "broker.lock"


class DataDirLocked(Exception):
    """Another process holds the data dir; the message names the directory and the holder."""


class DataDirLock:
    """The lock on one data dir; `acquire()` takes it, `release()` (or exit) frees it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, wait: bool = False) -> None:
        """Take the lock, creating the data dir if needed.

        Without `wait`, a lock held elsewhere raises DataDirLocked at once; with it, this
        blocks until the holder goes away.
        """
        if self._fd is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise DataDirLocked(
                    f"data dir {self.data_dir.resolve()} is in use by another broker "
                    f"({holder}); stop it first"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the holder removed it as it stopped: lock the file there now
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file (a clean stop leaves nothing behind) and free the lock."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # still locked: a waiter sees it gone and retries
            os.close(fd)  # closing the last descriptor frees the lock


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (a releasing holder unlinks it)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if text:
            return text
    return "pid unknown"


@contextlib.contextmanager
def offline(data_dir: Path) -> Iterator[None]:
    """Hold the data dir's lock while a command rewrites what a broker would own (import,
    compact): DataDirLocked while a broker runs on it."""
    lock = DataDirLock(data_dir)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
