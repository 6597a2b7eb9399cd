"""The page writer holds producers back while more than its backlog waits to be written;
it seals a closing page's index."""

from __future__ import annotations

import asyncio
from pathlib import Path

from scow.core.page_frames import HEADER_SIZE, iter_frames
from scow.core.testing import wait_for_async
from scow.plugins.paging import index as page_index
from scow.plugins.paging.index import PageIndex
from scow.plugins.paging.record import encode
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


def test_a_closing_page_s_index_is_sealed_after_its_records(tmp_path: Path) -> None:
    """The writer notes an indexed page's records as it appends them, and when the page
    closes appends the index after them, sealed with the CRC of what they wrote; the
    backlog counts the records only."""

    async def run() -> list[int]:
        loop = asyncio.get_running_loop()
        writer = PageWriter(
            loop,
            lambda completions: loop.call_soon_threadsafe(lambda: [c() for c in completions]),
            0,
        )
        store = FilePageStore(tmp_path, "orders")
        sealed: list[int] = []
        closed = asyncio.Event()
        try:
            for page in (1, 2):
                index = PageIndex()
                writer.index_page(store, page, index)
                for i in range(20):
                    writer.submit(
                        store, page, encode(i, 0, 0, False, 4, [7], bytes(500)), False, None
                    )

                def done(index: PageIndex = index) -> None:
                    sealed.append(index.size)
                    if len(sealed) == 2:
                        closed.set()

                writer.close_page(store, page, done)
            await asyncio.wait_for(closed.wait(), 10)
            # taken back on the loop as the writer reports it
            await wait_for_async(lambda: not writer.backlog, what="the writer's backlog to empty")
            return sealed
        finally:
            writer.stop()
            store.close()

    sizes = asyncio.run(run())
    assert all(sizes)
    store = FilePageStore(tmp_path, "orders", repair=False)
    for page, size in zip((1, 2), sizes, strict=True):
        buf = store.read(page)
        *_records, (at, _payload, end) = list(iter_frames(buf))
        assert end - at - HEADER_SIZE == size
        columns = page_index.read(buf, at)
        assert columns is not None and columns.ids == list(range(20))
