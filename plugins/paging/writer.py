"""The page writer: one thread appends every address's page records and syncs them.

Producers' records reach it through `submit`; it takes everything queued in one go,
appends each store's records with one write per page, syncs the stores that hold a
durable record (once each: group commit, waiting `page-sync-timeout` first so that one
sync covers more producers), and hands the completions back to the event loop in one
call. Deletions go through the same thread, so they are ordered after the writes. So
is a page's index (`scow.plugins.paging.index`): the writer notes the records it appends
to an indexed page (`index_page`), once per write, and when the page closes
(`close_page`) seals the index with the CRC of what it appended to the page, which only
the store that wrote the page knows (`FilePageStore.appended`), and appends it.

A full file system does not stop it. An append that meets ENOSPC (the store cuts what it
half wrote) is held with everything queued after it for that store, producers are held
back, and the held records are written again every `RETRY` seconds until space returns;
their completions run only then. Nothing is refused: the pager has already counted the
records and may have handed them to consumers from memory, and a non-durable one was
already accepted. Deletes of other pages of that store go ahead (they free space).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import structlog

from scow.core import critical
from scow.core.disk_monitor import is_no_room
from scow.core.interfaces import Completion, PageStore
from scow.plugins.paging.index import PageIndex

log = structlog.get_logger("scow.paging")


#: Page records waiting for the writer, in bytes, before producers are held back.
MAX_BACKLOG = 32 << 20
#: Seconds between attempts to write what a full file system refused.
RETRY = 1.0

_Item = tuple[PageStore, int, bytes | PageIndex | None, bool, Completion | None]


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
        self._holding = False  # the backlog holds producers back
        self._stalled = False  # the file system is full (kept on the loop)
        self._held_back = False  # what hold_producers was last told
        self._cond = threading.Condition()
        # (store, page, record, sync, on_done); record None: delete the page (close the
        # store when page is -1)
        self._queue: list[_Item] = []
        #: Items the loop submitted since its last hand-over: one lock per loop turn, not
        #: one per message.
        self._submitted: list[_Item] = []
        #: Items a full file system refused, in order (writer thread only).
        self._held: list[_Item] = []
        self._stopping = False
        #: (store id, page) -> the index noting that page's records (see `index_page`).
        self._indexes: dict[tuple[int, int], PageIndex] = {}
        self._no_room = ""  # the last refusal, for logs
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
            self._update_hold()

    def _written(self, size: int) -> None:
        self.backlog -= size
        if self._holding and self.backlog <= self._max_backlog // 2:
            self._holding = False
            self._update_hold()

    def _set_stalled(self, stalled: bool) -> None:
        """On the loop: the file system refused an append (True), or took it again."""
        self._stalled = stalled
        self._update_hold()

    def _update_hold(self) -> None:
        hold = self._holding or self._stalled
        if hold != self._held_back:
            self._held_back = hold
            self._hold_producers(hold)

    def index_page(self, store: PageStore, page: int, index: PageIndex) -> None:
        """Note in `index` the records appended to `page` from now on (on the loop, before
        the page's first record is submitted)."""
        self._indexes[id(store), page] = index

    def close_page(self, store: PageStore, page: int, on_done: Completion) -> None:
        """Seal and append `page`'s index after the records submitted before (on the loop,
        when the page closes); `on_done` runs once it is written (or was not: see
        `PageIndex.size`); nothing runs for a page that has no index. Nothing is counted
        in the backlog: the index is written by the writer from what it noted."""
        index = self._indexes.get((id(store), page))
        if index is None:
            return
        if not self._submitted:
            self._loop.call_soon(self._hand_over)
        self._submitted.append((store, page, index, False, on_done))

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
        stalled = False
        while True:
            with self._cond:
                while not self._queue and not self._stopping and not self._held:
                    self._cond.wait()
                if self._held and not self._queue and not self._stopping:
                    self._cond.wait(RETRY)  # new work tries at once, else every RETRY s
                if not self._queue and not self._held and self._stopping:
                    break
                if self._sync_delay and any(item[3] for item in self._queue):
                    # let more durable records join this sync (group commit)
                    self._cond.wait(self._sync_delay)
                batch, self._queue = self._held + self._queue, []
                self._held = []
                stopping = self._stopping
            try:
                self._write(batch)
            except OSError as exc:
                log.exception("page write failed")
                critical.storage_failed("page writer", exc)
                raise
            if bool(self._held) != stalled:
                stalled = not stalled
                if stalled:
                    log.warning(
                        "page write refused: no room for it; producers held back and "
                        "the write retried until there is",
                        error=self._no_room,
                    )
                else:
                    log.info("page writes go on: there is room again")
                self._loop.call_soon_threadsafe(self._set_stalled, stalled)
            if stopping and self._held:
                log.error(
                    "page records not written at shutdown: no room for them",
                    records=sum(1 for item in self._held if item[2] is not None),
                    error=self._no_room,
                )
                self._held = []
                break

    def _write(self, batch: list[_Item]) -> None:
        completions: list[Completion] = []
        written = 0
        to_sync: dict[int, PageStore] = {}
        pending: list[_Item] = []  # one run of records for one store and page
        records: list[bytes] = []  # their bytes
        #: stores with a held append -> the pages it held (later items wait behind it)
        stalled: dict[int, set[int]] = {}

        def flush_pending() -> None:
            nonlocal written
            if not pending:
                return
            store, page = pending[0][0], pending[0][1]
            try:
                store.append(page, list(records))
            except (OSError, ValueError) as exc:
                if not (isinstance(exc, OSError) and is_no_room(exc)):
                    # one store refusing must not stop the writes of every other address:
                    # these records stay unwritten (their producers get no outcome), and
                    # an I/O error is the broker's end (`scow.core.critical`)
                    log.exception("page write failed", page=page, records=len(records))
                    if isinstance(exc, OSError):
                        critical.storage_failed(f"page store of address {store.address!r}", exc)
                    index = self._indexes.get((id(store), page))
                    if index is not None:
                        index.spoiled = True
                    pending.clear()
                    records.clear()
                    return
                self._no_room = str(exc)
                stalled.setdefault(id(store), set()).add(page)
                self._held.extend(pending)
            else:
                self.writes += 1
                written += sum(map(len, records))
                index = self._indexes.get((id(store), page))
                if index is not None:
                    index.note(records)
                for item in pending:
                    if item[3]:
                        to_sync[id(store)] = store
                    if item[4] is not None:
                        completions.append(item[4])
            pending.clear()
            records.clear()

        for item in batch:
            store, page, record, _sync, on_done = item
            held_pages = stalled.get(id(store))
            if held_pages is not None and (record is not None or page < 0 or page in held_pages):
                self._held.append(item)  # in order, behind what was held
                if record is not None:
                    held_pages.add(page)
                continue
            if record.__class__ is PageIndex:
                flush_pending()  # what it indexes first
                if id(store) in stalled:  # that append was just held: the index waits too
                    self._held.append(item)
                    stalled[id(store)].add(page)
                    continue
                self._indexes.pop((id(store), page), None)
                self._seal(store, page, record)  # type: ignore[arg-type]
                if on_done is not None:
                    completions.append(on_done)
                continue
            if record is None:
                flush_pending()
                if page < 0:
                    store.close()
                    for key in [key for key in list(self._indexes) if key[0] == id(store)]:
                        del self._indexes[key]  # pages never closed: their address is gone
                else:
                    store.delete(page)
                    store.sync()
                    self._indexes.pop((id(store), page), None)
                if on_done is not None:
                    completions.append(on_done)
                continue
            if pending and (pending[0][0] is not store or pending[0][1] != page):
                flush_pending()
                if id(store) in stalled:  # its pending append was just held
                    self._held.append(item)
                    stalled[id(store)].add(page)
                    continue
            pending.append(item)
            records.append(record)  # type: ignore[arg-type]
        flush_pending()
        self._sync(to_sync)
        if completions:
            self._dispatch(completions)
        if written:
            self._loop.call_soon_threadsafe(self._written, written)

    def _seal(self, store: PageStore, page: int, index: PageIndex) -> None:
        """Append `page`'s index, sealed with the CRC of what the store appended to it;
        nothing when the store cannot tell, or the page is not what the index lists. A
        page without its index is read all the same (frame by frame), so an append that
        fails here costs only that."""
        appended = getattr(store, "appended", None)
        state = appended(page) if appended is not None else None
        sealed = index.seal(*state) if state is not None else None
        if sealed is None:
            return
        try:
            store.append(page, [sealed])
        except (OSError, ValueError) as exc:
            index.size = 0  # not on disk: nothing to count
            log.warning(
                "page index not written: the page is read without it", page=page, error=str(exc)
            )
            return
        self.writes += 1

    def _sync(self, stores: dict[int, PageStore]) -> None:
        for store in stores.values():
            store.sync()
            self.syncs += 1
        stores.clear()
