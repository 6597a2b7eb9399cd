"""The conformance suite every `PageStore` backend passes (built-in and third-party).

Subclass `PageStoreConformance` in a test module and give it an `open_store` fixture: a
callable `(directory, address) -> PageStore` that opens (creating if needed) the store
of `address` under `directory`; opening the same directory and address again must give
the stored pages back.

    class TestMyStore(PageStoreConformance):
        @pytest.fixture
        def open_store(self):
            return lambda directory, address: MyStore(directory, address)

Only what the `PageStore` protocol promises is checked here; what a backend does with a
corrupt medium belongs to its own tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scow.core.interfaces import PageStore
from scow.core.page_frames import frame_all, iter_frames, valid_length

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

    @pytest.fixture
    def opened(self, open_store: OpenStore) -> Iterator[OpenStore]:
        """`open_store`, closing what it opened when the test ends, even when it fails."""
        stores: list[PageStore] = []

        def open_and_track(directory: Path, address: str) -> PageStore:
            store = open_store(directory, address)
            stores.append(store)
            return store

        yield open_and_track
        for store in stores:
            store.close()

    def test_a_store_is_a_page_store_of_its_address(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "orders")
        assert isinstance(store, PageStore)
        assert store.address == "orders"
        assert store.page_numbers() == []

    def test_appended_records_read_back_in_order_across_pages(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "orders")
        store.append(1, [b"a", b"b"])
        store.append(1, [b"c"])
        store.append(2, [b"d", b"\x00" * 64])  # zero payload bytes are data, not fill
        store.append(2, [frame_all([b"looks like a frame"])])
        assert store.page_numbers() == [1, 2]
        assert records_of(store, 1) == [b"a", b"b", b"c"]
        assert records_of(store, 2) == [b"d", b"\x00" * 64, frame_all([b"looks like a frame"])]

    def test_append_returns_the_page_size_in_framed_bytes(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        # pagers compute record offsets from these sizes, so they must be exact
        store = opened(tmp_path, "orders")
        first = store.append(1, [b"one", b"two"])
        assert first == len(frame_all([b"one", b"two"])) == len(store.read(1))
        second = store.append(1, [b"three"])
        assert second == len(frame_all([b"one", b"two", b"three"])) == len(store.read(1))
        assert store.append(2, [b"four"]) == len(frame_all([b"four"]))

    def test_reads_resume_at_any_frame_offset(self, opened: OpenStore, tmp_path: Path) -> None:
        store = opened(tmp_path, "orders")
        written = [f"record {i}".encode() * (i + 1) for i in range(20)]
        store.append(1, written[:7])
        store.append(1, written[7:])
        buf = store.read(1)
        offsets = [start for start, _payload, _end in iter_frames(buf)]
        assert len(offsets) == len(written)
        for index, offset in enumerate(offsets):
            assert records_of(store, 1, offset) == written[index:]
        assert store.read(1, len(buf)) == b""

    def test_page_numbers_ascend_through_appends_and_deletes(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "orders")
        for page in (0, 1, 2, 3, 5):  # a gap is allowed: pages need not be consecutive
            store.append(page, [f"p{page}".encode()])
        assert store.page_numbers() == [0, 1, 2, 3, 5]
        store.delete(0)
        store.delete(3)
        assert store.page_numbers() == [1, 2, 5]
        store.append(6, [b"p6"])
        store.delete(1)
        assert store.page_numbers() == [2, 5, 6]

    def test_synced_records_survive_close_and_reopen(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "orders")
        store.append(2, [b"gone"])
        store.append(3, [b"x" * 100, b"y"])
        store.delete(2)
        store.sync()
        store.close()
        again = opened(tmp_path, "orders")
        assert again.page_numbers() == [3]
        assert records_of(again, 3) == [b"x" * 100, b"y"]
        assert again.read(2) == b""
        again.append(3, [b"z"])  # the last page takes more appends after a reopen
        again.append(4, [b"w"])
        again.sync()
        again.close()
        third = opened(tmp_path, "orders")
        assert third.page_numbers() == [3, 4]
        assert records_of(third, 3) == [b"x" * 100, b"y", b"z"]
        assert records_of(third, 4) == [b"w"]

    def test_delete_removes_only_that_page(self, opened: OpenStore, tmp_path: Path) -> None:
        store = opened(tmp_path, "orders")
        for page in (1, 2, 3):
            store.append(page, [f"p{page}".encode(), b"more"])
        store.delete(2)
        store.delete(9)  # missing: nothing happens
        store.delete(2)
        assert store.page_numbers() == [1, 3]
        assert store.read(2) == b""
        assert records_of(store, 1) == [b"p1", b"more"]
        assert records_of(store, 3) == [b"p3", b"more"]

    def test_deleting_every_page_leaves_a_store_that_takes_new_pages(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "orders")
        store.append(1, [b"a"])
        store.delete(1)
        assert store.page_numbers() == []
        store.append(2, [b"b"])
        store.sync()
        store.close()
        again = opened(tmp_path, "orders")
        assert again.page_numbers() == [2]
        assert records_of(again, 2) == [b"b"]

    def test_a_missing_page_reads_empty(self, opened: OpenStore, tmp_path: Path) -> None:
        store = opened(tmp_path, "orders")
        assert store.read(7) == b""
        store.append(1, [b"a"])
        assert store.read(7) == b""
        assert store.read(0) == b""

    def test_appending_below_the_highest_page_is_refused(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "orders")
        store.append(5, [b"a"])
        with pytest.raises(ValueError, match=r"\b4\b.*\b5\b"):
            store.append(4, [b"b"])
        assert store.page_numbers() == [5]
        assert store.read(4) == b""
        assert records_of(store, 5) == [b"a"]

    def test_a_one_mib_record_round_trips(self, opened: OpenStore, tmp_path: Path) -> None:
        store = opened(tmp_path, "orders")
        big = bytes(range(256)) * 4096  # 1 MiB
        store.append(1, [b"before", big, b"after"])
        store.append(1, [big])
        assert records_of(store, 1) == [b"before", big, b"after", big]

    def test_an_empty_record_is_refused_and_nothing_of_its_batch_is_written(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        # the PageStore contract: an empty frame would read as unwritten space
        store = opened(tmp_path, "orders")
        store.append(1, [b"kept"])
        with pytest.raises(ValueError, match="empty"):
            store.append(1, [b"lost", b""])
        assert records_of(store, 1) == [b"kept"]
        store.append(1, [b"next"])
        assert records_of(store, 1) == [b"kept", b"next"]

    def test_addresses_in_one_directory_are_apart(self, opened: OpenStore, tmp_path: Path) -> None:
        # "a/b", "a:b" and "a_b" look alike to anything that makes names filesystem safe
        names = ["a/b", "a:b", "a_b", "a/b c::d é", "orders"]
        stores = {name: opened(tmp_path, name) for name in names}
        for page, (name, store) in enumerate(stores.items(), start=1):
            store.append(page, [f"for {name}".encode()])
        stores["a_b"].delete(3)
        for page, (name, store) in enumerate(stores.items(), start=1):
            store.sync()
            store.close()
            again = opened(tmp_path, name)
            assert again.address == name
            if name == "a_b":
                assert again.page_numbers() == []
                continue
            assert again.page_numbers() == [page]
            assert records_of(again, page) == [f"for {name}".encode()]

    def test_a_concurrent_reader_never_sees_a_partial_record(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "orders")
        # sizes vary so that appends end at every alignment
        written = [f"{i}:".encode() + b"r" * (i % 700) for i in range(3000)]
        failures: list[str] = []
        reads = 0
        writer_done = threading.Event()

        def read_along() -> None:
            # reads like a cursor: from the end of the last record it decoded
            nonlocal reads
            offset = seen = 0
            while seen < len(written):
                last = writer_done.is_set()  # set before this read: it sees every append
                buf = store.read(1, offset)
                reads += 1
                if valid_length(buf) != len(buf):
                    failures.append(f"read at {offset} returned a partial or corrupt tail")
                    return
                for _frame, start, end in iter_frames(buf):
                    if bytes(buf[start:end]) != written[seen]:
                        failures.append(f"record {seen} differs from the one written")
                        return
                    seen += 1
                offset += len(buf)
                if last:
                    break
            if seen != len(written):
                failures.append(f"the reader saw {seen} of {len(written)} records")

        reader = threading.Thread(target=read_along)
        reader.start()
        try:
            for i, record in enumerate(written):
                store.append(1, [record])
                if i % 50 == 0:
                    time.sleep(0)  # let the reader in even if appends never release the GIL
        finally:
            writer_done.set()
            reader.join()
        assert not failures
        assert reads > 1
        assert records_of(store, 1) == written
