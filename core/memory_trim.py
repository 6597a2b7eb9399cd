"""Give freed memory back to the system now and then: collect cycles, then `malloc_trim`.

The broker collects reference cycles rarely (`app.GC_THRESHOLD`, and what exists at start
is frozen), so objects in a cycle that lived a while (a connection's helpers, a closed
link's) wait for a full collection that may not come for hours, and keep the arenas they
sit in. And after a burst (a backlog drained, many clients gone) the C heap keeps the pages
it freed: glibc returns memory to the system only from the top of the heap, so a broker's
RSS stays at its high-water mark although its live data went back to the baseline.

Every `PERIOD` seconds a full collection runs on the event loop (11-28 ms with 500,000
messages queued, which queues hold untracked) and `malloc_trim(0)` off it. What each gives
on a soak of client kills is in `benchmarks/RESULTS.md` ("The soak, third time"). Where the
C library has no `malloc_trim` the trim is left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
from collections.abc import Callable

#: Seconds between trims.
PERIOD = 30.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class MemoryTrimmer:
    """A broker service: a full collection, then `malloc_trim(0)`, every PERIOD seconds."""

    def __init__(self, period: float = PERIOD) -> None:
        self.period = period
        self._trim = _malloc_trim()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(self._trim))

    async def _run(self, trim: Callable[[int], int] | None) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.period)
            gc.collect()  # on the loop: finalizers of asyncio objects run where they belong
            if trim is not None:
                await loop.run_in_executor(None, trim, 0)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
