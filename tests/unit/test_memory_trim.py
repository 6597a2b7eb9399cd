"""The broker's periodic memory trim collects reference cycles the rare full collections
(app.GC_THRESHOLD) would leave for hours."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

from scow.core.memory_trim import MemoryTrimmer


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_a_cycle_is_collected_within_a_period_while_automatic_collection_is_off():
    async def scenario() -> bool:
        trimmer = MemoryTrimmer(period=0.05)
        await trimmer.start()
        try:
            node = _Node()
            ref = weakref.ref(node)
            del node
            deadline = time.monotonic() + 10
            while ref() is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return ref() is None
        finally:
            await trimmer.stop()

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        assert asyncio.run(scenario()), "the cycle outlived ten seconds of trims"
    finally:
        if was_enabled:
            gc.enable()
