"""Group commit, durability settings, AIO (O_DIRECT) and its fallback, IO failures."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from scow.core.conformance.journal import Completions
from scow.core.interfaces import RecordInfo
from scow.plugins.file_journal import FileJournal, JournalError, writer
from scow.plugins.file_journal.writer import probe_direct_io

from .helpers import load, open_journal, records_on_disk, settings


@pytest.fixture(params=["NIO", "AIO"])
def journal_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_group_commit_covers_many_appends_with_few_syncs(tmp_path: Path, journal_type: str) -> None:
    j = open_journal(tmp_path, journal_type, journal_file_size=10 * 1024 * 1024)
    done = Completions()
    try:
        for i in range(1, 5001):
            j.append_add(i, 1, b"m" * 100, sync=True, on_done=done(i))
        done.wait_for(5000)
        assert j.counters.syncs < 500, j.counters
        assert j.counters.batches < 500
    finally:
        j.stop()
    assert done.order == list(range(1, 5001))


def test_each_batch_is_dispatched_in_one_call_after_its_sync(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []  # (completions in the call, syncs done before it)
    done = Completions()
    j = FileJournal(settings(tmp_path, journal_file_size=10 * 1024 * 1024))

    def dispatch(completions: list) -> None:  # type: ignore[type-arg]
        calls.append((len(completions), j.counters.syncs))
        for c in completions:
            c()

    j.set_dispatcher(dispatch)
    j.load()
    try:
        for i in range(1, 2001):
            j.append_add(i, 1, b"m" * 100, sync=True, on_done=done(i))
        done.wait_for(2000)
    finally:
        j.stop()
    assert sum(n for n, _ in calls) == 2000
    assert len(calls) < 2000 / 4  # batched
    syncs_seen = [s for _, s in calls]
    # every call comes after a sync of its own: sync counts strictly increase
    assert all(b > a for a, b in zip([0, *syncs_seen], syncs_seen, strict=False))


def test_a_full_buffer_is_written_without_waiting_for_the_timeout(tmp_path: Path) -> None:
    j = open_journal(tmp_path, journal_buffer_timeout=30 * 10**9, journal_buffer_size=8192)
    done = threading.Event()
    try:
        j.append_add(1, 1, b"a", sync=True)  # the first batch goes at once...
        j.append_add(2, 1, b"b", sync=True, on_done=done.set)  # ...this one waits 30 s...
        started = time.monotonic()
        for i in range(3, 100):  # ...unless the buffer fills up
            j.append_add(i, 1, b"f" * 200, sync=False)
        assert done.wait(10)
        assert time.monotonic() - started < 10
    finally:
        j.stop()


def test_non_sync_appends_complete_without_any_sync(tmp_path: Path, journal_type: str) -> None:
    j = open_journal(tmp_path, journal_type)
    done = Completions()
    try:
        for i in range(1, 101):
            j.append_add(i, 1, b"x", sync=False, on_done=done(i))
        done.wait_for(100)
        assert j.counters.syncs == 0
        j.flush()  # flush makes them durable anyway
        assert j.counters.syncs >= 1
    finally:
        j.stop()
    assert done.order == list(range(1, 101))


def test_sync_settings_false_override_sync_requests(tmp_path: Path) -> None:
    j = open_journal(
        tmp_path, journal_sync_non_transactional=False, journal_sync_transactional=False
    )
    done = Completions()
    try:
        j.append_add(1, 1, b"x", sync=True, on_done=done(1))
        j.append_add_tx(5, 2, 1, b"y")
        j.commit(5, sync=True, on_done=done(2))
        done.wait_for(2)
        assert j.counters.syncs == 0
    finally:
        j.stop()


def test_fsync_is_used_when_datasync_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: (used.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(
        os, "fdatasync", lambda fd: (used.append("fdatasync"), real_fdatasync(fd))[1]
    )
    j = open_journal(tmp_path, journal_datasync=False)
    used.clear()
    try:
        j.append_add(1, 1, b"x", sync=True)
        j.flush()
    finally:
        j.stop()
    assert "fsync" in used and "fdatasync" not in used


def test_aio_writes_with_o_direct_in_aligned_batches(tmp_path: Path) -> None:
    if probe_direct_io(str(tmp_path)) is not None:
        pytest.skip("this filesystem refuses O_DIRECT")
    j = open_journal(tmp_path, "AIO")
    try:
        assert j.effective_type == "AIO"
        for i in range(1, 50):
            j.append_add(i, 1, b"z" * 77, sync=True)
            if i % 10 == 0:
                j.flush()
    finally:
        j.stop()
    views = records_on_disk(tmp_path)
    pads = [v for v in views if v.kind == "PAD" and v.valid]
    assert pads, "O_DIRECT batches end with a PAD record up to the block boundary"
    for pad in pads:
        assert (pad.offset + 32 + pad.data_length) % 4096 == 0
    assert [r.id for r in load(tmp_path, "AIO").records] == list(range(1, 50))


def test_aio_falls_back_to_nio_when_o_direct_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refuse_direct(path, flags, *args, **kwargs):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse_direct)
    with capture_logs() as logs:
        j = open_journal(tmp_path, "AIO")
    try:
        assert j.effective_type == "NIO"
        j.append_add(1, 1, b"still works", sync=True)
    finally:
        j.stop()
    fallback = [e for e in logs if "falling back to NIO" in e["event"]]
    assert len(fallback) == 1 and e_level(fallback[0]) == "warning"
    assert "Invalid argument" in fallback[0]["error"]
    assert load(tmp_path, "AIO").records == [RecordInfo(1, 1, b"still works")]


def e_level(event: dict) -> str:  # type: ignore[type-arg]
    return str(event["log_level"])


def test_aio_on_tmpfs_falls_back_to_nio(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or probe_direct_io(str(shm)) is None:
        pytest.skip("no tmpfs that refuses O_DIRECT here")
    directory = shm / f"scow-journal-test-{os.getpid()}-{tmp_path.name}"
    try:
        j = open_journal(directory, "AIO")
        assert j.effective_type == "NIO"
        j.append_add(1, 1, b"on tmpfs", sync=True)
        j.stop()
        assert load(directory, "AIO").records == [RecordInfo(1, 1, b"on tmpfs")]
    finally:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def test_writer_falls_back_when_o_direct_fails_at_open_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe passes but opening a journal file with O_DIRECT fails later.
    j = FileJournal(settings(tmp_path, "AIO"))
    monkeypatch.setattr("scow.plugins.file_journal.journal.probe_direct_io", lambda d: None)
    real_open = os.open

    def refuse_direct(path, flags, *args, **kwargs):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse_direct)
    with capture_logs() as logs:
        j.load()
        j.append_add(1, 1, b"x", sync=True)
        j.flush()
        j.stop()
    assert any("falling back to NIO" in e["event"] for e in logs)
    assert load(tmp_path).records == [RecordInfo(1, 1, b"x")]


def test_a_failed_write_fails_the_journal_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = open_journal(tmp_path)
    done = Completions()

    def io_error(*_args: object) -> int:
        # not ENOSPC: a write refused for space is tried again (see test_disk_full)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(writer.os, "pwrite", io_error)
    with capture_logs() as logs:
        j.append_add(1, 1, b"x", sync=True, on_done=done(1))
        with pytest.raises(JournalError, match="Input/output error"):
            j.flush()
        with pytest.raises(JournalError):
            j.append_add(2, 1, b"y", sync=True)
        j.stop()
    assert done.order == []  # never reported durable
    assert any(e["log_level"] == "error" and "journal failed" in e["event"] for e in logs)
