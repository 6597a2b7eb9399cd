"""JournalSettings and the CLI helpers (print, offline compaction, sync-rate probe)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scow.core.interfaces import RecordInfo
from scow.plugins.file_journal import (
    JournalSettings,
    compact_offline,
    iter_records,
    measure_sync_rate,
)

from .helpers import SMALL_FILE, load, open_journal

# ---------------------------------------------------------------------------- settings


def test_defaults_are_the_artemis_ones() -> None:
    s = JournalSettings()
    assert (s.journal_file_size, s.journal_min_files, s.journal_pool_files) == (10485760, 2, -1)
    assert (s.journal_compact_min_files, s.journal_compact_percentage) == (10, 30)
    assert s.journal_sync_transactional and s.journal_sync_non_transactional
    assert s.journal_datasync
    assert s.journal_buffer_size == 501760
    assert (s.journal_type, s.journal_buffer_timeout, s.journal_max_io) == ("NIO", 3333333, 1)
    assert (s.prefix, s.extension) == ("scow-data", "scow")


def test_aio_has_its_own_defaults_unless_set() -> None:
    s = JournalSettings(journal_type="AIO")
    assert (s.journal_buffer_timeout, s.journal_max_io) == (500000, 500)
    s = JournalSettings(journal_type="aio", journal_buffer_timeout=1000)
    assert (s.journal_type, s.journal_buffer_timeout, s.journal_max_io) == ("AIO", 1000, 500)


def test_from_mapping_reads_kebab_case_keys() -> None:
    s = JournalSettings.from_mapping(
        {
            "directory": "/var/lib/scow/journal",
            "journal-type": "ASYNCIO",
            "journal-file-size": 1048576,
            "journal-min-files": 4,
            "journal-pool-files": 10,
            "journal-buffer-timeout": 0,
            "journal-sync-non-transactional": False,
        }
    )
    assert s.directory == "/var/lib/scow/journal"
    assert s.journal_type == "AIO" and s.journal_file_size == 1048576
    assert (s.journal_min_files, s.journal_pool_files) == (4, 10)
    assert s.journal_buffer_timeout == 0 and s.journal_sync_non_transactional is False


def test_unknown_key_is_named_with_a_suggestion() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown key 'journal-file-sizes'; did you mean "
        r"'journal-file-size'\?",
    ):
        JournalSettings.from_mapping({"journal-file-sizes": 1})
    with pytest.raises(ValueError, match="unknown key 'colour'; known keys"):
        JournalSettings.from_mapping({"colour": "blue"})


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("journal-file-size", 10000, "multiple of 4096"),
        ("journal-file-size", 4096, "at least 8192"),
        ("journal-type", "MAPPED", "use one of"),
        ("journal-pool-files", 0, "-1 \\(unlimited\\)"),
        ("journal-compact-percentage", 130, "from 0 to 100"),
        ("journal-min-files", 0, ">= 1"),
        ("journal-datasync", "yes", "true or false"),
        ("journal-max-io", 0, ">= 1"),
    ],
)
def test_bad_values_name_the_setting_and_what_is_accepted(
    key: str, value: object, accepted: str
) -> None:
    with pytest.raises(ValueError, match=f"{key}.*{accepted}"):
        JournalSettings.from_mapping({key: value})


def test_every_setting_key_is_listed() -> None:
    keys = JournalSettings.keys()
    assert "journal-buffer-timeout" in keys and "directory" in keys
    assert all(k == k.lower() and "_" not in k for k in keys)


# ---------------------------------------------------------------------------- tools


def test_iter_records_describes_every_record(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append_add(1, 45, b"payload", sync=True)
    j.append_update(1, 32, b"q", sync=True, replaceable=True)
    j.append_add_tx(9, 2, 45, b"in tx")
    j.commit(9, sync=True)
    j.append_delete(1, sync=True)
    j.stop()
    views = [v for v in iter_records(str(tmp_path)) if v.valid]
    assert [(v.kind, v.record_id, v.record_type, v.tx_id, v.data_length) for v in views] == [
        ("ADD", 1, 45, 0, 7),
        ("UPDATE", 1, 32, 0, 1),
        ("ADD_TX", 2, 45, 9, 5),
        ("COMMIT", 0, 0, 9, 12),
        ("DELETE", 1, 0, 0, 0),
        ("EOF", 0, 0, 0, 0),
    ]
    assert all(v.file == "scow-data-1.scow" and v.epoch == v.file_epoch for v in views)
    assert views[0].offset == 4096


def test_iter_records_marks_damaged_records_invalid(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    for i in range(1, 4):
        j.append_add(i, 1, b"abc" * 10, sync=True)
    j.stop()
    second = next(v for v in iter_records(str(tmp_path)) if v.record_id == 2)
    with open(tmp_path / second.file, "r+b") as f:
        f.seek(second.offset + 40)
        f.write(b"!")
    views = list(iter_records(str(tmp_path)))
    assert [(v.record_id, v.valid, v.reason) for v in views if v.kind == "ADD"] == [
        (1, True, ""),
        (2, False, "crc mismatch"),
        (3, True, ""),  # read on past the damage, as recovery reads
    ]


def test_compact_offline_shrinks_a_stopped_journal(tmp_path: Path) -> None:
    j = open_journal(tmp_path, journal_compact_min_files=0)
    for i in range(1, 301):
        j.append_add(i, 1, b"x" * 1000, sync=False)
    for i in range(1, 301):
        if i % 50:
            j.append_delete(i, sync=False)
    j.stop()
    s = JournalSettings(journal_file_size=SMALL_FILE)
    stats = compact_offline(str(tmp_path), s)
    assert stats["files_after"] < stats["files_before"]
    assert stats["records"] == 6
    assert load(tmp_path).records == [RecordInfo(i, 1, b"x" * 1000) for i in range(50, 301, 50)]


def test_measure_sync_rate_suggests_a_buffer_timeout(tmp_path: Path) -> None:
    rate, timeout_ns = measure_sync_rate(str(tmp_path), 0.2)
    assert rate > 0
    assert timeout_ns == int(1e9 / rate)
    assert list(tmp_path.iterdir()) == []  # cleans up after itself
