"""Per-queue message rates, from counters sampled once a second (nothing per message)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: Samples kept per queue, and how far back a rate looks.
KEEP = 61
WINDOW = 10.0
#: The queue counters that get a rate: attribute, and the rate's name.
COUNTERS = (
    ("messages_added", "messages-added-rate"),
    ("messages_acknowledged", "messages-acknowledged-rate"),
    ("messages_expired", "messages-expired-rate"),
    ("messages_killed", "messages-killed-rate"),
)


class Rates:
    def __init__(self, broker: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.broker = broker
        self.clock = clock
        self._samples: dict[str, deque[tuple[float, tuple[int, ...]]]] = {}
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
                    samples.append((self._last, (0,) * len(COUNTERS)))
            samples.append((now, tuple(getattr(queue, c) for c, _ in COUNTERS)))
        self._last = now

    def of(self, name: str) -> dict[str, float]:
        """Each counter's change per second over the last WINDOW seconds."""
        samples = self._samples.get(name)
        if not samples or len(samples) < 2:
            return {rate: 0.0 for _, rate in COUNTERS}
        newest = samples[-1]
        oldest = next((s for s in samples if newest[0] - s[0] <= WINDOW), samples[0])
        elapsed = newest[0] - oldest[0] or 1.0
        return {
            rate: round((new - old) / elapsed, 1)
            for (_, rate), new, old in zip(COUNTERS, newest[1], oldest[1], strict=True)
        }
