"""The file page store: the PageStore conformance suite, plus what only files can do."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from scow.core.conformance.page_store import OpenStore, PageStoreConformance, records_of
from scow.core.page_frames import (
    HEADER_SIZE,
    frame,
    frame_all,
    iter_frames,
    next_valid_frame,
    salvaged_frames,
    valid_length,
)
from scow.plugins.paging import store as store_module
from scow.plugins.paging.store import FilePageStore, discover, folder_name, open_store


class TestFilePageStore(PageStoreConformance):
    @pytest.fixture
    def open_store(self) -> OpenStore:
        return lambda directory, address: open_store(directory, address, {})


def _bad_crc(record: bytes) -> bytes:
    framed = bytearray(frame(record))
    framed[-1] ^= 0xFF
    return bytes(framed)


# ---------------------------------------------------------------------- torn tails


@pytest.mark.parametrize(
    "tail",
    [
        b"\x00" * 64,
        frame(b"half a record")[:-3],
        frame(b"a header")[: HEADER_SIZE - 2],
        _bad_crc(b"bad crc"),
        frame(b"torn")[:-1] + frame(b"a")[:5],
        b"\xff\xff",
    ],
    ids=["zero-fill", "half-frame", "half-header", "bad-crc", "two-torn-frames", "garbage"],
)
def test_a_torn_tail_is_cut_at_open_and_appends_follow_the_valid_records(
    tmp_path: Path, tail: bytes
) -> None:
    store = FilePageStore(tmp_path, "t")
    store.append(1, [b"old page"])
    store.append(2, [b"one", b"two"])
    store.close()
    path = store.folder / "000000002.page"
    valid = path.stat().st_size
    with open(path, "ab") as f:
        f.write(tail)
    with capture_logs() as logs:
        again = FilePageStore(tmp_path, "t")
    assert path.stat().st_size == valid
    assert [(e["event"], e["file"], e["bytes_cut"]) for e in logs] == [
        ("torn page tail cut", str(path), len(tail))
    ]
    assert logs[0]["log_level"] == "warning"
    assert again.append(2, [b"three"]) == valid + len(frame(b"three"))
    assert records_of(again, 2) == [b"one", b"two", b"three"]
    again.close()
    with capture_logs() as logs:
        third = FilePageStore(tmp_path, "t")
    assert logs == []
    assert records_of(third, 2) == [b"one", b"two", b"three"]
    third.close()


def test_a_damaged_frame_with_valid_ones_after_it_is_kept_for_readers_to_pass_over(
    tmp_path: Path,
) -> None:
    """Bit rot in the middle of the last page is not a torn tail: cutting there would
    throw away every record after it."""
    store = FilePageStore(tmp_path, "t")
    store.append(1, [b"one", b"two", b"three"])
    store.close()
    path = store.folder / "000000001.page"
    data = bytearray(path.read_bytes())
    data[len(frame(b"one")) + HEADER_SIZE] ^= 0xFF  # the first byte of "two"
    path.write_bytes(data + frame(b"torn")[:-2])
    with capture_logs() as logs:
        again = FilePageStore(tmp_path, "t")
    assert [e["bytes_cut"] for e in logs] == [len(frame(b"torn")) - 2]
    assert path.read_bytes() == data
    again.append(1, [b"four"])
    frames, damaged = salvaged_frames(again.read_unchecked(1))
    assert damaged == [(len(frame(b"one")), len(frame(b"one")) + len(frame(b"two")))]
    assert len(frames) == 3
    again.close()


def test_a_last_page_of_garbage_only_is_cut_to_nothing(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "t")
    store.append(1, [b"kept"])
    store.close()
    (store.folder / "000000002.page").write_bytes(b"\x01" * 100)
    again = FilePageStore(tmp_path, "t")
    assert again.page_numbers() == [1, 2]
    assert (store.folder / "000000002.page").stat().st_size == 0
    again.append(2, [b"new"])
    assert records_of(again, 2) == [b"new"]
    again.close()


def test_earlier_pages_are_not_rewritten_and_read_up_to_their_first_bad_frame(
    tmp_path: Path,
) -> None:
    store = FilePageStore(tmp_path, "t")
    store.append(1, [b"a", b"b"])
    store.append(2, [b"c"])
    store.close()
    page1 = store.folder / "000000001.page"
    with open(page1, "ab") as f:
        f.write(_bad_crc(b"bad") + frame(b"unreachable"))
    size = page1.stat().st_size
    with capture_logs() as logs:
        again = FilePageStore(tmp_path, "t")
    assert logs == []
    assert page1.stat().st_size == size
    assert records_of(again, 1) == [b"a", b"b"]
    assert len(again.read(1)) == len(frame_all([b"a", b"b"]))
    again.close()


def test_a_read_never_returns_a_half_written_append(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "t")
    store.append(1, [b"whole"])
    with open(store.folder / "000000001.page", "ab") as f:  # another writer, mid-append
        f.write(frame(b"half written")[:-4])
    assert store.read(1) == frame(b"whole")
    assert store.read(1, len(frame(b"whole"))) == b""
    store.close()


def test_a_failed_write_leaves_no_torn_frame_before_later_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FilePageStore(tmp_path, "t")
    size = store.append(1, [b"before"])
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        monkeypatch.setattr(os, "write", full)
        return real_write(fd, data[: len(data) // 2])

    def full(fd: int, data: bytes) -> int:
        monkeypatch.setattr(os, "write", real_write)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match=re.escape(str(store.folder / "000000001.page"))):
        store.append(1, [b"x" * 1000])
    assert os.write is real_write
    assert (store.folder / "000000001.page").stat().st_size == size
    assert store.append(1, [b"after"]) == size + len(frame(b"after"))
    assert records_of(store, 1) == [b"before", b"after"]
    store.close()


def test_a_page_the_os_refuses_raises_oserror_naming_the_file(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "t")
    store.append(1, [b"a"])
    (store.folder / "000000002.page").mkdir()  # not a file: cannot be opened for appends
    with pytest.raises(OSError, match=re.escape(str(store.folder / "000000002.page"))):
        store.append(2, [b"b"])
    store.close()


# ---------------------------------------------------------------------- files and syncs


def test_pages_are_files_named_like_artemis_that_grow_by_appends(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "t")
    store.append(7, [b"abc"])
    store.append(12, [b"d"])
    store.append(12, [b"ef"])
    files = sorted(p.name for p in store.folder.iterdir())
    assert files == ["000000007.page", "000000012.page", "address.txt"]
    assert (store.folder / "000000012.page").read_bytes() == frame_all([b"d", b"ef"])
    assert _bytes_on_disk(store) == len(frame(b"abc")) + len(frame_all([b"d", b"ef"]))
    store.delete(7)
    assert _bytes_on_disk(store) == len(frame_all([b"d", b"ef"]))
    store.delete(12)
    assert _bytes_on_disk(store) == 0
    assert sorted(p.name for p in store.folder.iterdir()) == ["address.txt"]
    store.close()
    store.close()  # idempotent


def test_stray_files_in_a_store_folder_are_not_pages(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "t")
    store.append(3, [b"a"])
    store.close()
    for name in ("notes.txt", "000000004.page.tmp", "x.page", "٣.page"):
        (store.folder / name).write_bytes(b"junk")
    (store.folder / "000000009.page").mkdir()
    again = FilePageStore(tmp_path, "t")
    assert again.page_numbers() == [3]
    again.close()


def test_sync_flushes_only_what_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FilePageStore(tmp_path, "t")
    data_syncs: list[int] = []
    folder_syncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(store_module, "_fdatasync", data_syncs.append)
    monkeypatch.setattr(os, "fsync", lambda fd: folder_syncs.append(fd) or real_fsync(fd))

    def counts() -> tuple[int, int]:
        result = (len(data_syncs), len(folder_syncs))
        data_syncs.clear()
        folder_syncs.clear()
        return result

    assert counts() == (0, 0)  # opening a new store does not wait for the disk either
    store.append(1, [b"a"])
    assert counts() == (0, 0)  # appends never wait for the disk
    store.sync()
    # the data; address.txt, the folder (its entry and the new page's), the folder's
    # entry in the paging directory
    assert counts() == (1, 3)
    store.sync()
    assert counts() == (0, 0)
    store.append(1, [b"b"])
    store.sync()
    assert counts() == (1, 0)
    store.append(1, [b"c"])
    store.append(2, [b"d"])  # rolling to a new page syncs the one it leaves
    assert counts() == (1, 0)
    store.sync()
    assert counts() == (1, 1)
    store.delete(1)
    store.sync()
    assert counts() == (0, 1)
    store.append(2, [b"e"])
    store.delete(2)  # its unsynced writes go with it
    store.sync()
    assert counts() == (0, 1)
    store.close()
    assert counts() == (0, 0)


# ---------------------------------------------------------------------- folders


ODD_NAMES = ["orders", "a/b c::d", "a:b", "a_b", "päckchen.#", "注文/新", "..", "", "x" * 300]


def test_discover_lists_every_address_and_address_txt_round_trips(tmp_path: Path) -> None:
    for name in ODD_NAMES:
        FilePageStore(tmp_path, name).close()
    assert discover(tmp_path, {}) == sorted(ODD_NAMES)
    for name in ODD_NAMES:
        marker = tmp_path / folder_name(name) / "address.txt"
        assert marker.read_text(encoding="utf-8") == name
    assert discover(tmp_path / "missing", {}) == []


def test_folder_names_are_filesystem_safe_and_distinct(tmp_path: Path) -> None:
    folders = [folder_name(name) for name in ODD_NAMES]
    assert len(set(folders)) == len(ODD_NAMES)
    for folder in folders:
        assert re.fullmatch(r"[A-Za-z0-9._-]*-[0-9a-f]{8}", folder)
        assert folder not in (".", "..")
        assert len(folder.encode()) <= 120
    assert folder_name("a/b").startswith("a_b-")
    store = FilePageStore(tmp_path, "a/b")
    assert store.folder.parent == tmp_path
    store.close()


def test_a_store_creates_its_paging_directory_and_parents(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path / "data" / "paging", "orders")
    store.append(1, [b"a"])
    store.close()
    assert discover(tmp_path / "data" / "paging", {}) == ["orders"]


def test_discover_skips_folders_that_are_not_stores(tmp_path: Path) -> None:
    FilePageStore(tmp_path, "real").close()
    (tmp_path / "stray-file").write_text("not a folder")
    (tmp_path / "empty-folder").mkdir()
    orphan = tmp_path / "orphan-00000000"
    orphan.mkdir()
    (orphan / "000000001.page").write_bytes(frame(b"x"))
    moved = tmp_path / "renamed-12345678"
    moved.mkdir()
    (moved / "address.txt").write_text("real", encoding="utf-8")  # names another folder
    (moved / "000000001.page").write_bytes(frame(b"y"))
    with capture_logs() as logs:
        assert discover(tmp_path, {}) == ["real"]
    assert sorted(e["folder"] for e in logs) == [str(orphan), str(moved)]


def test_a_folder_holding_another_address_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / folder_name("mine")
    folder.mkdir()
    (folder / "address.txt").write_text("theirs", encoding="utf-8")
    with pytest.raises(FileExistsError, match="theirs"):
        FilePageStore(tmp_path, "mine")


# ---------------------------------------------------------------------- frames


def test_frames_stop_at_zero_fill_bad_crc_and_truncation() -> None:
    good = frame_all([b"a", b"bb"])
    assert [bytes(good[s:e]) for _f, s, e in iter_frames(good)] == [b"a", b"bb"]
    assert valid_length(good) == len(good)
    assert valid_length(good + b"\x00" * 16) == len(good)
    assert valid_length(good + b"\x00" * 16 + frame(b"after zero fill")) == len(good)
    assert valid_length(good + frame(b"ccc")[:-1]) == len(good)
    assert valid_length(good + frame(b"ccc")[: HEADER_SIZE - 1]) == len(good)
    assert valid_length(good + _bad_crc(b"ccc") + frame(b"d")) == len(good)
    assert len(list(iter_frames(good + _bad_crc(b"ccc") + frame(b"d")))) == 2
    assert list(iter_frames(b"")) == []
    assert valid_length(b"") == 0


def test_frame_positions_count_from_the_buffer_start_at_any_offset() -> None:
    buf = frame_all([b"a", b"bb", b"ccc"])
    second = HEADER_SIZE + 1
    positions = list(iter_frames(memoryview(buf), second))
    assert positions == [
        (second, second + HEADER_SIZE, second + HEADER_SIZE + 2),
        (second + HEADER_SIZE + 2, second + 2 * HEADER_SIZE + 2, len(buf)),
    ]
    assert valid_length(buf, second) == len(buf)
    assert valid_length(buf, len(buf)) == len(buf)
    with pytest.raises(ValueError, match="-1"):
        list(iter_frames(buf, -1))
    with pytest.raises(ValueError, match="-1"):
        valid_length(buf, -1)


def test_verified_frames_skip_the_crc_but_not_the_bounds() -> None:
    # the cursor passes verified=True for bytes PageStore.read already checked
    buf = _bad_crc(b"abc") + frame(b"d")[:-1]
    assert list(iter_frames(buf)) == []
    assert [bytes(buf[s:e]) for _f, s, e in iter_frames(buf, verified=True)] == [b"ab\x9c"]


def test_an_empty_record_cannot_be_framed() -> None:
    with pytest.raises(ValueError, match="record 0 is empty"):
        frame(b"")
    with pytest.raises(ValueError, match="record 2 is empty"):
        frame_all([b"a", b"b", b"", b"c"])


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=50))
def test_framed_records_iterate_back_unchanged(records: list[bytes]) -> None:
    buf = frame_all(records)
    assert buf == b"".join(frame(r) for r in records)
    assert [bytes(buf[s:e]) for _f, s, e in iter_frames(buf)] == records
    assert valid_length(buf) == len(buf)


@given(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=20), st.data())
def test_a_cut_anywhere_leaves_a_prefix_of_whole_records(
    records: list[bytes], data: st.DataObject
) -> None:
    buf = frame_all(records)
    cut = data.draw(st.integers(0, len(buf)))
    decoded = [bytes(buf[s:e]) for _f, s, e in iter_frames(buf[:cut])]
    assert decoded == records[: len(decoded)]
    assert valid_length(buf[:cut]) == len(frame_all(decoded)) <= cut


def _bytes_on_disk(store: FilePageStore) -> int:
    return sum(p.stat().st_size for p in store.folder.glob("*.page"))


def test_a_store_opened_without_repair_leaves_a_torn_tail_and_reads_past_it(tmp_path):
    store = FilePageStore(tmp_path, "t")
    store.append(1, [b"one"])
    store.close()
    path = store.folder / "000000001.page"
    with open(path, "ab") as f:
        f.write(b"\xff\xff torn")
    size = path.stat().st_size
    reader = FilePageStore(tmp_path, "t", repair=False)
    assert records_of(reader, 1) == [b"one"]
    assert path.stat().st_size == size


@given(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=20), st.data())
def test_a_flipped_byte_costs_the_record_it_is_in_and_no_other(
    records: list[bytes], data: st.DataObject
) -> None:
    buf = bytearray(frame_all(records))
    at = data.draw(st.integers(0, len(buf) - 1))
    buf[at] ^= data.draw(st.integers(1, 255))
    hit = next(k for k in range(len(records)) if len(frame_all(records[: k + 1])) > at)
    frames, damaged = salvaged_frames(buf)
    assert [bytes(buf[s:e]) for _f, s, e in frames] == records[:hit] + records[hit + 1 :]
    start = len(frame_all(records[:hit]))
    if hit < len(records) - 1:
        assert damaged == [(start, start + len(frame(records[hit])))]
    else:  # the last one: nothing valid follows, as after a torn tail
        assert damaged == []


def test_a_damaged_stretch_ends_at_the_next_frame_past_zero_fill() -> None:
    good = frame_all([b"a", b"bb"])
    assert next_valid_frame(good + b"\x00" * 4096, len(good)) is None
    assert next_valid_frame(good + b"\x00" * 4096 + frame(b"c"), len(good)) == len(good) + 4096
    assert next_valid_frame(good + frame(b"ccc")[:-1], len(good)) is None
