"""The page writer: one thread appends every address's page records and syncs them.

Producers' records reach it through `submit`; it takes everything queued in one go,
appends each store's records with one write per page, syncs the stores that hold a
durable record (once each: group commit, waiting `page-sync-timeout` first so that one
sync covers more producers), and hands the completions back to the event loop in one
call. Deletions go through the same thread, so they are ordered after the writes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import structlog

from scow.core.interfaces import Completion, PageStore

log = structlog.get_logger("scow.paging")


#: Page records waiting for the writer, in bytes, before producers are held back.
MAX_BACKLOG = 32 << 20


class PageWriter:
    """A thread writing page records in batches; `dispatch` runs completions on the loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        dispatch: Callable[[list[Completion]], None],
        sync_timeout_ns: int,
        hold_producers: Callable[[bool], None] = lambda hold: None,
        max_backlog: int = MAX_BACKLOG,
    ):
        self._loop = loop
        self._dispatch = dispatch
        self._sync_delay = sync_timeout_ns / 1e9
        #: Bytes of records submitted and not yet written (kept on the loop). Producers
        #: that page faster than the store writes would otherwise grow it without bound:
        #: past `max_backlog`, `hold_producers(True)`; once half is written, `(False)`.
        self.backlog = 0
        self._max_backlog = max_backlog
        self._hold_producers = hold_producers
        self._holding = False
        self._cond = threading.Condition()
        # (store, page, record, sync, on_done); record None: delete the page (close the
        # store when page is -1)
        self._queue: list[tuple[PageStore, int, bytes | None, bool, Completion | None]] = []
        #: Items the loop submitted since its last hand-over: one lock per loop turn, not
        #: one per message.
        self._submitted: list[tuple[PageStore, int, bytes | None, bool, Completion | None]] = []
        self._stopping = False
        self.syncs = 0
        self.writes = 0
        self._thread = threading.Thread(target=self._run, name="scow-page-writer", daemon=True)
        self._thread.start()

    def submit(
        self, store: PageStore, page: int, record: bytes, sync: bool, on_done: Completion | None
    ) -> None:
        """Queue a record (on the loop); the writer gets it at the end of this loop turn."""
        if not self._submitted:
            self._loop.call_soon(self._hand_over)
        self._submitted.append((store, page, record, sync, on_done))
        self.backlog += len(record)
        if self.backlog > self._max_backlog and not self._holding:
            self._holding = True
            self._hold_producers(True)

    def _written(self, size: int) -> None:
        self.backlog -= size
        if self._holding and self.backlog <= self._max_backlog // 2:
            self._holding = False
            self._hold_producers(False)

    def delete(self, store: PageStore, page: int, on_done: Completion | None = None) -> None:
        if not self._submitted:
            self._loop.call_soon(self._hand_over)
        self._submitted.append((store, page, None, False, on_done))

    def close(self, store: PageStore) -> None:
        """Close `store` once everything queued for it is done."""
        if not self._submitted:
            self._loop.call_soon(self._hand_over)
        self._submitted.append((store, -1, None, False, None))

    def _hand_over(self) -> None:
        items, self._submitted = self._submitted, []
        with self._cond:
            self._queue += items
            self._cond.notify()

    def stop(self) -> None:
        self._hand_over()
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue and self._stopping:
                    return
                if self._sync_delay and any(item[3] for item in self._queue):
                    # let more durable records join this sync (group commit)
                    self._cond.wait(self._sync_delay)
                batch, self._queue = self._queue, []
            try:
                self._write(batch)
            except OSError:
                log.exception("page write failed")
                raise

    def _write(self, batch: list[Any]) -> None:
        completions: list[Completion] = []
        written = 0
        to_sync: dict[int, PageStore] = {}
        pending: list[bytes] = []
        current: tuple[Any, int] | None = None

        def flush_pending() -> None:
            if pending and current is not None:
                current[0].append(current[1], pending)
                self.writes += 1
                pending.clear()

        for store, page, record, sync, on_done in batch:
            if record is None:
                flush_pending()
                current = None
                if page < 0:
                    store.close()
                else:
                    store.delete(page)
                    store.sync()
            else:
                if current != (store, page):
                    flush_pending()
                    current = (store, page)
                pending.append(record)
                written += len(record)
                if sync:
                    to_sync[id(store)] = store
            if on_done is not None:
                completions.append(on_done)
        flush_pending()
        self._sync(to_sync)
        if completions:
            self._dispatch(completions)
        if written:
            self._loop.call_soon_threadsafe(self._written, written)

    def _sync(self, stores: dict[int, PageStore]) -> None:
        for store in stores.values():
            store.sync()
            self.syncs += 1
        stores.clear()
