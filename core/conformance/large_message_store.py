"""The conformance suite every `LargeMessageStore` backend passes (built-in and third-party).

Subclass `LargeMessageStoreConformance` in a test module and give it an `open_store`
fixture: a callable `(data_dir) -> LargeMessageStore` that builds (without opening) the
store of the broker whose data dir is `data_dir`, with `large-message-sync` on; building
it again for the same data dir must find the bodies stored before.

    class TestMyStore(LargeMessageStoreConformance):
        @pytest.fixture
        def open_store(self):
            return lambda data_dir: MyStore(data_dir, sync=True)

Most tests run as an offline tool does (no event loop: every write in place); the last
runs as a broker does, on an event loop, where a store may write and read on threads of
its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scow.core.large_messages import LargeBody, LargeHead, LargeMessageStore

OpenStore = Callable[[Path], LargeMessageStore]

#: Over two of the database store's rows and the file store's read chunks, the last short.
SIZE = (5 << 19) + 4321


def message(size: int = SIZE, seed: int = 0) -> tuple[bytes, bytes]:
    """A message's head and the rest of its bytes, each byte telling where it is."""
    data = bytes((i * 31 + seed) & 0xFF for i in range(251)) * (size // 251 + 1)
    return data[:100], data[100:size]


class LargeMessageStoreConformance:
    """What every large message store must do; each test names the behaviour it checks."""

    @pytest.fixture
    def open_store(self) -> OpenStore:
        raise NotImplementedError("a LargeMessageStoreConformance subclass provides open_store")

    @pytest.fixture
    def opened(self, open_store: OpenStore) -> Iterator[OpenStore]:
        """`open_store` then `open`, closing what it built when the test ends."""
        stores: list[LargeMessageStore] = []

        def build(data_dir: Path) -> LargeMessageStore:
            store = open_store(data_dir)
            store.open()
            stores.append(store)
            return store

        yield build
        for store in stores:
            store.close()

    def test_a_body_reads_back_whole_and_from_any_offset(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path)
        head, rest = message()
        stored = store.write_whole(1, head, rest, sync=True)
        assert isinstance(stored, LargeHead) and bytes(stored) == head
        body = stored.body
        assert body.synced and body.length == len(head) + len(rest)
        assert b"".join(body.chunks()) == rest
        whole = head + rest
        for start in (0, 99, 100, (1 << 20) - 1, 1 << 20, len(whole) - 1, len(whole)):
            assert b"".join(body.chunks(start)) == whole[start:], start
        assert store.stats() == {"files": 1, "bytes": len(whole), "arriving": 0}

    def test_bodies_come_back_at_the_next_open_and_orphans_go(
        self, opened: OpenStore, open_store: OpenStore, tmp_path: Path
    ) -> None:
        first = opened(tmp_path)
        head, rest = message(seed=1)
        for file_id in (7, 8):
            first.write_whole(file_id, head, rest, sync=True)
        first.close()
        length = len(head) + len(rest)
        second = opened(tmp_path)
        body = second.recovered(7, len(head), length)
        assert body is not None
        assert b"".join(body.chunks()) == rest
        assert second.remove_orphans() == 1  # body 8: no record referred to it
        second.close()
        third = opened(tmp_path)
        assert third.recovered(8, len(head), length) is None
        assert third.recovered(7, len(head), length) is not None

    def test_a_missing_or_short_body_is_not_recovered(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        first = opened(tmp_path)
        head, rest = message(seed=2)
        first.write_whole(3, head, rest, sync=True)
        first.close()
        second = opened(tmp_path)
        assert second.recovered(3, len(head), len(head) + len(rest) + 1) is None
        assert second.recovered(4, len(head), 10) is None

    def test_the_last_reference_deletes_the_body(self, opened: OpenStore, tmp_path: Path) -> None:
        first = opened(tmp_path)
        head, rest = message(seed=3)
        body = first.write_whole(5, head, rest, sync=True).body
        body.acquire()
        body.acquire()
        body.release()
        assert first.stats()["files"] == 1
        body.release()
        assert first.stats() == {"files": 0, "bytes": 0, "arriving": 0}
        first.close()
        assert opened(tmp_path).recovered(5, len(head), len(head) + len(rest)) is None

    def test_an_abandoned_arrival_leaves_nothing(self, opened: OpenStore, tmp_path: Path) -> None:
        first = opened(tmp_path)
        head, rest = message(seed=4)
        arrival = first.begin(6)
        arrival.write(head)
        arrival.write(rest[: 1 << 20])
        assert first.stats()["arriving"] == 1
        arrival.abandon()
        assert first.stats()["arriving"] == 0
        first.close()
        second = opened(tmp_path)
        assert second.recovered(6, len(head), 1) is None
        assert second.remove_orphans() == 0

    def test_overwritten_bytes_read_back_wherever_they_lie(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path)
        head, rest = message(seed=6)
        whole = bytearray(head + rest)
        arrival = store.begin(10)
        for start in range(0, len(whole), 65536):
            arrival.write(bytes(whole[start : start + 65536]))
        # in the first bytes, across the 1 MiB mark, and in the last bytes written
        for offset in (len(head), (1 << 20) - 3, len(whole) - 5):
            arrival.overwrite(offset, b"ABCDEFGH"[: min(8, len(whole) - offset)])
            whole[offset : offset + 8] = b"ABCDEFGH"[: min(8, len(whole) - offset)]
        body = arrival.complete(len(head), sync=True)
        assert b"".join(body.chunks(0)) == bytes(whole)

    def test_on_an_event_loop_a_body_is_synced_then_streamed(
        self, opened: OpenStore, tmp_path: Path
    ) -> None:
        store = opened(tmp_path)
        head, rest = message(3 << 20, seed=5)

        async def arrive_and_stream() -> bytes:
            loop = asyncio.get_running_loop()
            arrival = store.begin(9)
            for start in range(0, len(head + rest), 65536):
                arrival.write((head + rest)[start : start + 65536])
                while not arrival.room(lambda: None):  # the store is behind: let it write
                    await asyncio.sleep(0.01)
            body = arrival.complete(len(head), sync=True)
            synced = loop.create_future()
            body.when_synced(lambda: synced.set_result(True))
            await asyncio.wait_for(synced, 30)
            return await _stream(body)

        assert asyncio.run(arrive_and_stream()) == rest


async def _stream(body: LargeBody) -> bytes:
    """A body read as a delivery reads it: waiting on `wake` whenever nothing is ready."""
    ready = asyncio.Event()
    chunks = body.chunks(wake=ready.set)
    out = bytearray()
    try:
        while (chunk := next(chunks, None)) is not None:
            if chunk:
                out += chunk
            else:
                ready.clear()
                await asyncio.wait_for(ready.wait(), 30)
    finally:
        chunks.close()
    return bytes(out)
