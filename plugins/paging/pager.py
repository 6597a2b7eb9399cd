"""An address's pages: the PAGE full policy and where its messages go while it pages.

While the address is full (its own limits or the broker's), every new message is written
once to the address's current page, with the ids of the queues it was routed to. Each
bound queue reads it back through its own `QueueCursor`. A queue whose cursor has nothing
left in pages and whose memory has room takes the message straight into memory as well
(the same record; no read from disk), so one slow subscription does not make the others
read from disk. The address leaves page mode once every cursor has caught up with what
was written and the address is under its limits again.

Queues that store their own messages (a stream: `stores_own_messages`) are not paged:
they keep everything in their own files and do not read pages. While the address pages,
such a queue gets each message as if the address did not page (journaled for it when
durable, handed to it at once, or at commit), has no cursor, and so holds no page and
not page mode. Only what pages hold for it anyway (written before this was so, or by a
commit the journal had no room for) comes to it through a draining cursor.

Records become visible to cursors in the order they were written, once written (and,
for a transaction, once committed). A page is deleted once it is closed and no cursor
has a message of it left to acknowledge.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.disk_monitor import describe_no_room, is_no_room, out_of_space
from scow.core.interfaces import after_all, stores_own_messages
from scow.core.large_messages import hold_body, large_body
from scow.core.message import Message, PagedRef, SharedMessage
from scow.core.model import AddressInfo, ResourceLimitExceeded, RouteStatus, StorageFull
from scow.core.page_frames import HEADER_SIZE
from scow.plugins.paging import record
from scow.plugins.paging.cursor import QueueCursor
from scow.plugins.paging.index import PageIndex
from scow.plugins.paging.summary import PageSummary
from scow.plugins.paging.writer import RETRY

if TYPE_CHECKING:
    from scow.core.interfaces import Completion, PageStore, Queue
    from scow.plugins.paging.manager import PagingManager

log = structlog.get_logger("scow.paging")


@dataclass(slots=True)
class PageInfo:
    """What the loop knows of one page: no per-message state."""

    number: int
    records: int = 0
    #: Bytes written (framed), and bytes cursors may read (written, synced, committed).
    size: int = 0
    visible: int = 0
    #: Transactions with records in this page.
    txs: set[int] = field(default_factory=set)
    #: The earliest expiration of a message in it (0: none expires).
    expires: int = 0
    #: The property values its messages hold; None when not known (it proves nothing).
    summary: PageSummary | None = field(default_factory=PageSummary)
    #: Files of the large messages its records refer to (released when it is deleted).
    large: list[int] = field(default_factory=list)
    #: The index being built while the page is written (None once closed, or when its
    #: store cannot seal one); then the page offset of its index record, once written
    #: (0: none).
    index: PageIndex | None = None
    index_at: int = 0
    #: Bytes written after `size` when it closed (its index and summary records).
    trailer: int = 0
    #: Frames found damaged on disk (at recovery, or by a reader; logged then): offset ->
    #: where readers go on (the next valid frame, else the visible end).
    damaged: dict[int, int] = field(default_factory=dict)

    def note_expiration(self, expiration: int) -> None:
        if expiration and (not self.expires or expiration < self.expires):
            self.expires = expiration


class AddressPager:
    """The PAGE full policy of one address, and its pages."""

    def __init__(self, manager: PagingManager, address: AddressInfo) -> None:
        self.manager = manager
        self.address = address
        self.broker = manager.broker
        self.paging = False
        self._store: PageStore | None = None
        self.cursors: dict[str, QueueCursor] = {}
        #: Names of the bound queues that store their own messages (no cursor).
        self.own_storage: set[str] = set()
        self.pages: dict[int, PageInfo] = {}
        #: Pages below this one were written before the broker started (recovered).
        self.first_page = 1
        #: The head: the page being written and its size.
        self.write_page = 1
        self.write_offset = 0
        #: Writes not yet visible, in order: [page, end offset, ready].
        self._unseen: deque[list[Any]] = deque()
        self._open_txs: dict[int, list[list[Any]]] = {}
        self._advancing = False
        #: A `check_now` is due at the end of this loop pass (`check`).
        self._check_due = False
        #: Transactions whose records are committed (recovered ones included).
        self.committed_txs: set[int] = set()
        #: Framed bytes in the pages still stored.
        self.paged_bytes = 0
        self.messages_paged = 0
        self.messages_dropped = 0
        self.messages_refused = 0
        #: Retries opening a store the file system had no room for (see `prepare_store`).
        self._retry: asyncio.TimerHandle | None = None
        address.pager = self
        for queue in address.queues.values():
            self.bind(queue)

    # ------------------------------------------------------------------ full policy

    def admit(self, message: Message) -> bool | None:
        return True  # page limits are checked in `page`

    def blocks_producers(self) -> bool:
        return False

    # ------------------------------------------------------------------ store

    @property
    def store(self) -> PageStore:
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def _open_store(self) -> PageStore:
        """Open the address's store; a head below pages it already holds moves past them.

        Those are an earlier address's of the same name, deleted with it (their deletion
        still queued in the writer): a store takes appends only at or past its highest
        page. Recovery, which reads them, sets the head itself afterwards."""
        store = self.manager.open_store(self.address.name)
        stored = store.page_numbers()
        if not self.pages and stored and stored[-1] >= self.write_page:
            old, self.write_page = self.write_page, stored[-1] + 1
            self.first_page = self.write_page
            for cursor in self.cursors.values():
                if cursor.page == old and cursor.offset == 0:
                    cursor.page = self.write_page
        return store

    def prepare_store(self) -> None:
        """Open the store before anything is counted or paged. Raises StorageFull, with
        nothing changed, when its file system has no room for it (the first page of an
        address makes its folder): producers are then held back (the disk monitor) and
        the store is opened again every RETRY seconds until space returns."""
        if self._store is not None:
            return
        try:
            self._store = self._open_store()
        except (StorageFull, OSError) as exc:
            if isinstance(exc, OSError) and not is_no_room(exc):
                raise
            refusal = (
                exc
                if isinstance(exc, StorageFull)
                else StorageFull(
                    f"page store of '{self.address.name}': not stored: "
                    + describe_no_room(self.manager.directory, f"its pages ({exc})")
                )
            )
            self._no_room(refusal.description)
            raise refusal from None
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
            self._no_room(None)

    def _no_room(self, problem: str | None) -> None:
        """Tell the disk monitor the store cannot be opened (`problem`), or can (None)."""
        owner = f"page store of address {self.address.name!r}"
        out_of_space(self.manager.directory, owner, problem)
        if problem is None:
            log.info("page store opened: there is room again", address=self.address.name)
            return
        if self._retry is None:
            log.warning(
                "page store not opened: no room for its files; sends to the address "
                "refused and producers held back until there is",
                address=self.address.name,
                reason=problem,
            )
        else:
            self._retry.cancel()
        self._retry = self.manager.loop.call_later(RETRY, self._retry_open)

    def _retry_open(self) -> None:
        if self.manager.pagers.get(self.address.name) is not self:
            self._retry = None
            self._no_room(None)  # closed meanwhile: holds nothing back any more
            return
        with contextlib.suppress(StorageFull):  # reschedules itself
            self.prepare_store()

    def close(self) -> None:
        """The address is deleted, its queues first: what its pages still hold (the head
        page, kept while the address paged) is no one's any more."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
            self._no_room(None)
        if self.manager.pagers.get(self.address.name) is self:
            del self.manager.pagers[self.address.name]
        self.paging = False  # a `check_now` due this loop pass has nothing left to end
        for page in list(self.pages):
            self.manager.delete_page(self, page, self.pages.pop(page))
        if self._store is not None:
            store, self._store = self._store, None
            self.manager.writer.close(store)  # after the writes and deletes queued for it

    # ------------------------------------------------------------------ queues

    def bind(self, queue: Queue) -> None:
        if stores_own_messages(queue):
            self.own_storage.add(queue.name)
            return
        cursor = QueueCursor(self, queue)
        self.cursors[queue.name] = cursor
        queue.cursor = cursor

    def drain_cursor(self, queue: Queue) -> QueueCursor:
        """The cursor through which `queue`, which stores its own messages, gets what the
        pages hold for it (made on first use; see `QueueCursor.drain_to_queue`)."""
        cursor = self.cursors.get(queue.name)
        if cursor is None:
            cursor = self.cursors[queue.name] = QueueCursor(self, queue)
            cursor.drain_to_queue = True
            queue.cursor = cursor
        return cursor

    def unbind(self, queue: Queue) -> None:
        self.own_storage.discard(queue.name)
        cursor = self.cursors.pop(queue.name, None)
        if cursor is None:
            return
        pages = list(cursor.pending)
        cursor.close()
        for page in pages:
            self._maybe_delete(page)
        self.check_now()

    # ------------------------------------------------------------------ writing

    def page(
        self,
        message: Message,
        queues: list[Queue],
        on_stored: Completion | None,
        tx_id: int | None,
    ) -> RouteStatus:
        self.prepare_store()  # first: it may refuse (StorageFull) while nothing changed
        if not self.paging:
            self._start()
        if self.own_storage:
            own = [q for q in queues if q.name in self.own_storage]
            if own:
                return self._page_around(message, queues, own, on_stored, tx_id)
        if self._refused_by_page_limit():
            return RouteStatus.DROPPED
        return self._write(message, queues, on_stored, tx_id)

    def _refused_by_page_limit(self) -> bool:
        """True when a page limit drops the next message; raises when it refuses it."""
        limit = self._page_limit()
        if limit is None:
            return False
        if self.address.settings.page_full_policy == "DROP":
            self.messages_dropped += 1
            return True
        self.messages_refused += 1
        raise ResourceLimitExceeded(
            f"address '{self.address.name}' reached its {limit}; page-full-policy is FAIL"
        )

    def _page_around(
        self,
        message: Message,
        queues: list[Queue],
        own: list[Queue],
        on_stored: Completion | None,
        tx_id: int | None,
    ) -> RouteStatus:
        """Page `message` for the queues that read pages; hand it to those that store
        their own messages (`own`) as the broker does while the address does not page:
        journaled for them first when durable, then enqueued (at commit, in a
        transaction). Raises StorageFull, with nothing done, when the journal has no
        room for it (outside a transaction)."""
        message.id = message.id or self.broker.next_id()
        paged = [q for q in queues if q.name not in self.own_storage]
        if paged and self._refused_by_page_limit():
            paged = []  # dropped where it would be paged; the streams still keep it
        broker = self.broker
        stored = message.durable and broker.persistent
        # outside a transaction a queue keeping its own durable copy is not journaled for
        keepers = self.address.keepers if stored and tx_id is None else ()
        kept = [q for q in own if q.durable and q in keepers]
        durable_ids = [q.id for q in own if q.durable and q not in kept] if stored else []
        # Who calls on_stored: within a transaction the page write (the journal's commit
        # covers the rest); otherwise the journal's add, each keeper's copy and the page's
        # sync, once all ran.
        page_done: Completion | None = on_stored
        own_done: Completion | None = None
        keep_done: Completion | None = None
        if tx_id is None and on_stored is not None and (durable_ids or kept):
            paged_durable = bool(paged) and message.durable and any(q.durable for q in paged)
            done = after_all(paged_durable + bool(durable_ids) + len(kept), on_stored)
            page_done = done if paged_durable else None
            own_done = done if durable_ids else None
            keep_done = done if kept else None
        if durable_ids:
            try:
                broker.storage.store_message(
                    message.id,
                    message.address,
                    message.expiration,
                    message.priority,
                    durable_ids,
                    message.data,
                    own_done,
                    tx_id=tx_id,
                )
            except StorageFull:
                if tx_id is None:
                    raise
                # The broker journaled the rest of the commit: it can no longer be refused.
                # The pages keep this copy too; a draining cursor hands it over at commit.
                for queue in own:
                    self.drain_cursor(queue)
                return self._write(message, paged + own, on_stored, tx_id)
        status = self._write(message, paged, page_done, tx_id) if paged else RouteStatus.ROUTED
        # the pages' copy and the own-storage copy are freed apart: each its own object
        refs, stored_refs = len(own), len(durable_ids)
        held = (
            SharedMessage(message, refs, stored_refs)
            if paged
            else message.shared(refs, stored_refs)
        )
        self.address.add_memory(len(message.data))
        hold_body(held.data)
        if tx_id is not None:
            self._open_txs.setdefault(tx_id, []).append(["own", own, held])
            if not paged and on_stored is not None:
                on_stored()  # nothing paged: the journal's commit is all there is to wait for
            return RouteStatus.PENDING
        for queue in own:
            if queue in kept:
                queue.keep(held, keep_done)
            else:
                queue.enqueue(held)
        return RouteStatus.PENDING if own_done or keep_done else status

    def _write(
        self,
        message: Message,
        queues: list[Queue],
        on_stored: Completion | None,
        tx_id: int | None,
    ) -> RouteStatus:
        """Write `message` to the head page for `queues` (all of them with cursors)."""
        message.id = message.id or self.broker.next_id()
        data = record.encode(
            message.id,
            message.expiration,
            tx_id or 0,
            message.durable,
            message.priority,
            [q.id for q in queues],
            message.data,
        )
        if self.write_offset >= min(
            self.address.settings.page_size_bytes, self.manager.max_page_size
        ):
            self._roll()
        page, offset = self.write_page, self.write_offset
        info = self.pages.get(page)
        if info is None:
            info = self.pages[page] = PageInfo(page)
            if getattr(self.store, "appended", None) is not None:
                info.index = PageIndex()
                self.manager.writer.index_page(self.store, page, info.index)
        end = offset + HEADER_SIZE + len(data)
        if (body := large_body(message.data)) is not None:
            self.broker.large_messages.page_hold(body)
            info.large.append(body.file_id)
        info.records += 1
        info.size = end
        if info.index is not None and len(queues) > 1:  # the writer notes the first queue
            info.index.routes[info.records - 1] = data[
                record.HEAD.size : record.HEAD.size + 8 * len(queues)
            ]
        info.note_expiration(message.expiration)
        summary = info.summary
        if summary is not None and summary.complete:
            try:
                summary.add(message.kind.format.properties(message.data))
            except ValueError:
                summary.unknown()  # unreadable properties: selectors read this page
        self.paged_bytes += end - offset
        self.write_offset = end
        self.messages_paged += 1
        direct: list[PagedRef] = []
        for queue in queues:
            cursor: QueueCursor = queue.cursor  # type: ignore[assignment]
            cursor.pending[page] = cursor.pending.get(page, 0) + 1
            if cursor.caught_up(page, offset) and cursor.has_room():
                cursor.offset = end  # it reads this record from memory, not from disk
                direct.append(PagedRef(message, queue, cursor, page, offset))
            else:
                cursor.note_paged(message)
                if tx_id is None:  # a transaction's message counts once it commits
                    queue.paged(message)
        if len(direct) > 1:  # one object for every queue that takes it from memory
            message = message.shared(len(direct), 0)
            for ref in direct:
                ref.message = message
        sync = message.durable and any(q.durable for q in queues)
        write = [page, end, False]
        self._unseen.append(write)
        if tx_id is not None:
            info.txs.add(tx_id)
            self._open_txs.setdefault(tx_id, []).append(write)
            self.manager.writer.submit(self.store, page, data, sync, on_stored)
            if direct:  # visible at commit, like every record of the transaction
                self._open_txs[tx_id].append(["refs", direct, message])
            return RouteStatus.PENDING
        self.manager.writer.submit(self.store, page, data, sync, lambda: self._written(write))
        if direct:
            self._enqueue_direct(message, direct)
        if sync and on_stored is not None:
            # run by _advance once the record is visible, and its queues' records durable
            write.append(self.broker.storage.after_bindings(on_stored))
            return RouteStatus.PENDING
        return RouteStatus.ROUTED

    def _enqueue_direct(self, message: Message, refs: list[PagedRef]) -> None:
        self.address.add_memory(len(message.data))
        hold_body(message.data)
        for ref in refs:
            ref.queue.enqueue(ref)

    def _written(self, write: list[Any]) -> None:
        write[2] = True
        if not self._advancing:  # once per batch of completions, not once per record
            self._advancing = True
            self.manager.loop.call_soon(self._advance)

    def commit_tx(self, tx_id: int) -> None:
        self.committed_txs.add(tx_id)
        for entry in self._open_txs.pop(tx_id, []):
            if entry[0] == "refs":
                self._enqueue_direct(entry[2], entry[1])
            elif entry[0] == "own":
                for queue in entry[1]:
                    queue.enqueue(entry[2])
            else:
                entry[2] = True
        self._advance()

    def _advance(self) -> None:
        """Make written records visible, in write order; wake cursors waiting for them."""
        self._advancing = False
        unseen = self._unseen
        moved = False
        while unseen and unseen[0][2]:
            write = unseen.popleft()
            info = self.pages.get(write[0])
            if info is not None:
                info.visible = write[1]
            moved = True
            for then in write[3:]:
                then()
        if moved:
            for cursor in list(self.cursors.values()):
                if not cursor.backlog:
                    continue
                if cursor.purging is not None or cursor.drain_to_queue:
                    cursor.fill()  # it reads on whether or not anyone consumes
                elif cursor.queue.consumer_count():
                    cursor.queue.dispatch()  # consumers fill, browsers browse
            # what was read straight from memory may all be acknowledged by now: page mode
            # can end once nothing is in flight (check_now() waited for these writes)
            self.check_now()

    def visible_end(self, page: int) -> int:
        info = self.pages.get(page)
        return info.visible if info is not None else 0

    def _roll(self) -> None:
        """Close the head page (its index and summary are its last records) and open the
        next; cursors at the head move with it."""
        old, end = self.write_page, self.write_offset
        info = self.pages.get(old)
        if info is not None and info.records:
            # past the page's size: cursors stop before them, readers and recovery use them
            writer = self.manager.writer
            index, info.index = info.index, None
            if index is not None:
                writer.close_page(self.store, old, partial(self._indexed, info, index, end))
            if info.summary is not None:
                summary = record.encode_summary(info.summary.encode())
                writer.submit(self.store, old, summary, False, None)
                info.trailer += HEADER_SIZE + len(summary)
            self.paged_bytes += info.trailer
        self.write_page += 1
        self.write_offset = 0
        for cursor in self.cursors.values():
            if cursor.page == old and cursor.offset == end:
                cursor.page, cursor.offset = self.write_page, 0
        self._maybe_delete(old)

    def _indexed(self, info: PageInfo, index: PageIndex, at: int) -> None:
        """The writer wrote `info`'s page's index at page offset `at` (or could not: size
        0): count its bytes; readers use it from now on."""
        if index.size and self.pages.get(info.number) is info:
            info.index_at = at
            info.trailer += HEADER_SIZE + index.size
            self.paged_bytes += HEADER_SIZE + index.size

    def _page_limit(self) -> str | None:
        """The page limit this address has reached, named for the producer, or None."""
        settings = self.address.settings
        if settings.page_full_policy is None:
            return None
        if 0 <= settings.page_limit_bytes <= self.paged_bytes:
            return f"page-limit-bytes {settings.page_limit_bytes} ({self.paged_bytes} bytes paged)"
        if settings.page_limit_messages >= 0:
            paged = max((c.backlog for c in self.cursors.values()), default=0)
            if paged >= settings.page_limit_messages:
                return f"page-limit-messages {settings.page_limit_messages} ({paged} paged)"
        return None

    # ------------------------------------------------------------------ page mode

    def _start(self) -> None:
        self.paging = True
        log.info("address started paging", address=self.address.name, page=self.write_page)

    def check(self) -> None:
        """Memory was freed: `check_now` at the end of this loop pass. The broker asks on
        every acknowledgement while the address pages, where once for a socket read's
        acknowledgements says the same (the address's limits and blocked producers are
        looked at by the broker at each acknowledgement; this only decides when page
        mode ends: messages routed earlier in the same pass, from other sockets, still go
        to pages, in order)."""
        if not self._check_due:
            self._check_due = True
            self.manager.loop.call_soon(self._check_due_now)

    def _check_due_now(self) -> None:
        self._check_due = False
        self.check_now()

    def check_now(self) -> None:
        """Leave page mode once every cursor caught up and the address has room."""
        if not self.paging or self._unseen:
            return
        # asked once per loop pass while acknowledgements come: while a cursor still has
        # messages in pages (a drain, all along) that alone says no, before the limits
        for cursor in self.cursors.values():
            if cursor.backlog:
                return
        if self.address.is_full():
            return
        page, offset = self.write_page, self.write_offset
        if all(c.caught_up(page, offset) for c in list(self.cursors.values())):
            self.paging = False
            log.info("address stopped paging", address=self.address.name)
            self._maybe_delete(page)  # kept while paging, though it may be all acknowledged
            for page in list(self.pages):
                self._maybe_delete(page)

    # ------------------------------------------------------------------ acknowledgements

    def settled(self, page: int) -> None:
        """A cursor has no message of `page` left: delete the page if no one has."""
        self._maybe_delete(page)

    def _maybe_delete(self, page: int) -> None:
        info = self.pages.get(page)
        if info is None:
            return
        if page == self.write_page and self.paging:
            return  # still being written
        if info.visible < info.size:
            return  # writes of it are still on their way
        if any(page in c.pending for c in self.cursors.values()):
            return
        del self.pages[page]
        self.paged_bytes -= info.size + info.trailer
        if page == self.write_page:  # never append to a deleted page
            self._roll()
        self.manager.delete_page(self, page, info)

    # ------------------------------------------------------------------ figures

    def stats(self) -> dict[str, Any]:
        return {
            "paging": self.paging,
            "page-count": len(self.pages),
            "paged-bytes": self.paged_bytes,
            "messages-paged": sum(info.records for info in self.pages.values()),
            "page-full": self._page_limit() is not None,
            "messages-written-to-pages": self.messages_paged,
            "messages-dropped-page-full": self.messages_dropped,
            "messages-refused-page-full": self.messages_refused,
            "cursors": {name: c.stats() for name, c in self.cursors.items()},
        }
