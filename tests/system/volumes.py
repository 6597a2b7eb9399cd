"""A small file system for the broker's data dir, and a way to fill it.

`mount -t tmpfs -o size=32m tmpfs DIR` needs root (or CAP_SYS_ADMIN); where it is not
permitted `mount_tmpfs` says why and the caller skips.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Tmpfs:
    path: Path

    def unmount(self) -> None:
        # lazy: a broker killed a moment ago may still hold files open
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free


def mount_tmpfs(path: Path, size: str) -> Tmpfs | str:
    """Mount a tmpfs of `size` at `path`; a reason string when that is not permitted."""
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
                free = shutil.disk_usage(self.path.parent).free
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
