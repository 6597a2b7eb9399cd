"""The disk monitor: blocks every producer while a storage file system is nearly full.

Every `disk-scan-period` ms it checks the file systems holding the broker's storage (data
dir, journal, paging). Past `max-disk-usage` percent used, or below `min-disk-free` bytes
free (which wins when both are set), it sets `MemoryLimits.disk_full`: protocols then
withhold credit from every producer, so nothing in flight is lost or refused. It logs a
warning once, and when space returns it clears the flag and resumes the producers.

A disk can fill between two scans, so storage also tells the monitor watching its
directory what it does, from whatever thread it runs on:

* `allocating(path, size)` before it makes a file (a journal file, a page file): the
  monitor checks at once instead of at its next scan, and from then on counts `size` as
  headroom, so producers are blocked while the next such file would pass the limits;
* `out_of_space(path, owner, problem)` when it could not make a file for lack of space
  (and again with None once it could): producers stay blocked until then, limits or not.

Both are one call per file, never per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from scow.core.model import MemoryLimits

_REASON = "disk"

log = structlog.get_logger("scow.disk")

#: A sync that takes this long (s) is logged: the disk, not the broker, is what holds
#: durable producers back then.
SLOW_SYNC = 1.0
#: At most one such line per storage in this many seconds (the others are counted).
SLOW_SYNC_EVERY = 10.0
#: storage -> (when it was last logged, slow syncs since)
_slow_syncs: dict[str, tuple[float, int]] = {}


def synced(storage: str, started: float) -> None:
    """A sync of `storage` that began at `started` (`time.monotonic()`) is done: log it
    when it was slow (any thread)."""
    now = time.monotonic()
    took = now - started
    if took < SLOW_SYNC:
        return
    last, count = _slow_syncs.get(storage, (0.0, 0))
    if now - last < SLOW_SYNC_EVERY:
        _slow_syncs[storage] = (last, count + 1)
        return
    _slow_syncs[storage] = (now, 0)
    log.warning("slow disk: a sync took long", storage=storage, seconds=round(took, 2), more=count)


#: Errors that mean "the file system has no room" (quota included).
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


#: Errors that mean "this process may open no more files" (its limit, or the system's).
NO_FILES_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})


def is_no_space(exc: BaseException) -> bool:
    """Whether `exc` is a file system refusing a write for lack of space."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS


def is_no_room(exc: BaseException) -> bool:
    """Whether `exc` is a file that cannot be made or opened for now: no space for it, or
    no descriptor left (the open-file limit). Both pass once something is freed, so
    storage refuses new data and tries again, as for a full disk, rather than failing."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS | NO_FILES_ERRNOS


def no_room_reason(exc: OSError) -> str:
    """'file system full' or 'open-file limit reached', for an error `is_no_room` took."""
    return "open-file limit reached" if exc.errno in NO_FILES_ERRNOS else "file system full"


def mount_point(path: str | Path) -> str:
    """The mount point of the file system holding `path` (or its nearest existing parent)."""
    current = os.path.abspath(path)
    while not os.path.exists(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    device = os.stat(current).st_dev
    while True:
        parent = os.path.dirname(current)
        if parent == current or os.stat(parent).st_dev != device:
            return current
        current = parent


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer may still use on `path`'s file system."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def describe_no_room(path: str | Path, what: str) -> str:
    """`path`, its file system and its free bytes, saying `what` did not fit (for errors)."""
    try:
        where = f"{path} (file system at {mount_point(path)}, {free_bytes(path)} bytes free)"
    except OSError:
        where = str(path)
    return f"{where}: no room for {what}"


# ---------------------------------------------------------------- who watches what

_watchers: weakref.WeakKeyDictionary[DiskMonitor, tuple[str, ...]] = weakref.WeakKeyDictionary()
_watchers_lock = threading.Lock()


def _watching(path: str | Path) -> list[DiskMonitor]:
    target = os.path.abspath(path)
    with _watchers_lock:
        pairs = list(_watchers.items())
    return [
        monitor
        for monitor, roots in pairs
        if any(target == root or target.startswith(root.rstrip(os.sep) + os.sep) for root in roots)
    ]


def allocating(path: str | Path, size: int) -> None:
    """Storage is about to make a file of `size` bytes in `path` (any thread).

    The monitor watching `path` checks its limits now, counting `size` as headroom; with
    no monitor (a journal used on its own) this does nothing.
    """
    for monitor in _watching(path):
        monitor.allocating(size)


def out_of_space(path: str | Path, owner: str, problem: str | None) -> None:
    """`owner` (e.g. "journal /data/journal") cannot make a file in `path` for lack of
    space, as `problem` says; None: it can again. Any thread.

    While any owner is out of space, the monitor watching `path` keeps producers blocked.
    """
    for monitor in _watching(path):
        monitor.out_of_space(owner, problem)


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
        #: Room the next storage allocation needs (the largest file storage announced).
        self.headroom = 0
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        #: owner -> why it cannot make a file (storage threads write, the loop reads)
        self._no_room: dict[str, str] = {}

    def problem(self) -> str | None:
        """Why the disk is full (the path and the figure), or None while it has room."""
        with self._lock:
            for owner, why in self._no_room.items():
                return f"{owner}: {why}"
        return self.limit_problem()

    def limit_problem(self) -> str | None:
        """Which path is past max-disk-usage / min-disk-free, counting the headroom."""
        if self.min_disk_free < 0 and self.max_disk_usage < 0:
            return None
        need = self.headroom
        for path in self.paths:
            existing = path
            while not existing.exists() and existing != existing.parent:
                existing = existing.parent
            st = os.statvfs(existing)
            total = st.f_blocks * st.f_frsize
            free = st.f_bavail * st.f_frsize
            room = f" with room for a {need}-byte file" if need else ""
            if self.min_disk_free >= 0:
                if free - need < self.min_disk_free:
                    return f"{path}: {free} bytes free, min-disk-free is {self.min_disk_free}{room}"
            elif self.max_disk_usage >= 0 and total:
                used = 100 * (total - free + need) / total
                if used > self.max_disk_usage:
                    return (
                        f"{path}: {used:.1f}% used{room}, max-disk-usage is {self.max_disk_usage}%"
                    )
        return None

    def check(self) -> None:
        """Scan once and block or unblock producers accordingly (on the loop)."""
        problem = self.problem()
        limits = self.limits
        blocked = limits.blocked_by(_REASON)
        if problem is not None and not blocked:
            limits.block(_REASON)
            log.warning("disk full: producers blocked until space returns", reason=problem)
        elif problem is None and blocked:
            log.info("disk has room again: producers resume")
            limits.unblock(_REASON)

    # ------------------------------------------------------------------ from storage

    def allocating(self, size: int) -> None:
        """A file of `size` bytes is about to be made (any thread): check now."""
        if size > self.headroom:
            self.headroom = size
        if self.max_disk_usage >= 0 or self.min_disk_free >= 0:
            self._check_soon()

    def out_of_space(self, owner: str, problem: str | None) -> None:
        """`owner` cannot make files (`problem`), or can again (None); any thread."""
        with self._lock:
            if problem is None:
                changed = self._no_room.pop(owner, None) is not None
            else:
                changed = owner not in self._no_room
                self._no_room[owner] = problem
        if changed:
            self._check_soon()

    def _check_soon(self) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to block
                loop.call_soon_threadsafe(self.check)

    # ------------------------------------------------------------------ service

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        with _watchers_lock:
            _watchers[self] = tuple(os.path.abspath(p) for p in self.paths)
        if self.max_disk_usage >= 0 or self.min_disk_free >= 0:
            self.check()
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.check()

    async def stop(self) -> None:
        with _watchers_lock:
            _watchers.pop(self, None)
        self._loop = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
