"""A file journal on a file system that fills: refuses what it cannot store, keeps working.

Each test mounts a small tmpfs (root only; skipped elsewhere) and fills it with a filler
file, so making the next journal file meets ENOSPC for real.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from scow.core import disk_monitor
from scow.core.disk_monitor import DiskMonitor
from scow.core.model import MemoryLimits, ResourceLimitExceeded, StorageFull
from scow.core.testing import wait_for_async
from scow.plugins.file_journal import FileJournal
from tests.tmpfs import fill

from .helpers import load, settings, wait_until

FILE = 64 * 1024
HELD = 1  # a record type held back while the file system is full (messages)
BOOK = 2  # a record type that may use the reserve (bookkeeping)
BODY = b"m" * 1000
PER_FILE = (FILE - 4096) // (len(BODY) + 32)  # records of BODY in one file


def open_on(directory: Path, **changes) -> FileJournal:
    directory.mkdir(exist_ok=True)
    journal = FileJournal(
        settings(directory, journal_file_size=FILE, journal_buffer_timeout=0, **changes)
    )
    journal.load()
    journal.hold_back({HELD})
    wait_until(lambda: len(journal.free_files()) >= 1, what="the spare file")
    return journal


def use_the_last_spare(journal: FileJournal, first: int) -> list[int]:
    """On a full file system: add HELD records until the journal rolls into its last spare
    and finds it cannot make another; the ids added."""
    files = len(journal.data_files())
    added = []
    rid = first
    while len(journal.data_files()) == files:
        journal.append_add(rid, HELD, BODY, sync=False)
        added.append(rid)
        rid += 1
    wait_until(lambda: journal.stats()["no-room"] is not None, what="the files thread to give up")
    return added


def add_until_refused(journal: FileJournal, first: int, done: list[int]) -> tuple[list[int], str]:
    """Add HELD records from id `first` until one is refused; (the ids added, the reason)."""
    added: list[int] = []
    for rid in range(first, first + 10_000):
        try:
            journal.append_add(rid, HELD, BODY, sync=True, on_done=lambda rid=rid: done.append(rid))
        except StorageFull as exc:
            return added, exc.description
        added.append(rid)
    raise AssertionError("the journal never refused a record on a full file system")


def add_several_files(journal: FileJournal) -> list[int]:
    """Once there is room again: ids 20,000-20,199 added and flushed (several more files)."""
    later = list(range(20_000, 20_200))
    for rid in later:
        journal.append_add(rid, HELD, BODY, sync=True)
    journal.flush()
    return later


def test_full_file_system_refuses_new_records_and_the_journal_goes_on(small_fs: Path) -> None:
    journal = open_on(small_fs / "journal")
    done: list[int] = []
    try:
        filler = fill(small_fs)
        first = use_the_last_spare(journal, 1)
        more, reason = add_until_refused(journal, first[-1] + 1, done)
        added = first + more
        # what fitted in the files at hand was taken and made durable
        assert len(added) > 1.4 * PER_FILE  # the current file, half of the last spare
        journal.flush()
        assert sorted(done) == more
        assert str(small_fs / "journal") in reason and "no room" in reason
        assert journal.stats()["no-room"]
        # a refusal is a resource limit (amqp:resource-limit-exceeded), not a dead journal
        with pytest.raises(ResourceLimitExceeded):
            journal.append_add(99_999, HELD, BODY, sync=True)
        # deleting frees what consumers are done with: still written
        for rid in added[:10]:
            journal.append_delete(rid, sync=True)
        journal.flush()

        filler.unlink()
        wait_until(lambda: journal.stats()["no-room"] is None, what="room again")
        later = add_several_files(journal)
    finally:
        journal.stop()
    assert [r.id for r in load(small_fs / "journal", journal_file_size=FILE).records] == [
        *added[10:],
        *later,
    ]


def test_the_reserve_takes_what_frees_space_until_it_too_is_full(small_fs: Path) -> None:
    journal = open_on(small_fs / "journal")
    try:
        filler = fill(small_fs)
        first = use_the_last_spare(journal, 1)
        added = first + add_until_refused(journal, first[-1] + 1, [])[0]
        # bookkeeping adds and deletes still fit in the reserve, until the file is full
        books: list[int] = []
        deleted: list[int] = []
        with pytest.raises(StorageFull):
            for rid in range(50_000, 60_000):
                journal.append_add(rid, BOOK, b"b" * 200, sync=False)
                books.append(rid)
        assert len(books) > 50
        with pytest.raises(StorageFull):
            for rid in added:
                journal.append_delete(rid, sync=False)
                deleted.append(rid)
        # a refused delete changed nothing: the record is still live, and deletable later
        refused = added[len(deleted)]
        journal.flush()
        filler.unlink()
        wait_until(lambda: journal.stats()["no-room"] is None, what="room again")
        journal.append_delete(refused, sync=True)
        journal.append_add(70_000, HELD, BODY, sync=True)
    finally:
        journal.stop()
    live = {r.id for r in load(small_fs / "journal", journal_file_size=FILE).records}
    assert live == (set(added) - set(deleted) - {refused}) | set(books) | {70_000}


def test_consumers_freeing_whole_files_let_producers_go_on_without_new_space(
    small_fs: Path,
) -> None:
    journal = open_on(small_fs / "journal")
    try:
        filler = fill(small_fs)  # removed only to reload (which starts in a new file)
        added, _reason = add_until_refused(journal, 1, [])
        for rid in added:  # a consumer takes everything
            journal.append_delete(rid, sync=True)
        journal.flush()
        # the files it emptied are recycled: a spare without a byte more on the disk
        wait_until(lambda: journal.stats()["no-room"] is None, what="a recycled spare")
        more, _reason = add_until_refused(journal, 10_000, [])
        assert len(more) > PER_FILE // 2
    finally:
        journal.stop()
    filler.unlink()
    assert [r.id for r in load(small_fs / "journal", journal_file_size=FILE).records] == more


def test_the_disk_monitor_blocks_producers_while_the_journal_has_no_room(
    small_fs: Path,
) -> None:
    async def scenario() -> None:
        limits = MemoryLimits()
        monitor = DiskMonitor(
            limits,
            [small_fs],
            {"max-disk-usage": -1, "min-disk-free": -1, "disk-scan-period": 60_000},
        )
        await monitor.start()
        loop = asyncio.get_running_loop()
        journal = await loop.run_in_executor(None, open_on, small_fs / "journal")
        try:
            filler = fill(small_fs)
            add_until_refused(journal, 1, [])
            await wait_for_async(lambda: limits.disk_full)
            assert limits.reasons == ["disk"]
            assert "journal" in (monitor.problem() or "")
            os.unlink(filler)
            await wait_for_async(lambda: not limits.disk_full)
            journal.append_add(30_000, HELD, BODY, sync=True)
        finally:
            await loop.run_in_executor(None, journal.stop)
            await monitor.stop()

    asyncio.run(scenario())


def test_allocations_count_as_headroom_in_the_disk_limits(tmp_path: Path) -> None:
    async def scenario() -> None:
        st = os.statvfs(tmp_path)
        free = st.f_bavail * st.f_frsize
        limits = MemoryLimits()
        monitor = DiskMonitor(
            limits,
            [tmp_path],
            {"max-disk-usage": -1, "min-disk-free": free // 2, "disk-scan-period": 60_000},
        )
        await monitor.start()
        try:
            assert not limits.disk_full
            # a file as large as most of what is free is about to be made under tmp_path
            disk_monitor.allocating(tmp_path / "journal", free - free // 4)
            for _ in range(100):
                await asyncio.sleep(0.01)
                if limits.disk_full:
                    break
            assert limits.disk_full
            assert "with room for a" in (monitor.problem() or "")
        finally:
            await monitor.stop()

    asyncio.run(scenario())


def test_a_write_refused_for_space_is_tried_again_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # copy-on-write file systems can refuse even a write into a zero-filled file
    from scow.plugins.file_journal import journal as journal_module

    monkeypatch.setattr(journal_module, "_RETRY", 0.01)
    journal = FileJournal(settings(tmp_path, journal_buffer_timeout=0))
    journal.load()
    assert journal._writer is not None
    write = journal._writer.write
    refusals = [OSError(errno.ENOSPC, "No space left on device")] * 3

    def flaky(batch) -> None:  # type: ignore[no-untyped-def]
        if refusals:
            raise refusals.pop()
        write(batch)

    monkeypatch.setattr(journal._writer, "write", flaky)
    done: list[int] = []
    try:
        journal.append_add(1, HELD, BODY, sync=True, on_done=lambda: done.append(1))
        journal.flush()
        assert done == [1] and refusals == []
        journal.append_add(2, HELD, BODY, sync=True)
    finally:
        journal.stop()
    assert [r.id for r in load(tmp_path).records] == [1, 2]
