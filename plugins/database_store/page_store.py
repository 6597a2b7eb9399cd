"""`DatabasePageStore`: an address's pages as rows, one row per page and write.

Why not one row per page, as Artemis does: a page grows by appends, and rewriting (or
appending to) a blob on every sync costs the whole page each time; why not one row per
message: a million paged messages would be a million rows and index entries, and a
read of a page many round trips of tiny rows. Here each write puts, per page, the bytes
appended since the last one in one row at its byte offset (`start`), so a write costs
what it adds; with `jdbc-max-page-size-bytes` (100 KiB by default) a page is a few rows.

Appends stay in memory until `sync`, or until `FLUSH_BYTES` wait (then written, for
every page at once, without waiting for the database's disk: only `sync` promises
durability), and reads find them there too: a read takes the durable part from the
table and the rest from memory, so it never sees a partial record. Rows never change
once written, so the store keeps the page it read last and fetches only rows newer than
that: a cursor reads a page a few records at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from scow.core.page_frames import frame_all
from scow.plugins.database_store import database
from scow.plugins.database_store.schema import insert_rows
from scow.plugins.database_store.settings import DatabaseSettings, resolve

#: Unsynced bytes (non-durable paged messages) written without waiting for a sync.
FLUSH_BYTES = 1 << 20


class DatabasePageStore:
    """The pages of one address in the database; one thread writes, any thread reads."""

    def __init__(self, settings: DatabaseSettings, address: str) -> None:
        self.address = address
        self.db = database.acquire(settings)
        self._pages = self.db.schema.pages
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._address_id, self._durable = self.db.run(
                f"opening the pages of {address!r}", self._open
            )
        except BaseException:
            database.release(self.db)
            raise
        #: page -> bytes in the page (durable and in memory)
        self._sizes = dict(self._durable)
        #: page -> bytes appended since its last write, starting at self._durable[page]
        self._pending: dict[int, bytearray] = {}
        self._pending_bytes = 0
        #: The durable bytes of the page read last: a cursor reads a page a few records
        #: at a time, and rows never change once written.
        self._cached: tuple[int, bytes] = (-1, b"")

    def _open(self, conn: sa.Connection) -> tuple[int, dict[int, int]]:
        directory = self.db.schema.addresses
        found = conn.execute(
            sa.select(directory.c.address_id).where(directory.c.address == self.address)
        ).scalar()
        if found is None:
            highest = conn.execute(sa.select(sa.func.max(directory.c.address_id))).scalar()
            found = (highest or 0) + 1
            conn.execute(sa.insert(directory).values(address_id=found, address=self.address))
        p = self._pages.c
        sizes = conn.execute(
            sa.select(p.page, sa.func.max(p.start + sa.func.length(p.data)))
            .where(p.address_id == found)
            .group_by(p.page)
        )
        return int(found), {int(page): int(size) for page, size in sizes}

    def page_numbers(self) -> list[int]:
        with self._lock:
            return sorted(self._sizes)

    def append(self, page: int, records: Sequence[bytes]) -> int:
        data = frame_all(records)  # ValueError for an empty record, before anything changes
        with self._lock:
            highest = max(self._sizes, default=page)
            if page < highest:
                raise ValueError(
                    f"pages of {self.address!r}: cannot append to page {page}, "
                    f"page {highest} is the highest (only it takes appends)"
                )
            if page not in self._sizes:
                self._sizes[page] = self._durable[page] = 0
            self._pending.setdefault(page, bytearray()).extend(data)
            self._pending_bytes += len(data)
            self._sizes[page] += len(data)
            size = self._sizes[page]
            flush = self._pending_bytes >= FLUSH_BYTES
        if flush:
            self._write(durable=False)
        return size

    def sync(self) -> None:
        self._write(durable=True)

    def _write(self, *, durable: bool) -> None:
        """Write what is appended; `durable` waits for the database's disk (a flush of
        non-durable bytes need not: a later sync's commit covers it)."""
        with self._lock:
            rows = [
                {
                    "address_id": self._address_id,
                    "page": page,
                    "start": self._durable[page],
                    "data": bytes(buf),
                }
                for page, buf in self._pending.items()
                if buf
            ]
        if not rows:
            return

        def write(conn: sa.Connection) -> None:
            if not durable and conn.dialect.name == "postgresql":
                conn.execute(sa.text("SET LOCAL synchronous_commit = off"))
            insert_rows(conn, self._pages, rows)

        self.db.run(f"writing the pages of {self.address!r}", write)
        with self._lock:
            for row in rows:
                page = row["page"]
                buf = self._pending.get(page)
                if buf is None:
                    continue  # deleted meanwhile (its rows went with it)
                del buf[: len(row["data"])]
                self._durable[page] += len(row["data"])
                self._pending_bytes -= len(row["data"])
                if not buf:
                    del self._pending[page]

    def read(self, page: int, offset: int = 0) -> bytes:
        with self._lock:
            if page not in self._sizes:
                return b""
            durable = self._durable[page]
            buf = self._pending.get(page)
            memory = bytes(buf[max(0, offset - durable) :]) if buf else b""
            cached = self._cached[1] if self._cached[0] == page else b""
        if offset >= durable:
            return memory
        if len(cached) < durable:  # rows written since: they start where the cache ends
            p = self._pages.c
            query = (
                sa.select(p.data)
                .where(
                    p.address_id == self._address_id,
                    p.page == page,
                    p.start >= len(cached),
                    p.start < durable,
                )
                .order_by(p.start)
            )
            rows = self.db.run(
                f"reading the pages of {self.address!r}",
                lambda conn: conn.execute(query).scalars().all(),
                read=True,
            )
            cached += b"".join(rows)
            with self._lock:
                if page in self._sizes:
                    self._cached = (page, cached)
        return cached[offset:durable] + memory

    def delete(self, page: int) -> None:
        with self._lock:
            if self._sizes.pop(page, None) is None:
                return
            self._durable.pop(page, None)
            if self._cached[0] == page:
                self._cached = (-1, b"")
            buf = self._pending.pop(page, None)
            if buf:
                self._pending_bytes -= len(buf)
        p = self._pages.c
        self.db.run(
            f"deleting page {page} of {self.address!r}",
            lambda conn: conn.execute(
                sa.delete(self._pages).where(p.address_id == self._address_id, p.page == page)
            ),
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sync()
        finally:
            database.release(self.db)


def open_store(directory: Path, address: str, settings: Mapping[str, Any]) -> DatabasePageStore:
    """The page store factory: `settings` is `[database]` plus the broker's data-dir."""
    return DatabasePageStore(resolve(settings, _data_dir(directory, settings)), address)


def discover(directory: Path, settings: Mapping[str, Any]) -> list[str]:
    """Every address with a store in the database."""
    db = database.acquire(resolve(settings, _data_dir(directory, settings)))
    try:
        table = db.schema.addresses
        return db.run(
            "listing paged addresses",
            lambda conn: sorted(conn.execute(sa.select(table.c.address)).scalars()),
            read=True,
        )
    finally:
        database.release(db)


def _data_dir(directory: Path, settings: Mapping[str, Any]) -> Path:
    # the paging manager passes the data dir along; the paging directory's parent is the
    # default layout's data dir otherwise
    return Path(settings.get("data-dir") or Path(directory).parent)
