"""`scow data` for pages: describe them, export paged messages, import them into pages.

The tools read a stopped broker's page files under `<data-dir>/paging` (the default
paging-directory) together with what its journal recovered: which queues exist and what
each acknowledged.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from scow.core.interfaces import PageStore
from scow.core.page_frames import frame, iter_frames
from scow.core.storage import Recovered, RecoveredMessage, StorageManager
from scow.plugins.paging import record
from scow.plugins.paging.scan import durable_records
from scow.plugins.paging.store import FilePageStore, discover, folder_name

PAGING_DIRECTORY = "paging"
#: Pages written by `import`: the default page-size-bytes.
IMPORT_PAGE_SIZE = 10 * 1024 * 1024


def _stores(data_dir: Path) -> Iterator[FilePageStore]:
    directory = data_dir / PAGING_DIRECTORY
    for address in discover(directory, {}):
        yield FilePageStore(directory, address, repair=False)  # tools only read


def _acked(recovered: Recovered) -> dict[tuple[int, int], set[int]]:
    return {key: rec.acked for key, rec in recovered.pages.cursor_pages.items()}


def describe(
    data_dir: Path, recovered: Recovered, stores: Iterable[PageStore] | None = None
) -> Iterator[str]:
    """Lines describing every address's pages and each durable queue's place in them.

    `stores` are the stores to read (each closed once read); the page files under
    `data_dir` when None.
    """
    names = {q["id"]: q["name"] for q in recovered.queues}
    for store in _stores(data_dir) if stores is None else stores:
        folder = getattr(store, "folder", None)  # file stores say where their files are
        yield f"# pages of {store.address!r}" + (f": {folder}" if folder else "")
        for page in store.page_numbers():
            buf = store.read(page)
            yield f"page {page}: {_page_line(buf)}"
        held: dict[int, int] = {}
        for rec in durable_records(store, set(names), _acked(recovered), recovered.pages.page_txs):
            for queue_id in rec.queue_ids:
                held[queue_id] = held.get(queue_id, 0) + 1
        for queue_id, count in sorted(held.items()):
            yield f"queue {names[queue_id]!r}: {count} durable messages in pages"
        for (queue_id, page), cursor in sorted(recovered.pages.cursor_pages.items()):
            if queue_id in held or queue_id in names:
                yield (
                    f"cursor {names.get(queue_id, queue_id)!r} page {page}: "
                    f"{len(cursor.acked)} acknowledged, {len(cursor.counts)} delivery counts"
                )
        store.close()


def _page_line(buf: bytes) -> str:
    """What a page holds: its messages, and whether it ends with an index and summary."""
    flags = [record.HEAD.unpack_from(buf, start)[3] for _f, start, _e in iter_frames(buf)]
    messages = sum(1 for flag in flags if not flag & (record.INDEX | record.SUMMARY))
    line = f"{messages} messages, {len(buf)} bytes"
    extra = [
        name
        for flag, name in ((record.INDEX, "index"), (record.SUMMARY, "summary"))
        if any(f & flag for f in flags)
    ]
    return line + (f" (with its {' and '.join(extra)})" if extra else "")


def paged_messages(
    data_dir: Path, recovered: Recovered, stores: Iterable[PageStore] | None = None
) -> Iterator[RecoveredMessage]:
    """Every durable paged message still held by a queue, with its delivery counts.

    `stores` as for `describe`.
    """
    queue_ids = {q["id"] for q in recovered.queues}
    counts = recovered.pages.cursor_pages
    for store in _stores(data_dir) if stores is None else stores:
        for rec in durable_records(store, queue_ids, _acked(recovered), recovered.pages.page_txs):
            queues = {}
            for queue_id in rec.queue_ids:
                cursor = counts.get((queue_id, rec.page))
                queues[queue_id] = cursor.counts.get(rec.offset, 0) if cursor else 0
            yield RecoveredMessage(
                rec.message_id,
                store.address,
                rec.expiration,
                rec.priority,
                bytes(rec.data),
                queues,
                paged=True,
                large=rec.large,
            )
        store.close()


def discard(data_dir: Path) -> None:
    """Remove every page file under `data_dir` (a failed import's undo)."""
    directory = data_dir / PAGING_DIRECTORY
    if directory.exists():
        shutil.rmtree(directory)


class PageImporter:
    """Writes imported paged messages into a fresh data dir's page files."""

    def __init__(self, data_dir: Path, storage: StorageManager) -> None:
        self.directory = data_dir / PAGING_DIRECTORY
        self.storage = storage
        self._stores: dict[str, tuple[FilePageStore, list[int]]] = {}  # [page, size]

    def add(self, message: RecoveredMessage) -> None:
        store, head = self._store(message.address)
        data = record.encode(
            message.id,
            message.expiration,
            0,
            True,
            message.priority,
            list(message.queues),
            message.data,
        )
        if head[1] >= IMPORT_PAGE_SIZE:
            head[0], head[1] = head[0] + 1, 0
        page, offset = head
        head[1] += len(frame(data))
        store.append(page, [data])
        for queue_id, count in message.queues.items():
            if count:
                record_id = self.storage.next_id()
                self.storage.store_cursor_page(record_id, queue_id, page)
                self.storage.cursor_delivery_count(record_id, offset, count, lambda: None)

    def _store(self, address: str) -> tuple[FilePageStore, list[int]]:
        entry = self._stores.get(address)
        if entry is None:
            if (self.directory / folder_name(address)).exists():
                raise ValueError(f"{self.directory}: pages of {address!r} exist already")
            entry = self._stores[address] = (FilePageStore(self.directory, address), [1, 0])
        return entry

    def close(self) -> None:
        for store, _head in self._stores.values():
            store.sync()
            store.close()
