"""Shared helpers for the file journal tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scow.plugins.file_journal import FileJournal, JournalSettings, RecordView, iter_records

SMALL_FILE = 64 * 1024
WAIT = 10.0


def settings(path: Path | str, journal_type: str = "NIO", **changes: Any) -> JournalSettings:
    """Small files so a few hundred records span several of them."""
    values: dict[str, Any] = {
        "directory": str(path),
        "journal_file_size": SMALL_FILE,
        "journal_type": journal_type,
    }
    values.update(changes)
    return JournalSettings(**values)


def open_journal(path: Path | str, journal_type: str = "NIO", **changes: Any) -> FileJournal:
    journal = FileJournal(settings(path, journal_type, **changes))
    journal.load()
    return journal


def load(path: Path | str, journal_type: str = "NIO", **changes: Any):
    """Load a journal directory and stop again; the LoadResult."""
    journal = FileJournal(settings(path, journal_type, **changes))
    try:
        return journal.load()
    finally:
        journal.stop()


def snapshot(src: Path, dst: Path) -> Path:
    """Copy a journal directory as it is on disk now: a crash image once flushed.

    A spare file being created meanwhile (`*.tmp`) is left out, as if the crash came first.
    """
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.tmp"))
    return dst


def records_on_disk(
    path: Path | str, prefix: str = "scow-data", ext: str = "scow"
) -> list[RecordView]:
    return list(iter_records(str(path), prefix, ext))


def cut_copies(data_dir: Path) -> Iterator[tuple[int, Path]]:
    """Copies of a broker's data dir whose message journal (one file) ends at each point
    a crash can leave it: at each record, and after the last; yields (the offset it ends
    at, the copy). A SIGKILL leaves a prefix of what the journal wrote: the page cache
    keeps every write made before it."""
    records = [r for r in records_on_disk(data_dir / "journal") if r.valid and r.kind != "PAD"]
    assert len({r.file for r in records}) == 1, "cut_copies cuts a journal of one file"
    last = records[-1]
    for cut in sorted({r.offset for r in records} | {last.offset + 32 + last.data_length}):
        copy = data_dir.with_name(f"{data_dir.name}-cut-{cut}")
        shutil.copytree(data_dir, copy)
        with open(copy / "journal" / last.file, "r+b") as f:  # what was never written
            size = f.seek(0, 2)
            f.seek(cut)
            f.write(bytes(size - cut))
        yield cut, copy


def valid_records(path: Path | str) -> list[RecordView]:
    """Valid records in journal order (files by epoch, then offset)."""
    views = [v for v in records_on_disk(path) if v.valid]
    return sorted(views, key=lambda v: (v.file_epoch, v.offset))


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT, what: str = "") -> None:
    """Poll `predicate` until true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.002)


def run_child(code: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run Python code (with `sys.argv[1:]` = args) in a fresh interpreter that has this
    one's import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
