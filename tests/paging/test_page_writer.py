"""The page writer holds producers back while more than its backlog waits to be written."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
