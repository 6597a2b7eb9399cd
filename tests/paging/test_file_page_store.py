"""The file page store: the PageStore conformance suite, plus what only files can do."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scow.core.page_frames import frame, frame_all, iter_frames, valid_length
from scow.core.page_store_suite import PageStoreConformance, records_of
from scow.plugins.paging.store import FilePageStore, discover, folder_name


class TestFilePageStore(PageStoreConformance):
    @pytest.fixture
    def open_store(self):
        return lambda directory, address: FilePageStore(directory, address)


@pytest.mark.parametrize(
    "tail",
    [b"\x00" * 64, frame(b"half a record")[:-3], frame(b"bad crc")[:-1] + b"!", b"\xff\xff"],
    ids=["zero-fill", "half-frame", "bad-crc", "garbage"],
)
def test_a_torn_tail_is_cut_at_open_and_appends_follow_the_valid_records(tmp_path, tail):
    store = FilePageStore(tmp_path, "t")
    store.append(1, [b"one", b"two"])
    store.sync()
    store.close()
    path = store.folder / "000000001.page"
    valid = path.stat().st_size
    with open(path, "ab") as f:
        f.write(tail)
    again = FilePageStore(tmp_path, "t")
    assert path.stat().st_size == valid
    again.append(1, [b"three"])
    assert records_of(again, 1) == [b"one", b"two", b"three"]
    again.close()


def test_discover_lists_every_address_with_odd_characters_intact(tmp_path: Path) -> None:
    names = ["orders", "a/b c::d", "päckchen.#", "x" * 300]
    for name in names:
        FilePageStore(tmp_path, name).close()
    assert sorted(discover(tmp_path, {})) == sorted(names)
    for name in names:
        folder = folder_name(name)
        assert "/" not in folder and len(folder) < 120
    assert discover(tmp_path / "missing", {}) == []


def test_frames_stop_at_zero_fill_bad_crc_and_truncation() -> None:
    good = frame_all([b"a", b"bb"])
    assert [bytes(good[s:e]) for _f, s, e in iter_frames(good)] == [b"a", b"bb"]
    assert valid_length(good + b"\x00" * 16) == len(good)
    assert valid_length(good + frame(b"ccc")[:-1]) == len(good)
    corrupt = bytearray(good + frame(b"ccc"))
    corrupt[-1] ^= 1
    assert valid_length(bytes(corrupt)) == len(good)


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=50))
def test_framed_records_iterate_back_unchanged(records: list[bytes]) -> None:
    buf = frame_all(records)
    assert [bytes(buf[s:e]) for _f, s, e in iter_frames(buf)] == records
    assert valid_length(buf) == len(buf)
