"""Small file systems for disk-full tests: a tmpfs mounted for the test, and a filler.

Mounting needs root (or CAP_SYS_ADMIN); where it is not permitted the test is skipped,
saying why.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """`path` (created) on a new tmpfs of `size` ("1m", "24m"), unmounted at the end."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        # lazy: a broker killed a moment ago may still hold files open
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(fs: Path) -> Path:
    """Write a filler file until the file system refuses; its path."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = bytes(64 * 1024)
        while chunk:
            try:
                f.write(chunk)
            except OSError:
                chunk = chunk[: len(chunk) // 2]
    return filler


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
