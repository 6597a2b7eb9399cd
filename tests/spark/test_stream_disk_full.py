"""A stream's segment log on a file system that fills: writes wait, nothing is lost.

Each test mounts a small tmpfs (root only; skipped elsewhere) and fills it with a filler
file, so the segment writer meets ENOSPC for real. Records the file system refuses are
held and written again once space returns; only then are their tokens handed back (the
stream acknowledges the message on that), and the segment never has a hole.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from scow.core.disk_monitor import DiskMonitor
from scow.core.model import MemoryLimits
from scow.core.testing import wait_for, wait_for_async
from scow.plugins.spark.segments import FileStreamStore
from scow.plugins.spark.writer import StreamWriter, Written
from tests.tmpfs import fill


class Writes:
    """What the log handed back, in order (its writer thread calls `on_written`)."""

    def __init__(self) -> None:
        self.tokens: list[object] = []
        self.sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def on_written(self, written: Written) -> None:
        with self._lock:
            self.tokens.extend(written.tokens)
            self.sizes.update(written.appended.sizes)

    def count(self) -> int:
        with self._lock:
            return len(self.tokens)


class Log:
    """A stream's file store and its writer thread, as a stream queue runs them."""

    def __init__(self, directory: Path, writes: Writes, segment_bytes: int) -> None:
        self.store = FileStreamStore(directory, "s", segment_bytes)
        self.store.open()
        self.writer = StreamWriter(self.store, directory, writes.on_written, lambda d, s, t: d)
        self.append = self.writer.append

    @property
    def held(self) -> int:
        return self.writer.held

    def close(self) -> None:
        self.writer.close()
        self.store.close()


def open_log(directory: Path, writes: Writes, segment_bytes: int = 1 << 20) -> Log:
    return Log(directory, writes, segment_bytes)


def body(seq: int, size: int) -> bytes:
    return f"{seq:08d}".encode() * (size // 8)


def stored(directory: Path) -> list[tuple[int, bytes]]:
    """(sequence, bytes) of every record the segments hold, as a restart reads them."""
    store = FileStreamStore(directory, "s", 1 << 20)
    next_seq = store.open().next_seq
    records, _following = store.read(0, next_seq, 1 << 20)
    store.close()
    return [(seq, data) for seq, _time, data in records]


def test_a_full_disk_holds_stream_writes_and_hands_them_back_once_written(
    small_fs: Path,
) -> None:
    directory = small_fs / "stream"
    writes = Writes()
    log = open_log(directory, writes)
    try:
        for seq in range(10):
            log.append(seq, seq, body(seq, 1000), seq)
        wait_for(lambda: writes.count() == 10, what="the first 10 records")
        (segment,) = directory.glob("*.seg")
        size = segment.stat().st_size
        filler = fill(small_fs)
        for seq in range(10, 60):
            log.append(seq, seq, body(seq, 4000), seq)
        wait_for(lambda: log.held == 50, what="the 50 refused records held")
        # nothing refused is handed back, and the segment is cut back: no hole
        assert writes.tokens == list(range(10))
        assert segment.stat().st_size == size
        assert [seq for seq, _data in stored(directory)] == list(range(10))
        os.unlink(filler)
        wait_for(lambda: writes.count() == 60, what="the held records once space returns")
        assert log.held == 0
        assert writes.tokens == list(range(60))  # in order
        log.append(60, 60, body(60, 1000), 60)
        wait_for(lambda: writes.count() == 61, what="a write after the hold")
    finally:
        log.close()
    expected = [(seq, body(seq, 1000 if seq < 10 or seq == 60 else 4000)) for seq in range(61)]
    assert stored(directory) == expected


def test_records_held_at_shutdown_are_not_handed_back_and_the_segment_stays_whole(
    small_fs: Path,
) -> None:
    directory = small_fs / "stream"
    writes = Writes()
    log = open_log(directory, writes)
    try:
        for seq in range(5):
            log.append(seq, seq, body(seq, 1000), seq)
        wait_for(lambda: writes.count() == 5, what="the first 5 records")
        filler = fill(small_fs)
        for seq in range(5, 20):
            log.append(seq, seq, body(seq, 4000), seq)
        wait_for(lambda: log.held == 15, what="the refused records held")
    finally:
        log.close()  # never acknowledged: the producer sends them again
    assert writes.tokens == list(range(5))
    assert [seq for seq, _data in stored(directory)] == list(range(5))
    os.unlink(filler)
    again = Writes()
    log = open_log(directory, again)
    try:
        for seq in range(5, 20):  # what recovery would append
            log.append(seq, seq, body(seq, 4000), seq)
        wait_for(lambda: again.count() == 15, what="the appends after a restart")
    finally:
        log.close()
    assert [seq for seq, _data in stored(directory)] == list(range(20))


def test_a_segment_roll_refused_for_space_leaves_no_new_file_and_is_tried_again(
    small_fs: Path,
) -> None:
    directory = small_fs / "stream"
    writes = Writes()
    log = open_log(directory, writes, segment_bytes=8000)
    try:
        for seq in range(8):  # two segments of 4 records
            log.append(seq, seq, body(seq, 2000), seq)
        wait_for(lambda: writes.count() == 8, what="two segments")
        before = sorted(p.name for p in directory.glob("*.seg"))
        filler = fill(small_fs)
        for seq in range(8, 24):  # would roll four more segments
            log.append(seq, seq, body(seq, 2000), seq)
        wait_for(lambda: log.held == 16, what="the refused records held")
        assert sorted(p.name for p in directory.glob("*.seg")) == before
        assert writes.tokens == list(range(8))
        os.unlink(filler)
        wait_for(lambda: writes.count() == 24, what="the held records once space returns")
    finally:
        log.close()
    assert [seq for seq, _data in stored(directory)] == list(range(24))
    assert len(list(directory.glob("*.seg"))) >= 6


def test_the_disk_monitor_blocks_producers_while_a_stream_write_is_held(
    small_fs: Path,
) -> None:
    async def scenario() -> None:
        limits = MemoryLimits()
        monitor = DiskMonitor(
            limits,
            [small_fs],
            {"max-disk-usage": -1, "min-disk-free": -1, "disk-scan-period": 60_000},
        )
        await monitor.start()
        loop = asyncio.get_running_loop()
        directory = small_fs / "stream"
        writes = Writes()
        log = open_log(directory, writes)
        try:
            log.append(0, 0, body(0, 1000), 0)
            await wait_for_async(lambda: writes.count() == 1)
            filler = fill(small_fs)
            log.append(1, 1, body(1, 8000), 1)
            await wait_for_async(lambda: limits.disk_full)
            assert limits.reasons == ["disk"]
            assert "stream 's'" in (monitor.problem() or "")
            os.unlink(filler)
            await wait_for_async(lambda: not limits.disk_full)  # resumed by itself
            assert writes.tokens == [0, 1]
        finally:
            await loop.run_in_executor(None, log.close)
            await monitor.stop()

    asyncio.run(scenario())
