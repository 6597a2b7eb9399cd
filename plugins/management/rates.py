"""Per-queue message rates, from counters sampled once a second (nothing per message)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

#: Samples kept per queue, and how far back a rate looks.
KEEP = 61
WINDOW = 10.0


class Rates:
    def __init__(self, broker: Any, clock: Any = time.monotonic) -> None:
        self.broker = broker
        self.clock = clock
        self._samples: dict[str, deque[tuple[float, int, int]]] = {}
        self._last: float | None = None  # when the previous sample was taken

    def sample(self) -> None:
        now = self.clock()
        queues = self.broker.queues
        for name in [n for n in self._samples if n not in queues]:
            del self._samples[name]  # deleted queues
        for name, queue in queues.items():
            samples = self._samples.get(name)
            if samples is None:
                samples = self._samples[name] = deque(maxlen=KEEP)
                if self._last is not None:  # created since: it had nothing then
                    samples.append((self._last, 0, 0))
            samples.append((now, queue.messages_added, queue.messages_acknowledged))
        self._last = now

    def of(self, name: str) -> dict[str, float]:
        """Messages added and acknowledged per second over the last WINDOW seconds."""
        samples = self._samples.get(name)
        if not samples or len(samples) < 2:
            return {"messages-added-rate": 0.0, "messages-acknowledged-rate": 0.0}
        newest = samples[-1]
        oldest = next((s for s in samples if newest[0] - s[0] <= WINDOW), samples[0])
        elapsed = newest[0] - oldest[0] or 1.0
        return {
            "messages-added-rate": round((newest[1] - oldest[1]) / elapsed, 1),
            "messages-acknowledged-rate": round((newest[2] - oldest[2]) / elapsed, 1),
        }
