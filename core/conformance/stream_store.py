"""The conformance suite every `StreamStore` backend passes (built-in and third-party).

Subclass `StreamStoreConformance` in a test module and give it an `open_store` fixture: a
callable `(directory, name, segment_bytes) -> StreamStore` that builds (without opening)
the store of stream `name` under `directory`; building the same directory and name again
must give the stored records back.

    class TestMyStore(StreamStoreConformance):
        @pytest.fixture
        def open_store(self):
            return lambda directory, name, segment_bytes: MyStore(directory, name, segment_bytes)

Only what the `StreamStore` protocol promises is checked here; what a backend does with a
corrupt medium belongs to its own tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scow.core.interfaces import StreamRecord, StreamStore

OpenStore = Callable[[Path, str, int], StreamStore]

#: A segment size that puts each record of `records` in a segment of its own.
ONE_PER_SEGMENT = 100


def records(first: int, count: int, size: int = 200, time: int = 1_000) -> list[StreamRecord]:
    """`count` records from sequence `first`: enqueue time `time` + seq, message id
    1000 + seq, `size` bytes that name their sequence number."""
    return [
        (seq, time + seq, 1000 + seq, (f"{seq:08d}" * (size // 8 + 1)).encode()[:size])
        for seq in range(first, first + count)
    ]


def as_read(written: list[StreamRecord]) -> list[tuple[int, int, bytes]]:
    return [(seq, enqueued, data) for seq, enqueued, _id, data in written]


class StreamStoreConformance:
    """What every stream store must do; each test names the behaviour it checks."""

    @pytest.fixture
    def open_store(self) -> OpenStore:
        raise NotImplementedError("a StreamStoreConformance subclass provides open_store")

    @pytest.fixture
    def opened(self, open_store: OpenStore) -> Iterator[OpenStore]:
        """`open_store`, closing what it built when the test ends, even when it fails."""
        stores: list[StreamStore] = []

        def build_and_track(directory: Path, name: str, segment_bytes: int) -> StreamStore:
            store = open_store(directory, name, segment_bytes)
            stores.append(store)
            return store

        yield build_and_track
        for store in stores:
            store.close()

    def test_a_new_store_is_an_empty_stream_store_of_its_name(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", 1 << 20)
        assert isinstance(store, StreamStore)
        assert store.name == "events"
        contents = store.open()
        assert (contents.segments, contents.next_seq, contents.recent_ids) == ([], 0, set())
        assert store.read(0, 10, 10) == ([], 0)
        assert store.seek(0) is None
        assert store.load_cursors() == {}

    def test_appended_records_read_back_by_position_end_and_limit(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", 1 << 20)
        store.open()
        written = records(0, 10)
        store.append(written[:4])
        store.append(written[4:])
        assert store.read(0, 10, 100) == (as_read(written), 10)
        assert store.read(3, 7, 100) == (as_read(written[3:7]), 7)
        got, following = store.read(2, 10, 3)
        assert got == as_read(written[2:5])
        assert following == 5
        assert store.read(10, 20, 5) == ([], 10)  # nothing past the end yet

    def test_a_record_starts_a_new_segment_once_the_last_holds_segment_bytes(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", ONE_PER_SEGMENT)
        store.open()
        first = store.append(records(0, 1))
        assert [s.first for s in first.new_segments] == [0]
        assert [s.first_time for s in first.new_segments] == [1000]
        more = store.append(records(1, 3))
        assert [s.first for s in more.new_segments] == [1, 2, 3]
        assert set(more.sizes) >= {1, 2, 3}
        assert all(size >= 200 for size in more.sizes.values())
        assert store.read(0, 4, 10)[0] == as_read(records(0, 4))

    def test_a_read_that_stops_at_its_limit_inside_a_segment_goes_on_from_there(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", 1000)  # five records a segment
        store.open()
        store.append(records(0, 20))
        seq, got = 0, []
        while seq < 20:
            batch, following = store.read(seq, 20, 3)  # limits fall inside segments
            assert batch and batch[0][0] == seq, f"read from {seq} gave {batch[:1]}"
            got += batch
            seq = following
        assert got == as_read(records(0, 20))

    def test_reopening_gives_back_segments_next_sequence_and_recent_ids(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", ONE_PER_SEGMENT)
        store.open()
        store.append(records(0, 5))
        store.close()
        again = opened(tmp_path, "events", ONE_PER_SEGMENT)
        contents = again.open()
        assert [s.first for s in contents.segments] == [0, 1, 2, 3, 4]
        assert all(s.size >= 200 for s in contents.segments)
        assert [s.first_time for s in contents.segments] == [1000, 1001, 1002, 1003, 1004]
        assert contents.next_seq == 5
        assert contents.recent_ids >= {1003, 1004}  # at least the last two segments'
        assert again.read(0, 5, 10)[0] == as_read(records(0, 5))
        again.append(records(5, 1))  # appends go on after a reopen
        assert again.read(4, 6, 10)[0] == as_read(records(4, 2))

    def test_message_ids_use_all_64_bits(self, opened: OpenStore, tmp_path: Path) -> None:
        """A message id is an unsigned 64-bit number: a committed pack's rows are stored
        with ids from 2**63 up (`scow.plugins.spark.records.row_id`)."""
        ids = [0, (1 << 63) - 1, 1 << 63, (1 << 63) | 5 << 14 | 3, (1 << 64) - 1]
        store = opened(tmp_path, "events", 1 << 20)
        store.open()
        written = [(seq, 1000 + seq, ids[seq], b"r%d" % seq) for seq in range(len(ids))]
        store.append(written)
        store.close()
        contents = opened(tmp_path, "events", 1 << 20).open()
        assert contents.recent_ids == set(ids)
        assert contents.next_seq == len(ids)

    def test_streams_of_one_place_are_kept_apart(self, opened: OpenStore, tmp_path: Path) -> None:
        one, other = opened(tmp_path, "one", 1 << 20), opened(tmp_path, "other", 1 << 20)
        one.open()
        other.open()
        one.append(records(0, 3))
        other.append(records(0, 1, time=5_000))
        assert one.read(0, 10, 10)[0] == as_read(records(0, 3))
        assert other.read(0, 10, 10)[0] == as_read(records(0, 1, time=5_000))

    def test_deleted_segments_leave_a_gap_reads_skip(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", ONE_PER_SEGMENT)
        store.open()
        store.append(records(0, 5))
        store.delete_segments([0, 1])
        assert store.read(0, 5, 10) == (as_read(records(2, 3)), 5)
        store.close()
        contents = opened(tmp_path, "events", ONE_PER_SEGMENT).open()
        assert [s.first for s in contents.segments] == [2, 3, 4]
        assert contents.next_seq == 5

    def test_seek_finds_the_first_record_enqueued_at_or_after_a_time(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", 1000)
        store.open()
        store.append(records(0, 20))  # enqueued at 1000 + seq
        assert store.seek(0) == 0
        assert store.seek(1007) == 7
        assert store.seek(1019) == 19
        assert store.seek(2000) is None

    def test_a_record_larger_than_a_read_chunk_reads_back_whole(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", 1 << 20)
        store.open()
        written = records(0, 1, size=300_000) + records(1, 2)
        store.append(written)
        assert store.read(0, 3, 10) == (as_read(written), 3)

    def test_cursors_are_replaced_whole_and_survive_a_reopen(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", 1 << 20)
        store.open()
        store.save_cursors({"a": (5, 100), "b": (7, 200)})
        store.save_cursors({"b": (9, 300)})
        store.close()
        again = opened(tmp_path, "events", 1 << 20)
        again.open()
        assert again.load_cursors() == {"b": (9, 300)}

    def test_destroy_removes_records_and_cursors(self, opened: OpenStore, tmp_path: Path) -> None:
        store = opened(tmp_path, "events", 1 << 20)
        store.open()
        store.append(records(0, 3))
        store.save_cursors({"a": (1, 1)})
        store.destroy()
        again = opened(tmp_path, "events", 1 << 20)
        assert again.open().next_seq == 0
        assert again.read(0, 10, 10) == ([], 0)
        assert again.load_cursors() == {}

    def test_reads_alongside_appends_see_whole_records_in_order(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path, "events", 4000)
        store.open()
        total = 300
        appended = [0]  # records appended (and so readable) so far
        problems: list[str] = []

        def read_all() -> None:
            seen = 0
            while seen < total and not problems:
                got, _following = store.read(seen, appended[0], 50)
                for seq, _time, data in got:
                    if seq != seen or data != records(seq, 1)[0][3]:
                        problems.append(f"read {seq} ({len(data)} B) where {seen} was due")
                    seen += 1

        reader = threading.Thread(target=read_all)
        reader.start()
        for first in range(0, total, 10):
            store.append(records(first, 10))
            appended[0] = first + 10
        reader.join(timeout=30)
        assert not reader.is_alive(), "the reader did not get every record"
        assert not problems, problems[:3]
