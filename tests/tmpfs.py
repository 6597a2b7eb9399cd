"""Small file systems for disk-full tests: a tmpfs mounted for the test, and a filler.

`mount -t tmpfs -o size=32m tmpfs DIR` needs root (or CAP_SYS_ADMIN); where it is not
permitted `mount_tmpfs` says why, and `tmpfs` skips the test saying so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Tmpfs:
    path: Path

    def unmount(self) -> None:
        # lazy: a broker killed a moment ago may still hold files open
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)

    def free_bytes(self) -> int:
        return free_bytes(self.path)


def mount_tmpfs(path: Path, size: str) -> Tmpfs | str:
    """Mount a tmpfs of `size` ("1m", "24m") at `path` (created); a reason string when
    that is not permitted."""
    if shutil.which("mount") is None:
        return "no mount command"
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        return f"cannot mount a tmpfs here ({result.stderr.strip() or result.returncode})"
    return Tmpfs(path)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """`path` on a new tmpfs of `size`, unmounted at the end; skips the test where
    mounting is refused."""
    mounted = mount_tmpfs(path, size)
    if isinstance(mounted, str):
        pytest.skip(mounted)
    try:
        yield mounted.path
    finally:
        mounted.unmount()


class Filler:
    """Takes the free space of a file system with one file, and gives it back."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self, leave: int = 0, chunk: int = 1 << 20) -> int:
        """Write zeros until ENOSPC (or only `leave` bytes are free); returns bytes written.

        Unbuffered: a buffered file would try the refused bytes again as it closes."""
        written = 0
        block = b"\0" * chunk
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while True:
                free = free_bytes(self.path.parent)
                if free <= leave:
                    break
                piece = block if free - leave >= chunk else block[: max(free - leave, 4096)]
                try:
                    written += os.write(fd, piece)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        finally:
            os.close(fd)
        return written

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def fill(fs: Path) -> Path:
    """Fill the file system at `fs` with a file named `filler`; its path."""
    filler = Filler(fs / "filler")
    filler.fill()
    return filler.path


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free
