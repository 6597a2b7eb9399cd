"""One broker per data dir: a kernel lock on `<data-dir>/broker.lock`.

The lock is `flock(2)` on an open file, so it belongs to the process holding the file
open: a broker that exits, crashes or is killed with SIGKILL frees it at once, and there
is no stale lock file to clean up (the file stays; only the lock matters). On Linux,
flock on NFSv4 is carried by the server's byte-range locks, so it also holds between
machines sharing the directory. The holder writes its pid and host into the file, for
the refusal message of the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DataDirLocked(
                f"data dir {self.data_dir.resolve()} is in use by another broker "
                f"({holder}); stop it first, or give this one its own [broker] data-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the last descriptor frees the lock


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if text:
            return text
    return "pid unknown"
