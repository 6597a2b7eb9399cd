"""Recovery: torn tails, damaged records, recycled files, reclaim, load logging."""

from __future__ import annotations

import os
import shutil
import zlib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from scow.core.interfaces import RecordInfo
from scow.plugins.file_journal import replay
from scow.plugins.file_journal.format import HEADER_SIZE, RECORD_HEADER

from .helpers import load, open_journal, records_on_disk, snapshot, valid_records


@pytest.fixture(params=["NIO", "AIO"])
def journal_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _crash_image(
    tmp_path: Path, journal_type: str, n_big: int = 40
) -> tuple[Path, list[RecordInfo]]:
    """A journal copied while running (after a flush): what a crash would leave."""
    live = tmp_path / "live"
    j = open_journal(live, journal_type)
    expected = []
    for i in range(1, n_big + 1):
        j.append_add(i, 1, bytes([i]) * 2000, sync=True)
        expected.append(RecordInfo(i, 1, bytes([i]) * 2000))
    j.append_add(999, 7, b"the last record, torn in every possible place", sync=True)
    j.flush()
    image = snapshot(live, tmp_path / "image")
    j.stop()
    return image, expected


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path: Path, journal_type: str) -> None:
    image, expected = _crash_image(tmp_path, journal_type)
    last = [v for v in valid_records(image) if v.kind != "PAD"][-1]
    assert (last.record_id, last.kind) == (999, "ADD")
    path = image / last.file
    end = last.offset + 32 + last.data_length
    for cut in range(last.offset, end + 1):
        trial = tmp_path / f"cut-{cut}"
        shutil.copytree(image, trial)
        with open(trial / last.file, "r+b") as f:
            f.truncate(cut)
        result = load(trial, journal_type)
        tail = [RecordInfo(999, 7, b"the last record, torn in every possible place")]
        assert result.records == (expected + tail if cut == end else expected), f"cut at {cut}"
        shutil.rmtree(trial)
    assert path.exists()


def test_torn_tail_left_as_zeros_and_appends_continue(tmp_path: Path, journal_type: str) -> None:
    image, expected = _crash_image(tmp_path, journal_type)
    last = [v for v in valid_records(image) if v.kind != "PAD"][-1]
    end = last.offset + 32 + last.data_length
    for cut in (last.offset, last.offset + 5, last.offset + 31, last.offset + 32, end - 1):
        trial = tmp_path / f"zero-{cut}"
        shutil.copytree(image, trial)
        with open(trial / last.file, "r+b") as f:
            f.seek(cut)
            f.write(bytes(end - cut))
        assert load(trial, journal_type).records == expected
        # the recovered journal keeps going and the next load sees both
        j = open_journal(trial, journal_type)
        j.append_add(5000, 1, b"after", sync=True)
        j.stop()
        assert load(trial, journal_type).records == [*expected, RecordInfo(5000, 1, b"after")]
        shutil.rmtree(trial)


def test_recovered_file_is_sealed_so_the_next_load_is_clean(tmp_path: Path) -> None:
    image, expected = _crash_image(tmp_path, "NIO")
    with capture_logs() as first:
        assert len(load(image).records) == len(expected) + 1
    assert any("not stopped cleanly" in e["event"] for e in first)
    with capture_logs() as second:
        assert len(load(image).records) == len(expected) + 1
    assert not any("not stopped cleanly" in e["event"] for e in second)
    assert not any(e["log_level"] == "warning" for e in second)


@pytest.mark.parametrize("position", ["body", "id-field", "epoch-field", "crc-field"])
def test_flipped_byte_in_a_middle_record_costs_that_record_only(
    tmp_path: Path, journal_type: str, position: str
) -> None:
    j = open_journal(tmp_path, journal_type)
    for i in range(1, 151):
        j.append_add(i, 1, bytes([i % 256]) * 1000, sync=False)
    j.stop()
    views = valid_records(tmp_path)
    epochs = sorted({v.file_epoch for v in views})
    assert len(epochs) >= 3
    middle = [v for v in views if v.file_epoch == epochs[1] and v.kind == "ADD"]
    victim = middle[len(middle) // 2]
    at = {"body": 32 + 500, "id-field": 16, "epoch-field": 8, "crc-field": 1}[position]
    with open(tmp_path / victim.file, "r+b") as f:
        f.seek(victim.offset + at)
        byte = f.read(1)[0]
        f.seek(victim.offset + at)
        f.write(bytes([byte ^ 0x40]))

    # reading goes on at the next valid record of the file (before: the rest of the file
    # was ignored, here about 30 records)
    expected = [i for i in range(1, 151) if i != victim.record_id]
    with capture_logs() as logs:
        result = load(tmp_path, journal_type)
    assert [r.id for r in result.records] == expected
    warnings = [e for e in logs if e["log_level"] == "warning" and "damaged" in e["event"]]
    assert len(warnings) == 1
    assert warnings[0]["file"].endswith(victim.file)
    assert warnings[0]["offset"] == victim.offset
    assert warnings[0]["skipped"] == HEADER_SIZE + victim.data_length
    # the damage is kept for inspection and reported again; the result is stable
    assert [r.id for r in load(tmp_path, journal_type).records] == expected


def test_damaged_transaction_record_drops_that_transaction_only(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    for i in range(1, 31):
        j.append_add(i, 1, b"a" * 1000, sync=False)
    for k in range(10):
        j.append_add_tx(1, 101 + k, 2, b"t" * 1000)
    for i in range(31, 61):
        j.append_add(i, 1, b"b" * 1000, sync=False)
    j.commit(1, sync=True)
    for k in range(10):
        j.append_add_tx(2, 201 + k, 2, b"u" * 1000)
    j.commit(2, sync=True)
    j.stop()
    views = valid_records(tmp_path)
    victim = next(v for v in views if v.record_id == 105 and v.kind == "ADD_TX")
    commit1 = next(v for v in views if v.kind == "COMMIT" and v.tx_id == 1)
    assert commit1.file != victim.file, "the commit must be in a later file for this test"
    with open(tmp_path / victim.file, "r+b") as f:
        f.seek(victim.offset + 40)
        f.write(b"X")
    with capture_logs() as logs:
        ids = [r.id for r in load(tmp_path).records]
    assert not set(range(101, 111)) & set(ids)  # tx 1: dropped whole, even its intact records
    assert set(range(201, 211)) <= set(ids)  # tx 2: intact
    assert set(ids) == set(range(1, 61)) | set(range(201, 211))  # the records after it too
    assert any(
        "some records of its transaction are missing" in e["event"] and e["tx_id"] == 1
        for e in logs
    )


def test_stale_records_in_a_recycled_file_are_not_resurrected(
    tmp_path: Path, journal_type: str
) -> None:
    j = open_journal(tmp_path, journal_type)
    used: set[str] = set()  # every file that held data (reclaim may run at any roll)
    for i in range(1, 301):
        j.append_add(i, 1, b"old" * 300, sync=False)
        used.update(j.data_files())
    for i in range(1, 301):
        j.append_delete(i, sync=False)
    current = j.data_files()[-1]
    n = 1000
    while j.data_files()[-1] == current:  # roll, so the deletes are in a sealed file
        j.append_add(n, 2, b"roll", sync=False)
        n += 1
    used.update(j.data_files()[:-1])
    j.reclaim()  # the maintenance thread may have done it already; either way it is done
    assert j.counters.files_recycled >= 3
    recycled = used & set(j.free_files())
    # New records as long as the old ones: the first record after the last new one starts
    # where an old one did, so it is a complete, CRC-valid record of the previous epoch.
    new = []
    assert recycled
    while not recycled & set(j.data_files()):  # until writing goes on in a recycled file
        assert len(new) < 10_000
        j.append_add(n, 3, b"new" * 300, sync=False)
        new.append(n)
        n += 1
    for _ in range(20):
        j.append_add(n, 3, b"new" * 300, sync=False)
        new.append(n)
        n += 1
    j.flush()
    image = snapshot(tmp_path, tmp_path.parent / (tmp_path.name + "-image"))
    j.stop()

    views = records_on_disk(image)
    reused = {v.file: v.file_epoch for v in views if v.valid and v.record_type == 3}
    reused = {
        name: epoch
        for name, epoch in reused.items()
        if os.path.join(str(tmp_path), name) in recycled
    }
    assert reused
    stale = [_stale_records(image / name, epoch) for name, epoch in reused.items()]
    assert any(stale), "no recycled file holds records of its previous life"
    result = load(image, journal_type)
    assert [r.id for r in result.records] == list(range(1000, new[0])) + new


def _stale_records(path: Path, epoch: int) -> list[int]:
    """Offsets of complete, CRC-valid records of another epoch (a brute-force scan)."""
    buf = path.read_bytes()
    found = []
    for off in range(4096, len(buf) - 32):
        crc, kind, _t, _f, ep, length, _id, _tx = RECORD_HEADER.unpack_from(buf, off)
        if (
            1 <= kind <= 3
            and ep not in (0, epoch)
            and 32 <= length <= len(buf) - off
            and zlib.crc32(buf[off + 4 : off + length]) == crc
        ):
            found.append(off)
    return found


def test_reclaim_frees_every_file_whose_records_are_dead(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    ids = iter(range(10_000, 100_000))

    def roll() -> None:
        """Write and delete filler until the journal moves to a new file."""
        current = j.data_files()[-1]
        while j.data_files()[-1] == current:
            rid = next(ids)
            j.append_add(rid, 9, b"r" * 4000, sync=False)
            j.append_delete(rid, sync=False)

    try:
        for i in range(1, 301):
            j.append_add(i, 1, b"x" * 1000, sync=False)
        for i in range(2, 301):
            j.append_delete(i, sync=False)
        first = j.data_files()[0]
        j.append_update(1, 2, b"still here", sync=False)
        update_file = j.data_files()[-1]
        roll()
        j.reclaim()
        # record 1 pins the file of its add and the file of its update; the rest is gone
        assert j.data_files()[:2] == [first, update_file]
        assert len(j.data_files()) <= 4
        j.append_delete(1, sync=False)
        roll()
        j.reclaim()
        # only the file holding the last delete (its delete refers to nothing left now
        # but it is the newest sealed one) and the current file may remain
        assert first not in j.data_files() and update_file not in j.data_files()
        assert len(j.data_files()) <= 2
    finally:
        j.stop()


def test_pool_keeps_at_most_journal_pool_files(tmp_path: Path) -> None:
    j = open_journal(tmp_path, journal_pool_files=3)
    try:
        for i in range(1, 401):
            j.append_add(i, 1, b"x" * 1000, sync=False)
        for i in range(1, 401):
            j.append_delete(i, sync=False)
        before = len(j.data_files())
        current = j.data_files()[-1]
        rid = 5000
        while j.data_files()[-1] == current:
            j.append_add(rid, 1, b"x", sync=False)
            j.append_delete(rid, sync=False)
            rid += 1
        j.reclaim()
        assert j.counters.files_recycled + j.counters.files_deleted >= before
        assert j.counters.files_deleted >= 1
    finally:
        j.stop()
    on_disk = {str(p) for p in tmp_path.iterdir() if p.suffix == ".scow"}
    spare_or_free = on_disk - set(j.data_files())
    # without the limit every reclaimed file (5 or more) would have been kept
    assert len(spare_or_free) <= 3


def test_load_logs_progress_on_large_journals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = open_journal(tmp_path)
    for i in range(1, 1001):
        j.append_add(i, 1, b"x" * 200, sync=False)
    j.stop()
    monkeypatch.setattr(replay, "PROGRESS_RECORDS", 100)
    with capture_logs() as logs:
        assert len(load(tmp_path).records) == 1000
    progress = [e for e in logs if e["event"] == "journal load progress"]
    assert len(progress) >= 3
    counts = [e["records"] for e in progress]
    assert counts == sorted(counts) and counts[-1] >= 1000  # records read, markers included
    assert all(e["files_done"] <= e["files"] for e in progress)


def test_changing_the_file_size_between_restarts_keeps_the_data(tmp_path: Path) -> None:
    j = open_journal(tmp_path, journal_file_size=64 * 1024)
    for i in range(1, 200):
        j.append_add(i, 1, b"x" * 1000, sync=False)
    j.stop()
    j = open_journal(tmp_path, journal_file_size=128 * 1024)
    for i in range(200, 300):
        j.append_add(i, 1, b"y" * 1000, sync=False)
    j.stop()
    assert [r.id for r in load(tmp_path, journal_file_size=128 * 1024).records] == list(
        range(1, 300)
    )


def test_a_free_file_with_a_damaged_header_goes_to_the_attic(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append_add(1, 1, b"x", sync=True)
    j.stop()
    free = sorted(p for p in tmp_path.iterdir() if p.suffix == ".scow")[-1]
    with open(free, "r+b") as f:
        f.write(b"garbage!")
    with capture_logs() as logs:
        assert load(tmp_path).records == [RecordInfo(1, 1, b"x")]
    assert (tmp_path / "attic" / free.name).exists()
    assert any("moved to the attic" in e["event"] for e in logs)


def test_a_data_file_with_a_damaged_header_keeps_its_records(tmp_path: Path) -> None:
    """A flipped bit in a file's header cost the whole file (up to journal-file-size of
    records) where one in a record costs that record: the file went to the attic. Each
    record names its file's epoch, so the first one gives the header back."""
    j = open_journal(tmp_path)
    for i in range(1, 101):
        j.append_add(i, 1, b"kept" * 50, sync=False)
    j.append_delete(7, sync=True)
    j.stop()
    (data,) = {v.file for v in records_on_disk(tmp_path) if v.valid}
    with open(tmp_path / data, "r+b") as f:
        f.seek(9)
        byte = f.read(1)
        f.seek(9)
        f.write(bytes([byte[0] ^ 0x10]))  # in the header's version field
    with capture_logs() as logs:
        assert [r.id for r in load(tmp_path).records] == [i for i in range(1, 101) if i != 7]
    (repaired,) = [e for e in logs if e["event"].startswith("journal file header damaged")]
    assert repaired["log_level"] == "warning" and repaired["file"].endswith(data)
    assert not (tmp_path / "attic").exists()
    with capture_logs() as logs:  # written back: the next start finds it whole
        assert len(load(tmp_path).records) == 99
    assert not [e for e in logs if "damaged" in e["event"]]


def test_a_recycled_file_with_a_damaged_header_gives_back_none_of_its_old_records(
    tmp_path: Path,
) -> None:
    """A file freed for reuse keeps its old records after the header that marks it free:
    read as a data file, they would come back. Freeing it voids its first record, so a
    damaged header over it is a free file's."""
    j = open_journal(tmp_path)
    used: set[str] = set()
    for i in range(1, 301):
        j.append_add(i, 1, b"old" * 300, sync=False)
        used.update(j.data_files())
    for i in range(1, 301):
        j.append_delete(i, sync=False)
    n, current = 1000, j.data_files()[-1]
    while j.data_files()[-1] == current:  # roll, so the deletes are in a sealed file
        j.append_add(n, 2, b"roll", sync=False)
        n += 1
    j.reclaim()
    recycled = sorted(used & set(j.free_files()))
    assert recycled
    j.stop()
    for path in recycled:
        assert _stale_records(Path(path), -1), "the test needs old records left in it"
        with open(path, "r+b") as f:
            f.write(b"garbage!")
    assert [r.id for r in load(tmp_path).records] == list(range(1000, n))


def test_leftover_temporary_files_are_removed(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append_add(1, 1, b"x", sync=True)
    j.stop()
    (tmp_path / "scow-data-77.scow.tmp").write_bytes(b"half made")
    (tmp_path / "scow-data-78.scow.cmp").write_bytes(b"half compacted")
    (tmp_path / "unrelated.tmp").write_bytes(b"not ours")
    assert load(tmp_path).records == [RecordInfo(1, 1, b"x")]
    names = set(os.listdir(tmp_path))
    assert "scow-data-77.scow.tmp" not in names and "scow-data-78.scow.cmp" not in names
    assert "unrelated.tmp" in names
