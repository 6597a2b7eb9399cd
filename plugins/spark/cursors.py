"""Named cursors of one stream: a position per reader (a Spark query), kept by the broker.

A cursor only moves forward (moving it to where it is, or behind, changes nothing), so a
replayed commit is harmless. Cursors are kept by the stream's store (`StreamStore.
save_cursors`, written whole on each change): changes come once per micro-batch, not per
message. A cursor neither moved nor read for `ttl` ms is dropped, so an abandoned job
does not hold retention back forever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any


def now_ms() -> int:
    return int(time.time() * 1000)


class Cursors:
    """name -> (sequence number of the next message to read, last used ms)."""

    def __init__(
        self,
        stored: Mapping[str, tuple[int, int]],
        save: Callable[[dict[str, tuple[int, int]]], None],
        ttl_ms: int,
    ) -> None:
        self.ttl_ms = ttl_ms
        self._store = save
        self._cursors: dict[str, list[int]] = {n: [s, u] for n, (s, u) in stored.items()}

    def __len__(self) -> int:
        return len(self._cursors)

    def get(self, name: str) -> int | None:
        """The cursor's sequence number (and it counts as used), or None."""
        cursor = self._cursors.get(name)
        if cursor is None:
            return None
        cursor[1] = now_ms()
        return cursor[0]

    def move(self, name: str, sequence: int) -> int:
        """Move forward to `sequence` (creating the cursor); returns where it is now."""
        cursor = self._cursors.get(name)
        if cursor is None:
            self._cursors[name] = [sequence, now_ms()]
            self._save()
            return sequence
        cursor[1] = now_ms()
        if sequence > cursor[0]:
            cursor[0] = sequence
            self._save()
        return cursor[0]

    def delete(self, name: str) -> bool:
        if self._cursors.pop(name, None) is None:
            return False
        self._save()
        return True

    def lowest(self) -> int | None:
        """The position every cursor has passed, or None without cursors."""
        return min((c[0] for c in self._cursors.values()), default=None)

    def expire(self, now: int) -> list[str]:
        """Drop the cursors unused for `ttl`; their names."""
        if self.ttl_ms <= 0:
            return []
        gone = [n for n, c in self._cursors.items() if now - c[1] >= self.ttl_ms]
        for name in gone:
            del self._cursors[name]
        if gone:
            self._save()
        return gone

    def describe(self) -> dict[str, Any]:
        return {n: {"sequence": c[0], "used": c[1]} for n, c in sorted(self._cursors.items())}

    def _save(self) -> None:
        self._store({n: (c[0], c[1]) for n, c in self._cursors.items()})
