"""The conformance suite every `PageStore` backend passes (built-in and third-party).

Subclass `PageStoreConformance` in a test module and give it an `open_store` fixture: a
callable `(directory, address) -> PageStore` that opens (creating if needed) the store
of `address` under `directory`; opening the same directory and address again must give
the stored pages back.

    class TestMyStore(PageStoreConformance):
        @pytest.fixture
        def open_store(self):
            return lambda directory, address: MyStore(directory, address)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from scow.core.interfaces import PageStore
from scow.core.page_frames import iter_frames

OpenStore = Callable[[Path, str], PageStore]


def records_of(store: PageStore, page: int, offset: int = 0) -> list[bytes]:
    """The records of `page` from byte `offset`, decoded from the store's frames."""
    buf = store.read(page, offset)
    return [bytes(buf[start:end]) for _frame, start, end in iter_frames(buf)]


class PageStoreConformance:
    """What every page store must do; each test names the behaviour it checks."""

    @pytest.fixture
    def open_store(self) -> OpenStore:
        raise NotImplementedError("a PageStoreConformance subclass provides open_store")

    def test_appended_records_read_back_in_order_across_pages(self, open_store, tmp_path):
        store = open_store(tmp_path, "orders")
        store.append(1, [b"a", b"b"])
        store.append(1, [b"c"])
        store.append(2, [b"d"])
        assert store.page_numbers() == [1, 2]
        assert records_of(store, 1) == [b"a", b"b", b"c"]
        assert records_of(store, 2) == [b"d"]
        store.close()

    def test_append_returns_the_page_size_and_reads_resume_at_an_offset(self, open_store, tmp_path):
        store = open_store(tmp_path, "orders")
        first = store.append(1, [b"one", b"two"])
        size = store.append(1, [b"three"])
        assert size > first > 0
        assert records_of(store, 1, first) == [b"three"]
        buf = store.read(1)
        offsets = [frame for frame, _start, _end in iter_frames(buf)]
        assert records_of(store, 1, offsets[1]) == [b"two", b"three"]
        store.close()

    def test_synced_records_survive_close_and_reopen(self, open_store, tmp_path):
        store = open_store(tmp_path, "orders")
        store.append(3, [b"x" * 100, b"y"])
        store.sync()
        store.close()
        again = open_store(tmp_path, "orders")
        assert again.page_numbers() == [3]
        assert records_of(again, 3) == [b"x" * 100, b"y"]
        again.append(4, [b"z"])
        assert again.page_numbers() == [3, 4]
        again.close()

    def test_delete_removes_only_that_page(self, open_store, tmp_path):
        store = open_store(tmp_path, "orders")
        for page in (1, 2, 3):
            store.append(page, [f"p{page}".encode()])
        store.delete(2)
        store.delete(9)  # missing: nothing happens
        assert store.page_numbers() == [1, 3]
        assert records_of(store, 2) == []
        assert records_of(store, 3) == [b"p3"]
        store.close()

    def test_a_missing_page_reads_empty(self, open_store, tmp_path):
        store = open_store(tmp_path, "orders")
        assert store.read(7) == b""
        store.close()

    def test_appending_below_the_highest_page_is_refused(self, open_store, tmp_path):
        store = open_store(tmp_path, "orders")
        store.append(5, [b"a"])
        with pytest.raises(ValueError, match="5"):
            store.append(4, [b"b"])
        store.close()

    def test_large_records_round_trip_and_empty_ones_are_refused(self, open_store, tmp_path):
        store = open_store(tmp_path, "orders")
        big = bytes(range(256)) * 4096  # 1 MiB
        store.append(1, [b"before", big, b"after"])
        assert records_of(store, 1) == [b"before", big, b"after"]
        with pytest.raises(ValueError, match="empty"):
            store.append(1, [b""])  # an empty frame would read as the end of the page
        assert records_of(store, 1) == [b"before", big, b"after"]
        store.close()

    def test_addresses_in_one_directory_are_apart(self, open_store, tmp_path):
        a = open_store(tmp_path, "a.b")
        b = open_store(tmp_path, "a/b c::d é")
        a.append(1, [b"for a"])
        b.append(1, [b"for b"])
        assert records_of(a, 1) == [b"for a"]
        assert records_of(b, 1) == [b"for b"]
        a.close()
        b.close()

    def test_a_concurrent_reader_never_sees_a_partial_record(self, open_store, tmp_path):
        store = open_store(tmp_path, "orders")
        written = [f"{i}:".encode() + b"r" * (i % 500) for i in range(3000)]
        failures: list[str] = []
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                got = records_of(store, 1)
                if got != written[: len(got)]:
                    failures.append(f"read {len(got)} records that differ from those written")
                    return

        reader = threading.Thread(target=read)
        reader.start()
        try:
            for i in range(0, len(written), 10):
                store.append(1, written[i : i + 10])
        finally:
            done.set()
            reader.join()
        assert not failures
        assert records_of(store, 1) == written
        store.close()
