"""The broker's paging: settings, the page writer and reader threads, and every pager.

Built on first use (the first address whose PAGE policy is created, or the paging
service at startup) and kept as `broker.page_manager`. At startup, `recover` rebuilds
each address's pages and cursors from the page files and the journal's cursor records:
counters are derived from the data, never stored. So is what a last-value queue learnt
at page time (the newest value of each key in pages): the scan asks such queues for each
of their paged messages' key, and hands them the newest id per key before any is read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from scow.core.interfaces import Completion, PageStore
from scow.core.message import Message
from scow.plugins.paging.pager import AddressPager, PageInfo
from scow.plugins.paging.scan import (
    PagedRecord,
    add_counts,
    durable_counts,
    durable_records,
    new_counts,
)
from scow.plugins.paging.writer import PageWriter

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.descriptors import PageStoreBackend
    from scow.core.message import MessageFormat
    from scow.core.model import AddressInfo
    from scow.core.storage import PageRecovery

log = structlog.get_logger("scow.paging")
T = TypeVar("T")


def _run_all(completions: list[Completion]) -> None:
    for completion in completions:
        completion()


@dataclass
class _Scan:
    """What one address's page files hold for its durable queues (built off the loop)."""

    pages: dict[int, PageInfo] = field(default_factory=dict)
    #: queue id -> (messages, bytes, {page: messages}, lowest message id)
    queues: dict[int, list[Any]] = field(default_factory=dict)
    #: queue id -> {key: id of the newest paged message with it}, for the queues that
    #: supersede paged messages by a key (`page_key`, last-value queues)
    newest: dict[int, dict[object, int]] = field(default_factory=dict)
    #: (file id, head size, length) of each large message the durable queues still hold.
    large: list[tuple[int, int, int]] = field(default_factory=list)


class PagingManager:
    """Paging for one broker."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        config = broker.config
        self.settings: Mapping[str, Any] = config.section("paging")
        name = str(self.settings["store"])
        backend = broker.page_stores.get(name)
        if backend is None:
            raise ValueError(
                f"[paging] store = {name!r}: no enabled plugin provides it "
                f"(available: {', '.join(sorted(broker.page_stores)) or 'none'})"
            )
        self.backend: PageStoreBackend = backend
        section = backend.config_section
        data_dir = Path(str(config.section("broker")["data-dir"]))
        #: The backend's own section, and the data dir its relative locations start from.
        self.store_settings: Mapping[str, Any] = {
            **(config.section(section) if section else {}),
            "data-dir": str(data_dir),
        }
        #: The backend's cap on page-size-bytes (e.g. jdbc-max-page-size-bytes).
        cap = backend.max_page_size
        self.max_page_size = cap(self.store_settings) if cap is not None else 1 << 62
        self.directory = data_dir / str(self.settings["paging-directory"])
        loop = asyncio.get_running_loop()
        self.loop = loop
        limits = broker.limits
        self.writer = PageWriter(
            loop,
            lambda batch: loop.call_soon_threadsafe(_run_all, batch),
            int(self.settings["page-sync-timeout"]),  # type: ignore[call-overload]
            lambda hold: limits.block("paging") if hold else limits.unblock("paging"),
        )
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="scow-page-reader")
        self.pagers: dict[str, AddressPager] = {}

    @classmethod
    def of(cls, broker: Broker) -> PagingManager:
        manager = broker.page_manager
        if manager is None:
            manager = broker.page_manager = cls(broker)
        return manager  # type: ignore[no-any-return]

    def pager(self, address: AddressInfo) -> AddressPager:
        pager = self.pagers.get(address.name)
        if pager is None or pager.address is not address:
            pager = self.pagers[address.name] = AddressPager(self, address)
        return pager

    def message_format(self) -> MessageFormat:
        fmt = self.broker.message_format
        assert fmt is not None, "no protocol plugin gave the broker a message format"
        return fmt

    def properties(self, data: bytes) -> Mapping[str, object]:
        """A paged message's properties, read from its bytes (for selectors)."""
        return self.message_format().properties(data)

    def open_store(self, address: str) -> PageStore:
        return self.backend.factory(self.directory, address, self.store_settings)

    # ------------------------------------------------------------------ IO

    def read(
        self, reader: Callable[..., T], args: tuple[Any, ...], done: Callable[[T], None]
    ) -> None:
        """Run `reader(*args)` (a page read, and whatever parsing goes with it) in the
        reader thread; `done(result)` runs on the loop."""
        future = self.reader.submit(reader, *args)
        future.add_done_callback(lambda f: self.loop.call_soon_threadsafe(done, f.result()))

    def delete_page(self, pager: AddressPager, page: int, info: PageInfo) -> None:
        """Delete the page file, then (once it is gone) the journal records about it.

        Who deletes each record is decided here, at once: the cursors give theirs up, and
        a transaction's record goes with the last stored page holding its records (two
        pages deleted before either file is gone must not both delete it).
        """
        records = [c.records.pop(page) for c in pager.cursors.values() if page in c.records]
        txs = [
            tx_id
            for tx_id in info.txs
            if not any(tx_id in p.txs for pg in self.pagers.values() for p in pg.pages.values())
        ]
        for tx_id in txs:
            pager.committed_txs.discard(tx_id)
        large = self.broker.large_messages
        for file_id in info.large:
            large.page_release(file_id)

        def forget() -> None:
            if not self.broker.persistent:
                return
            storage = self.broker.storage
            for record_id in (*records, *txs):
                storage.delete_record(record_id)

        self.writer.delete(pager.store, page, forget)

    def stop(self) -> None:
        self.writer.stop()
        self.reader.shutdown(wait=True)
        for pager in self.pagers.values():
            if pager._store is not None:
                pager._store.close()

    # ------------------------------------------------------------------ recovery

    async def recover(self) -> None:
        """Rebuild pages and cursors of every address that has page files.

        Every address is rebuilt before any page is deleted or journal record forgotten:
        a transaction's records may lie in the pages of several addresses.
        """
        broker = self.broker
        recovery = broker.page_recovery
        names = await self.loop.run_in_executor(
            None, self.backend.discover, self.directory, self.store_settings
        )
        recovered: list[AddressPager] = []
        scanned_txs: set[int] = set()
        for name in names:
            address = broker.addresses.get(name)
            if address is None or address.pager is None:
                log.warning(
                    "page files of an address that does not page now are left in place",
                    address=name,
                    directory=str(self.directory),
                )
                continue
            pager: AddressPager = address.pager  # type: ignore[assignment]
            durable = {q.id: q for q in address.queues.values() if q.durable}
            acked = _acked_by_queue(recovery, durable)
            committed = recovery.page_txs if recovery is not None else set()
            keyed = {
                queue_id: key_of
                for queue_id, queue in durable.items()
                if (key_of := getattr(queue, "page_key", None)) is not None
            }
            scan = await self.loop.run_in_executor(
                None,
                _scan_store,
                pager.store,
                durable.keys(),
                acked,
                committed,
                keyed,
                (address.name, self.message_format()),
            )
            for info in scan.pages.values():
                scanned_txs |= info.txs
            self._apply(pager, scan, recovery)
            recovered.append(pager)
        if recovery is not None:
            self._forget_orphans(recovery, scanned_txs)
        for pager in recovered:
            for page in list(pager.pages):
                pager._maybe_delete(page)  # what every queue acknowledged before the stop
            for cursor in pager.cursors.values():
                if cursor.drain_to_queue:
                    cursor.fill()

    def _apply(self, pager: AddressPager, scan: _Scan, recovery: PageRecovery | None) -> None:
        pager.pages = scan.pages
        large = self.broker.large_messages
        for file_id, head_size, length in scan.large:
            try:
                large.paged_body(file_id, head_size, length)  # its page holds it from now
            except OSError as exc:
                log.warning("a paged large message's file is missing", reason=str(exc))
        pager.paged_bytes = sum(info.size for info in scan.pages.values())
        pager.write_page = pager.first_page = max(scan.pages, default=0) + 1
        pager.write_offset = 0
        if recovery is not None:
            pager.committed_txs |= recovery.page_txs
        self._drain_own_storage(pager, scan)
        for cursor in pager.cursors.values():
            newest = scan.newest.get(cursor.queue.id)
            if newest:
                cursor.queue.recovered_paged(newest)  # type: ignore[attr-defined]
            messages, size, pending, first = scan.queues.get(cursor.queue.id, (0, 0, {}, 0))
            cursor.backlog, cursor.backlog_bytes, cursor.pending = messages, size, pending
            cursor.priorities_known = not messages
            cursor.page = min(pending, default=pager.write_page)
            cursor.offset = 0
            if recovery is not None:
                # the cursor owns the records it takes (deleted with their page or queue);
                # what no cursor takes is an orphan
                for key in [k for k in recovery.cursor_pages if k[0] == cursor.queue.id]:
                    if key[1] in scan.pages:
                        record = recovery.cursor_pages.pop(key)
                        cursor.records[key[1]] = record.record_id
                        cursor.acked[key[1]] = record.acked
                        cursor.counts[key[1]] = record.counts
            if messages and not cursor.drain_to_queue:
                cursor.hold_back(first)  # the journal's messages sent after its paged ones
        if any(c.backlog for c in pager.cursors.values()):
            pager.paging = True
            log.info(
                "address pages recovered",
                address=pager.address.name,
                pages=len(scan.pages),
                messages={c.queue.name: c.backlog for c in pager.cursors.values()},
            )

    def _drain_own_storage(self, pager: AddressPager, scan: _Scan) -> None:
        """Cursors that hand queues storing their own messages (streams) what pages hold
        for them: pages written before such queues were kept out of pages."""
        for name in pager.own_storage:
            queue = pager.address.queues.get(name)
            if queue is None or not scan.queues.get(queue.id, (0,))[0]:
                continue
            log.warning(
                "messages of a queue that stores its own found in its address's pages: "
                "they go to the queue",
                address=pager.address.name,
                queue=name,
                messages=scan.queues[queue.id][0],
            )
            pager.drain_cursor(queue)

    def _forget_orphans(self, recovery: PageRecovery, scanned_txs: set[int]) -> None:
        """Journal records about pages or transactions that no longer exist: the cursor
        records no cursor took, and the transaction records no scanned page names (those
        of pages recovery deletes go with the page). A record already gone is no reason
        to refuse to start."""
        if not self.broker.persistent:
            return
        orphans = [record.record_id for record in recovery.cursor_pages.values()]
        orphans += sorted(recovery.page_txs - scanned_txs)
        storage = self.broker.storage
        for record_id in orphans:
            try:
                storage.delete_record(record_id)
            except ValueError as exc:
                log.warning("a page record recovery found was already gone", error=str(exc))
        recovery.cursor_pages.clear()
        recovery.page_txs.clear()


def _acked_by_queue(
    recovery: PageRecovery | None, durable: Mapping[int, Any]
) -> dict[tuple[int, int], set[int]]:
    if recovery is None:
        return {}
    return {key: record.acked for key, record in recovery.cursor_pages.items() if key[0] in durable}


def _scan_store(
    store: PageStore,
    queue_ids_durable: Any,
    acked: Mapping[tuple[int, int], set[int]],
    committed: set[int],
    keyed: Mapping[int, Callable[[Message], object]] | None = None,
    origin: tuple[str, MessageFormat] | None = None,
) -> _Scan:
    """Count, per durable queue and page, the committed durable messages not acknowledged.

    Non-durable messages do not survive a restart, and a transaction's records count only
    if it committed; nothing of a message is kept but counters. For the queues in `keyed`
    (queue id -> `page_key`; `origin` is the address and message format), the newest id
    per key among their messages, acknowledged or not: a value consumed before the stop
    still replaced the older ones.
    """
    scan = _Scan()
    if not keyed:
        properties = origin[1].properties if origin is not None else None
        scan.queues, scan.large = durable_counts(
            store, set(queue_ids_durable), acked, committed, scan.pages, properties
        )
        return scan
    assert origin is not None
    queues = new_counts()
    records = _keyed_records(store, queue_ids_durable, acked, committed, scan, keyed, origin)
    add_counts(records, queues, scan.large)
    scan.queues = dict(queues)
    return scan


def _keyed_records(
    store: PageStore,
    queue_ids_durable: Any,
    acked: Mapping[tuple[int, int], set[int]],
    committed: set[int],
    scan: _Scan,
    keyed: Mapping[int, Callable[[Message], object]],
    origin: tuple[str, MessageFormat],
) -> Iterator[PagedRecord]:
    """`durable_records`, noting in `scan.newest` the newest id per key of the keyed
    queues' messages, the acknowledged ones included (the same single pass)."""
    address, fmt = origin
    newest: dict[int, dict[object, int]] = {queue_id: {} for queue_id in keyed}
    scan.newest = newest
    records = durable_records(
        store, set(queue_ids_durable), {}, committed, scan.pages, fmt.properties
    )
    for rec in records:
        message: Message | None = None
        holders = []
        for queue_id in rec.queue_ids:
            key_of = keyed.get(queue_id)
            if key_of is not None:
                if message is None:
                    message = Message(rec.message_id, bytes(rec.data), address, fmt, durable=True)
                key = key_of(message)
                if key is not None:
                    known = newest[queue_id]
                    if known.get(key, -1) < rec.message_id:
                        known[key] = rec.message_id
            done = acked.get((queue_id, rec.page))
            if done is None or rec.offset not in done:
                holders.append(queue_id)
        if holders:
            rec.queue_ids = holders
            yield rec
