"""The page writer holds producers back while more than its backlog waits to be written;
it seals a closing page's index."""

from __future__ import annotations

import asyncio
from pathlib import Path

from scow.core.page_frames import HEADER_SIZE, iter_frames
from scow.plugins.paging import index as page_index
from scow.plugins.paging.index import PageIndex
from scow.plugins.paging.record import HEAD, encode
from scow.plugins.paging.store import FilePageStore
from scow.plugins.paging.writer import PageWriter


def test_a_backlog_past_its_limit_holds_producers_until_half_is_written(tmp_path: Path) -> None:
    async def run() -> list[tuple[bool, int]]:
        loop = asyncio.get_running_loop()
        holds: list[tuple[bool, int]] = []
        released = asyncio.Event()

        def hold_producers(hold: bool) -> None:
            holds.append((hold, writer.backlog))
            if not hold:
                released.set()

        writer = PageWriter(
            loop,
            lambda completions: loop.call_soon_threadsafe(lambda: [c() for c in completions]),
            0,
            hold_producers,
            max_backlog=10_000,
        )
        store = FilePageStore(tmp_path, "orders")
        try:
            for _ in range(30):  # 30 KB in one loop turn: the writer has none of it yet
                writer.submit(store, 1, bytes(1000), False, None)
            assert holds == [(True, 11_000)]  # held as soon as the backlog passed 10,000
            await asyncio.wait_for(released.wait(), 10)
            return holds
        finally:
            writer.stop()
            store.close()

    assert asyncio.run(run()) == [(True, 11_000), (False, 0)]


def test_a_closing_page_s_index_is_sealed_and_leaves_no_backlog(tmp_path: Path) -> None:
    """The index the pager submits when a page closes counts in the backlog as its
    records do, and is written after them, sealed with the CRC of what they wrote."""

    async def run() -> int:
        loop = asyncio.get_running_loop()
        writer = PageWriter(loop, lambda completions: None, 0)
        store = FilePageStore(tmp_path, "orders")
        try:
            for page in (1, 2):
                index = PageIndex()
                offset = 0
                for i in range(20):
                    data = encode(i, 0, 0, False, 4, [7], bytes(500))
                    index.add(offset, data, 1)
                    writer.submit(store, page, data, False, None)
                    offset += HEADER_SIZE + len(data)
                assert index.close(offset)
                writer.submit(store, page, index, False, None)
            while writer.backlog:  # taken back on the loop as the writer reports it
                await asyncio.sleep(0.01)
            return writer.backlog
        finally:
            writer.stop()
            store.close()

    assert asyncio.run(asyncio.wait_for(run(), 10)) == 0
    store = FilePageStore(tmp_path, "orders", repair=False)
    for page in (1, 2):
        buf = store.read(page)
        (at, *_rest) = [start for start, p, _e in iter_frames(buf) if HEAD.unpack_from(buf, p)[3]]
        columns = page_index.read(buf, at)
        assert columns is not None and columns.ids == list(range(20))
