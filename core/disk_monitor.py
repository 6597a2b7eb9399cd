"""The disk monitor: blocks every producer while a storage file system is nearly full.

Every `disk-scan-period` ms it checks the file systems holding the broker's storage (data
dir, journal, paging). Past `max-disk-usage` percent used, or below `min-disk-free` bytes
free (which wins when both are set), it sets `MemoryLimits.disk_full`: protocols then
withhold credit from every producer, so nothing in flight is lost or refused. It logs a
warning once, and when space returns it clears the flag and resumes the producers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from scow.core.model import MemoryLimits

_REASON = "disk"

log = structlog.get_logger("scow.disk")


class DiskMonitor:
    """A service checking the storage file systems against the broker's disk limits."""

    def __init__(
        self, limits: MemoryLimits, paths: Iterable[Path], settings: Mapping[str, Any]
    ) -> None:
        self.limits = limits
        self.paths = list(paths)
        #: Thresholds; tests and management may change them at run time.
        self.max_disk_usage = int(settings["max-disk-usage"])
        self.min_disk_free = int(settings["min-disk-free"])
        self.period = int(settings["disk-scan-period"]) / 1000
        self._task: asyncio.Task[None] | None = None

    def problem(self) -> str | None:
        """Why the disk is full (the path and the figure), or None while it has room."""
        for path in self.paths:
            existing = path
            while not existing.exists() and existing != existing.parent:
                existing = existing.parent
            st = os.statvfs(existing)
            total = st.f_blocks * st.f_frsize
            free = st.f_bavail * st.f_frsize
            if self.min_disk_free >= 0:
                if free < self.min_disk_free:
                    return f"{path}: {free} bytes free, min-disk-free is {self.min_disk_free}"
            elif self.max_disk_usage >= 0 and total:
                used = 100 * (total - free) / total
                if used > self.max_disk_usage:
                    return f"{path}: {used:.1f}% used, max-disk-usage is {self.max_disk_usage}%"
        return None

    def check(self) -> None:
        """Scan once and block or unblock producers accordingly."""
        problem = self.problem()
        limits = self.limits
        blocked = limits.blocked_by(_REASON)
        if problem is not None and not blocked:
            limits.block(_REASON)
            log.warning("disk full: producers blocked until space returns", reason=problem)
        elif problem is None and blocked:
            log.info("disk has room again: producers resume")
            limits.unblock(_REASON)

    async def start(self) -> None:
        if self.max_disk_usage >= 0 or self.min_disk_free >= 0:
            self.check()
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.check()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
