"""`DatabaseLargeMessageStore`: large message bodies as rows of a table, in chunks.

Artemis's `LARGE_MESSAGES` table, as chunked rows: (id, chunk number, up to CHUNK bytes),
so that a body is written as its frames arrive and read as a delivery needs it, never
whole in memory, on SQLite and PostgreSQL alike. All database work runs on the store's
threads, never on the event loop: an arrival hands each full chunk to its *lane* (one
thread, chosen by the body's id, so a body's writes, its final commit and its deletion
run in order) and its link stops reading the socket while more than BEHIND bytes wait
(`room`); a delivery reads READ_AHEAD chunks ahead on the reader threads (`_Prefetch`).

Chunks commit as they are written (on PostgreSQL without waiting for the WAL flush);
the last one commits with the lock row's fence and, for a durable message with
`large-message-sync`, a synchronous commit, which flushes the WAL of every chunk before
it: the body counts as synced (and the message may be accepted) only then. A crash
before that leaves rows no record refers to: `remove_orphans` deletes them at the next
start. Deletions are fenced too, so a broker that lost its lock (a failed-over primary)
never deletes a body its backup now serves.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import structlog

from scow.core.large_messages import (
    READ_CHUNK,
    Arrival,
    Chunks,
    LargeBody,
    LargeMessageStore,
    Wake,
)
from scow.plugins.database_store import database
from scow.plugins.database_store.schema import insert_rows
from scow.plugins.database_store.settings import DatabaseError, DatabaseSettings, resolve

log = structlog.get_logger("scow.database")

#: Bytes per row: a delivery's read of a whole row is one piece of the body it streams.
CHUNK = READ_CHUNK
#: Bytes an arrival may have waiting for the database before its socket waits.
BEHIND = 8 << 20
#: Threads writing and deleting bodies (a body always on the same one).
LANES = 2
#: Threads reading bodies for deliveries, and the chunks each delivery reads ahead.
READERS = 2
READ_AHEAD = 4
#: Ids per DELETE when orphans are removed.
DELETE_BATCH = 500


class DatabaseArrival(Arrival):
    """A large message arriving into rows of the table, a chunk at a time."""

    __slots__ = ("_behind", "_buffer", "_chunk", "_failed", "_lock", "_wake")

    store: DatabaseLargeMessageStore

    def __init__(self, store: DatabaseLargeMessageStore, file_id: int) -> None:
        super().__init__(store, file_id)
        self._buffer = bytearray()
        self._chunk = 0
        #: Bytes handed to the lane and not written yet; `_wake` waits for them to drop.
        self._behind = 0
        self._wake: Wake | None = None
        self._failed = False
        self._lock = threading.Lock()

    def write(self, chunk: bytes | memoryview) -> None:
        self._buffer += chunk
        self.written += len(chunk)
        while len(self._buffer) >= CHUNK:
            piece = bytes(self._buffer[:CHUNK])
            del self._buffer[:CHUNK]
            self._send(piece, None)

    def _send(self, piece: bytes, sync: bool | None) -> None:
        """Hand the next chunk to the lane; `sync` not None: the last one (see _write)."""
        number = self._chunk
        self._chunk += 1
        with self._lock:
            self._behind += len(piece)
        self.store.submit(self.file_id, self._write, number, piece, sync)

    def _write(self, number: int, piece: bytes, sync: bool | None) -> None:
        try:
            if not self._failed:
                self.store.write_chunk(self.file_id, number, piece, sync)
        except (DatabaseError, sa.exc.SQLAlchemyError) as exc:
            # never synced, so never accepted; the rows go as orphans at the next start
            self._failed = True
            log.error("large message not stored", body=self.file_id, reason=str(exc))
        with self._lock:
            self._behind -= len(piece)
            wake = self._wake if self._behind <= BEHIND // 2 or self._failed else None
            if wake is not None:
                self._wake = None
        if wake is not None:
            self.store.call_on_loop(wake)

    def room(self, wake: Wake) -> bool:
        with self._lock:
            if self._behind <= BEHIND:
                return True
            self._wake = wake
            return False

    def _finish(self, body: LargeBody, sync: bool) -> None:
        body.synced = False  # also when not to be synced: its rows are not all there yet
        piece, self._buffer = bytes(self._buffer), bytearray()
        self._send(piece, sync)

        def written() -> None:
            if not self._failed:
                self.store.call_on_loop(body._now_synced)

        self.store.submit(self.file_id, written)

    def _discard(self) -> None:
        self._buffer = bytearray()
        self.store.submit(self.file_id, self.store.delete_rows, [self.file_id])


class _Prefetch:
    """A delivery's reads of a body, READ_AHEAD chunks ahead, on the reader threads.

    Iterated on the event loop: `b""` when the next piece has not been read yet (`wake`
    runs once it has), StopIteration at the end, OSError when the rows are short.
    """

    def __init__(
        self, store: DatabaseLargeMessageStore, body: LargeBody, start: int, wake: Wake
    ) -> None:
        self.store = store
        self.body = body
        self.wake = wake
        self.loop = asyncio.get_running_loop()
        self.ready: deque[bytes] = deque()
        #: The next chunk to read, and the offset in the message its first piece starts at.
        self.next_chunk = start // CHUNK
        self.position = start
        self.reading: Future[list[bytes]] | None = None
        self.waiting_sync = False
        self.error: OSError | None = None
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self.error is not None:
            raise self.error
        if self.ready:
            piece = self.ready.popleft()
            self._read_more()
            return piece
        if self.position >= self.body.length:
            raise StopIteration
        self._read_more()
        return b""

    def _read_more(self) -> None:
        if (
            self.reading is not None
            or self.closed
            or self.position >= self.body.length
            or len(self.ready) >= READ_AHEAD
        ):
            return
        if not self.body.synced:  # still arriving: its rows are not all written yet
            if not self.waiting_sync:
                self.waiting_sync = True
                self.body.when_synced(self._synced)
            return
        count = READ_AHEAD - len(self.ready)
        self.reading = self.store.reader().submit(
            self.store.fetch, self.body.file_id, self.next_chunk, count
        )
        self.reading.add_done_callback(
            lambda future: self.loop.call_soon_threadsafe(self._arrived, future)
        )

    def _synced(self) -> None:
        self.waiting_sync = False
        self._read_more()

    def _arrived(self, future: Future[list[bytes]]) -> None:
        self.reading = None
        if self.closed:
            return
        try:
            rows = future.result()
            if not rows:
                raise OSError(
                    f"large message {self.store.describe(self.body.file_id)}: ends at "
                    f"{self.position} of {self.body.length} bytes"
                )
        except OSError as exc:
            self.error = exc
        else:
            for data in rows:
                skip = self.position - self.next_chunk * CHUNK
                piece = data[skip : self.body.length - self.next_chunk * CHUNK]
                self.next_chunk += 1
                if piece:
                    self.position += len(piece)
                    self.ready.append(piece)
        self.wake()

    def close(self) -> None:
        self.closed = True
        self.ready.clear()


class DatabaseLargeMessageStore(LargeMessageStore):
    """The large message bodies of one broker, rows of its `large-message-table-name`."""

    def __init__(self, settings: DatabaseSettings, *, sync: bool) -> None:
        super().__init__(sync=sync)
        self.settings = settings
        self.db: database.Database | None = None
        #: Bytes stored per body id, as found at `open` (the bodies recovered records
        #: may refer to); after `remove_orphans`, only those kept.
        self._stored: dict[int, int] = {}
        self._lanes: list[ThreadPoolExecutor] = []
        self._reader: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def _table(self) -> sa.Table:
        assert self.db is not None, "DatabaseLargeMessageStore used before open()"
        return self.db.schema.large_messages

    def describe(self, file_id: int) -> str:
        return f"body {file_id} in table {self.settings.tables.large_messages}"

    # ------------------------------------------------------------------ threads

    def open(self) -> None:
        self.db = database.acquire(self.settings)
        t = self._table.c
        query = sa.select(t.id, sa.func.sum(sa.func.length(t.data))).group_by(t.id)
        rows = self.db.run("reading the large message table", lambda c: c.execute(query).all())
        self._stored = {int(file_id): int(size) for file_id, size in rows}

    def submit(self, file_id: int, work: Callable[..., None], *args: Any) -> None:
        """Run `work(*args)` on the lane of body `file_id` (in place without an event
        loop: an offline tool)."""
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            work(*args)
            return
        if not self._lanes:
            self._lanes = [
                ThreadPoolExecutor(1, thread_name_prefix=f"scow-db-large-{n}") for n in range(LANES)
            ]
        self._lanes[file_id % LANES].submit(work, *args)

    def call_on_loop(self, then: Callable[[], None]) -> None:
        """`then()` on the event loop (at once without one)."""
        if self._loop is None:
            then()
        else:
            self._loop.call_soon_threadsafe(then)

    def reader(self) -> ThreadPoolExecutor:
        if self._reader is None:
            self._reader = ThreadPoolExecutor(READERS, thread_name_prefix="scow-db-large-read")
        return self._reader

    # ------------------------------------------------------------------ on the threads

    def write_chunk(self, file_id: int, number: int, data: bytes, sync: bool | None) -> None:
        """Insert one chunk; `sync` None: not the last (committed without waiting for
        the disk), else the last, fenced and committed synchronously when `sync`."""
        assert self.db is not None
        db = self.db
        row = {"id": file_id, "chunk": number, "data": data}

        def write(conn: sa.Connection) -> None:
            if not sync and conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            if data:
                insert_rows(conn, self._table, [row], copy=True)
            if sync is not None:
                db.fence(conn)

        db.run(f"storing large message {self.describe(file_id)}", write)

    def delete_rows(self, file_ids: list[int]) -> None:
        assert self.db is not None
        db = self.db
        t = self._table.c

        def delete(conn: sa.Connection) -> None:
            conn.execute(sa.delete(self._table).where(t.id.in_(file_ids)))
            db.fence(conn)

        try:
            db.run(f"deleting large message bodies {file_ids[:3]}", delete)
        except (DatabaseError, sa.exc.SQLAlchemyError) as exc:  # orphans at the next start
            log.warning("large message body not deleted", bodies=file_ids[:3], reason=str(exc))

    def fetch(self, file_id: int, first: int, count: int) -> list[bytes]:
        """Chunks `first` to `first + count - 1` of a body (fewer at its end); OSError
        when the database cannot be read."""
        assert self.db is not None
        t = self._table.c
        query = (
            sa.select(t.chunk, t.data)
            .where(t.id == file_id, t.chunk >= first, t.chunk < first + count)
            .order_by(t.chunk)
        )
        try:
            rows = self.db.run(
                f"reading large message {self.describe(file_id)}",
                lambda conn: conn.execute(query).all(),
                read=True,
            )
        except (DatabaseError, sa.exc.SQLAlchemyError) as exc:
            raise OSError(str(exc)) from None
        out: list[bytes] = []
        for number, data in rows:
            if number != first + len(out):  # a gap: the body is not whole
                break
            out.append(bytes(data))
        return out

    # ------------------------------------------------------------------ the backend's

    def begin(self, file_id: int) -> DatabaseArrival:
        return DatabaseArrival(self, file_id)

    def read(self, body: LargeBody, start: int, wake: Wake | None) -> Chunks:
        if wake is not None:
            return _Prefetch(self, body, start, wake)
        return self._read_now(body, start)

    def _read_now(self, body: LargeBody, start: int) -> Iterator[bytes]:
        position = start
        while position < body.length:
            first = position // CHUNK
            rows = self.fetch(body.file_id, first, READ_AHEAD)
            if not rows:
                raise OSError(
                    f"large message {self.describe(body.file_id)}: ends at {position} of "
                    f"{body.length} bytes"
                )
            for number, data in enumerate(rows, start=first):
                piece = data[position - number * CHUNK : body.length - number * CHUNK]
                position += len(piece)
                yield piece

    def _found(self, file_id: int, length: int) -> bool:
        return self._stored.get(file_id, -1) >= length

    def _delete(self, body: LargeBody) -> None:
        self._stored.pop(body.file_id, None)
        self.submit(body.file_id, self.delete_rows, [body.file_id])

    def _delete_all_but(self, kept: set[int]) -> int:
        orphans = [file_id for file_id in self._stored if file_id not in kept]
        for start in range(0, len(orphans), DELETE_BATCH):
            self.delete_rows(orphans[start : start + DELETE_BATCH])
        self._stored = {k: v for k, v in self._stored.items() if k in kept}
        return len(orphans)

    def close(self) -> None:
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            lane.shutdown(wait=True)
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        if self.db is not None:
            db, self.db = self.db, None
            database.release(db)


def open_store(
    data_dir: Path, settings: Mapping[str, Any], sync: bool
) -> DatabaseLargeMessageStore:
    """The large message store factory: `settings` is the `[database]` section."""
    return DatabaseLargeMessageStore(resolve(settings, data_dir), sync=sync)
