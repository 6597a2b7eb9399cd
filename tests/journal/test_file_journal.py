"""FileJournal: the shared conformance suite (NIO and AIO) and its own API rules."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from scow.core.conformance.journal import JournalConformance
from scow.core.interfaces import RecordInfo
from scow.plugins.file_journal import FileJournal, JournalSettings

from .helpers import SMALL_FILE, load, open_journal, settings, wait_until


class TestFileJournalConformance(JournalConformance):
    @pytest.fixture(params=["NIO", "AIO"])
    def make_journal(self, request: pytest.FixtureRequest):
        journal_type = request.param
        return lambda path: FileJournal(settings(path, journal_type))


class TestFileJournalConformanceUnbuffered(JournalConformance):
    """No group-commit wait (`journal-buffer-timeout` 0) and a pipelined syncer."""

    @pytest.fixture
    def make_journal(self):
        return lambda path: FileJournal(
            settings(path, "NIO", journal_buffer_timeout=0, journal_max_io=4)
        )


@pytest.fixture(params=["NIO", "AIO"])
def journal_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_records_spanning_many_files_reload(tmp_path: Path, journal_type: str) -> None:
    j = open_journal(tmp_path, journal_type)
    payload = [bytes([i % 251]) * (i % 700) for i in range(2000)]
    for i, data in enumerate(payload):
        j.append_add(i + 1, 1, data, sync=False)
    files = len(j.data_files())
    j.stop()
    assert files > 10
    assert load(tmp_path, journal_type).records == [
        RecordInfo(i + 1, 1, data) for i, data in enumerate(payload)
    ]


def test_min_files_are_created_up_front_zero_filled(tmp_path: Path) -> None:
    j = open_journal(tmp_path, journal_min_files=4)
    try:
        names = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".scow")
        assert len(names) >= 4
        for name in names:
            assert (tmp_path / name).stat().st_size == SMALL_FILE
        assert all(n.startswith("scow-data-") for n in names)
    finally:
        j.stop()


def test_a_spare_file_is_prepared_in_the_background(tmp_path: Path) -> None:
    j = open_journal(tmp_path, journal_min_files=1)
    try:
        next_id = 1
        for rolls in range(1, 4):
            wait_until(lambda: len(j.free_files()) >= 1, what="a spare file")
            while len(j.data_files()) == rolls:
                j.append_add(next_id, 1, b"x" * 100, sync=False)
                next_id += 1
        # every roll found a spare the files thread had made; none was made inline
        assert j.counters.files_created_inline == 0
        assert len(j.data_files()) == 4
    finally:
        j.stop()


def test_custom_prefix_and_extension(tmp_path: Path) -> None:
    j = open_journal(tmp_path, prefix="bindings", extension="bnd")
    j.append_add(1, 1, b"q", sync=True)
    j.stop()
    assert {p.name for p in tmp_path.iterdir()} >= {"bindings-1.bnd"}
    assert load(tmp_path, prefix="bindings", extension="bnd").records == [RecordInfo(1, 1, b"q")]


def test_update_and_delete_of_unknown_records_are_refused(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    try:
        with pytest.raises(ValueError, match="update of record id 9: no live record"):
            j.append_update(9, 1, b"", sync=True)
        with pytest.raises(ValueError, match="delete of record id 9: no live record"):
            j.append_delete(9, sync=True)
        j.append_add(9, 1, b"", sync=True)
        with pytest.raises(ValueError, match="add of record id 9: a live record already"):
            j.append_add(9, 1, b"", sync=True)
    finally:
        j.stop()


def test_out_of_range_ids_and_types_are_refused(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    try:
        with pytest.raises(ValueError, match=r"types 0\.\.255"):
            j.append_add(1, 256, b"", sync=True)
        with pytest.raises(ValueError, match=r"ids are 0..2\*\*64-1"):
            j.append_add(2**64, 1, b"", sync=True)
    finally:
        j.stop()


def test_a_record_larger_than_a_file_is_refused_with_the_limit(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    try:
        with pytest.raises(ValueError, match=r"does not fit in a journal file; at most \d+ bytes"):
            j.append_add(1, 1, bytes(SMALL_FILE), sync=True)
        limit = SMALL_FILE - 4096 - 32 - 32
        j.append_add(2, 1, bytes(limit), sync=True)
    finally:
        j.stop()
    assert load(tmp_path).records == [RecordInfo(2, 1, bytes(limit))]


def test_appends_before_load_and_after_stop_are_refused(tmp_path: Path) -> None:
    j = FileJournal(settings(tmp_path))
    with pytest.raises(RuntimeError, match="call load"):
        j.append_add(1, 1, b"", sync=True)
    j.load()
    j.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        j.append_add(1, 1, b"", sync=True)
    with pytest.raises(RuntimeError, match="only once"):
        j.load()


def test_stop_without_load_is_harmless(tmp_path: Path) -> None:
    FileJournal(settings(tmp_path)).stop()


def test_flush_from_a_completion_on_the_writer_thread_is_refused(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    errors: list[BaseException] = []
    ran = threading.Event()

    def done() -> None:
        try:
            j.flush()
        except RuntimeError as exc:
            errors.append(exc)
        ran.set()

    try:
        j.append_add(1, 1, b"", sync=True, on_done=done)
        assert ran.wait(10)
    finally:
        j.stop()
    assert errors and "deadlock" in str(errors[0])


def test_appends_from_many_threads_all_land(tmp_path: Path, journal_type: str) -> None:
    j = open_journal(tmp_path, journal_type)
    done = threading.Semaphore(0)

    def producer(base: int) -> None:
        for i in range(500):
            j.append_add(base + i, 1, b"p" * 40, sync=True, on_done=done.release)

    threads = [threading.Thread(target=producer, args=(k * 10_000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(2000):
        assert done.acquire(timeout=10)
    j.stop()
    ids = sorted(r.id for r in load(tmp_path, journal_type).records)
    assert ids == sorted(k * 10_000 + i for k in range(4) for i in range(500))


def test_settings_object_is_used_as_given(tmp_path: Path) -> None:
    s = JournalSettings(directory=str(tmp_path), journal_type="ASYNCIO")
    j = FileJournal(s)
    assert j.settings.journal_type == "AIO"
    assert j.settings.journal_buffer_timeout == 500_000
