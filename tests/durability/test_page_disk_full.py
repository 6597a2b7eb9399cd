"""The page writer on a file system that fills (a tmpfs, root only): it holds producers
back and writes what was refused once space returns, in order; nothing is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from scow.core.page_frames import iter_frames
from scow.core.testing import wait_for_async
from scow.plugins.paging.store import FilePageStore
from scow.plugins.paging.writer import PageWriter
from tests.tmpfs import fill

RECORD = 8 * 1024


def numbered(n: int) -> bytes:
    return n.to_bytes(4, "big") * (RECORD // 4)


def records(store: FilePageStore, page: int) -> list[bytes]:
    data = store.read(page)
    return [data[start:end] for _frame, start, end in iter_frames(data)]


def run_writer(small_fs: Path, scenario: Callable[..., object]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        holds: list[bool] = []
        done: list[int] = []
        writer = PageWriter(
            loop,
            lambda completions: loop.call_soon_threadsafe(lambda: [c() for c in completions]),
            0,
            holds.append,
        )
        store = FilePageStore(small_fs / "paging", "orders")
        try:
            await scenario(writer, store, holds, done)  # type: ignore[misc]
        finally:
            writer.stop()
            store.close()

    asyncio.run(main())


def test_appends_refused_by_a_full_disk_wait_and_land_in_order(small_fs: Path) -> None:
    async def scenario(writer: PageWriter, store: FilePageStore, holds: list, done: list):
        filler = fill(small_fs)
        for n in range(20):
            writer.submit(store, 1, numbered(n), True, lambda n=n: done.append(n))
        await wait_for_async(lambda: holds == [True], what="producers held back")
        assert done == []  # nothing confirmed that is not on disk
        filler.unlink()
        await wait_for_async(lambda: holds == [True, False], what="producers let go")
        await wait_for_async(lambda: len(done) == 20, what="the completions")
        assert done == list(range(20))
        assert records(store, 1) == [numbered(n) for n in range(20)]
        writer.submit(store, 1, b"after", True, None)  # the writer goes on
        await wait_for_async(lambda: records(store, 1)[-1:] == [b"after"], what="a later write")

    run_writer(small_fs, scenario)


def test_deleting_an_older_page_frees_the_room_a_held_append_needs(small_fs: Path) -> None:
    async def scenario(writer: PageWriter, store: FilePageStore, holds: list, done: list):
        for n in range(40):  # page 0: 320 kB
            writer.submit(store, 0, numbered(n), False, None)
        await wait_for_async(lambda: len(records(store, 0)) == 40, what="page 0")
        fill(small_fs)
        for n in range(10):
            writer.submit(store, 1, numbered(n), True, lambda n=n: done.append(n))
        await wait_for_async(lambda: holds == [True], what="producers held back")
        writer.delete(store, 0)  # a consumer finished page 0: not held behind page 1
        await wait_for_async(lambda: holds == [True, False], what="producers let go")
        await wait_for_async(lambda: len(done) == 10, what="the completions")
        assert store.page_numbers() == [1]
        assert records(store, 1) == [numbered(n) for n in range(10)]

    run_writer(small_fs, scenario)
