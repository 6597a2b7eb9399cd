"""`DatabaseLargeMessageStore`: large message bodies as rows of a table, in chunks.

Artemis's `LARGE_MESSAGES` table, as chunked rows: (id, chunk number, up to CHUNK bytes),
so that a body is written as its frames arrive and read as a delivery needs it, never
whole in memory, on SQLite and PostgreSQL alike. All database work runs on the store's
threads, never on the event loop: an arrival hands each full chunk to its *lane* (one
thread, chosen by the body's id, so a body's writes, its completion and its deletion
run in order) and every link stops reading its socket while more than BEHIND bytes wait
for the lanes (`room`); a delivery reads READ_AHEAD chunks ahead on the reader
threads (`_Prefetch`). An offline tool (`scow data import`) writes in place, and
checks each body whole at its end as the syncer does (`check_whole`).

Chunks commit as they are written, on PostgreSQL without waiting for the WAL's flush.
Once a durable message's last row is in (with `large-message-sync`), the syncer thread's
next fenced synchronous commit checks that every body that waited meanwhile has all its
bytes and flushes the WAL of every row before it: the body counts as stored (`when_stored`
answers, and the message is routed) only then. The check is what makes a retry after a
lost connection safe: a server that crashed loses the rows it had not flushed, and a
body found short is refused, never accepted without them.

A body the database cannot take is refused, never waited on for ever: its rows' writes
and its sync retry a lost database for `jdbc-network-timeout`, then give up, and
`when_stored` answers why. Its rows are deleted by the cleaner thread, which keeps trying
until the database is back (or, if the broker stops first, `remove_orphans` at the next
start), on a thread of its own so that a deletion waiting for the database holds no lane.
Deletions are fenced, so a broker that lost its lock (a failed-over primary) never
deletes a body its backup now serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, TypeVar

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
from scow.plugins.database_store.settings import DatabaseError, DatabaseSettings, resolve

log = structlog.get_logger("scow.database")

#: Bytes per row: a delivery's read of a whole row is one piece of the body it streams.
CHUNK = READ_CHUNK
#: Bytes the arrivals may have waiting for the lanes before their sockets wait.
BEHIND = 8 << 20
#: Threads writing and deleting bodies (a body always on the same one).
LANES = 2
#: Threads reading bodies for deliveries, and the chunks each delivery reads ahead.
READERS = 2
READ_AHEAD = 4
#: Ids per DELETE when orphans are removed.
DELETE_BATCH = 500

T = TypeVar("T")


class DatabaseArrival(Arrival):
    """A large message arriving into rows of the table, a chunk at a time."""

    __slots__ = ("_after_sync", "_buffer", "_chunk", "_error", "_lock", "_syncing")

    store: DatabaseLargeMessageStore

    def __init__(self, store: DatabaseLargeMessageStore, file_id: int) -> None:
        super().__init__(store, file_id)
        self._buffer = bytearray()
        self._chunk = 0
        #: Why the database refused this message's rows or their sync, if it did.
        self._error: str | None = None
        #: Its rows wait for the syncer, and the `when_stored` answers waiting for it;
        #: the lane and the syncer's thread both change them.
        self._syncing = False
        self._after_sync: list[Callable[[str | None], None]] = []
        self._lock = threading.Lock()

    def write(self, chunk: bytes | memoryview) -> None:
        self._check()
        self._buffer += chunk
        self.written += len(chunk)
        while len(self._buffer) >= CHUNK:
            piece = bytes(self._buffer[:CHUNK])
            del self._buffer[:CHUNK]
            self._send(piece)

    def _check(self) -> None:
        """Raise OSError once the database has refused a row: the caller abandons."""
        if self._error is not None:
            raise OSError(self._error)

    def overwrite(self, offset: int, data: bytes) -> None:
        self._check()
        sent = self._chunk * CHUNK  # bytes handed to the lane; the rest is in the buffer
        if offset + len(data) > sent:
            cut = max(sent - offset, 0)
            at = offset + cut - sent
            self._buffer[at : at + len(data) - cut] = data[cut:]
            data = data[:cut]
        while data:  # rows handed on already: rewritten on the lane, after their insert
            number, at = divmod(offset, CHUNK)
            piece = data[: CHUNK - at]
            self.store.submit(self.file_id, self._rewrite, number, at, piece)
            offset += len(piece)
            data = data[len(piece) :]

    def _send(self, piece: bytes) -> None:
        """Hand the next chunk to the lane."""
        number = self._chunk
        self._chunk += 1
        self.store.behind(len(piece))
        self.store.submit(self.file_id, self._write, number, piece)

    def _write(self, number: int, piece: bytes) -> None:
        try:
            if self._error is None and piece:
                self.store.write_chunk(self.file_id, number, piece)
        except (DatabaseError, sa.exc.SQLAlchemyError) as exc:
            self._failed(exc)
        finally:
            self.store.behind(-len(piece))

    def _rewrite(self, number: int, at: int, piece: bytes) -> None:
        try:
            if self._error is None:
                self.store.rewrite_chunk(self.file_id, number, at, piece)
        except (DatabaseError, sa.exc.SQLAlchemyError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        # never synced, so never accepted: its owner hears of it at its next write or
        # from `when_stored`, and abandons it (its rows go, see `clean`)
        self._error = _first_line(exc)
        log.error("large message not stored", body=self.file_id, reason=str(exc))

    def room(self, wake: Wake) -> bool:
        return self.store.room(wake)

    def when_stored(self, then: Callable[[str | None], None]) -> None:
        """See `Arrival.when_stored`; a message completed with `sync` is stored once the
        syncer has checked and flushed its rows (a failed sync refuses it)."""

        def answer() -> None:  # on the lane: every write handed on before is done
            with self._lock:
                if self._syncing:
                    self._after_sync.append(then)
                    return
                error = self._error
            self.store.call_on_loop(lambda: then(error))

        self.store.submit(self.file_id, answer)

    def _finish(self, body: LargeBody, sync: bool) -> None:
        body.synced = False  # also when not to be synced: its rows are not all there yet
        piece, self._buffer = bytes(self._buffer), bytearray()
        self._send(piece)
        if not self.store.on_loop():  # an offline tool's (an import): every row is in
            self.store.check_whole(body, self._error)
            return

        def written() -> None:
            if self._error is not None:
                return
            if sync:
                with self._lock:
                    self._syncing = True
            self.store.written(body, sync, self)

        self.store.submit(self.file_id, written)

    def synced(self, error: str | None) -> None:
        """The syncer's outcome for this message's rows (on its thread): None, or why
        they could not be synced; `when_stored` answers with it."""
        with self._lock:
            self._syncing = False
            if error is not None:
                self._error = error
            waiting, self._after_sync = self._after_sync, []
        for then in waiting:
            self.store.call_on_loop(functools.partial(then, error))

    def _discard(self) -> None:
        self._buffer = bytearray()
        self.store.submit(self.file_id, self.store.clean, self.file_id)


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


class _Batches(Generic[T]):
    """A thread of the store's that handles what is added, in batches of what waits (at
    most `most` items, or all)."""

    def __init__(
        self, name: str, handle: Callable[[list[T]], None], most: int | None = None
    ) -> None:
        self.handle = handle
        self.most = most
        self.pending: list[T] = []
        self.changed = threading.Condition()
        self.closing = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def add(self, item: T) -> None:
        with self.changed:
            self.pending.append(item)
            self.changed.notify()

    def _run(self) -> None:
        while True:
            with self.changed:
                while not self.pending and not self.closing:
                    self.changed.wait()
                if not self.pending:
                    return
                cut = len(self.pending) if self.most is None else self.most
                batch, self.pending = self.pending[:cut], self.pending[cut:]
            self.handle(batch)

    def close(self) -> None:
        """Handle what is pending, then stop."""
        with self.changed:
            self.closing = True
            self.changed.notify()
        self.thread.join()


def _short(body: LargeBody, stored: Mapping[int, int]) -> str | None:
    """Why `body` is not whole in the database by a sync's count of its bytes (`stored`,
    by body id), or None when it is."""
    found = stored.get(body.file_id, 0)
    if found == body.length:
        return None
    return (
        f"{found} of its {body.length} bytes were in the database at its sync "
        "(rows lost with a connection or a server restart)"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def _driver_errors(conn: sa.Connection, statement: str) -> Iterator[None]:
    """A raw cursor's errors as SQLAlchemy's (it does not wrap them), so that
    `Database.run` retries a lost connection and the callers' handlers see them: a
    refused row must fail its message, never vanish on the lane's thread."""
    base = conn.dialect.loaded_dbapi.Error
    try:
        yield
    except base as error:
        raise sa.exc.DBAPIError.instance(statement, None, error, base) from None


def _insert_chunk(
    conn: sa.Connection, table: sa.Table, file_id: int, number: int, data: bytes
) -> None:
    """Insert one row of a body; on psycopg with its bytes as a binary parameter (not
    escaped, not hex: measured faster than a one-row binary COPY)."""
    if conn.dialect.driver == "psycopg":
        name = conn.dialect.identifier_preparer.format_table(table)
        statement = f"INSERT INTO {name} (id, chunk, data) VALUES (%s, %s, %b)"
        with (
            _driver_errors(conn, statement),
            conn.connection.driver_connection.cursor() as cursor,  # type: ignore[union-attr]
        ):
            cursor.execute(statement, (file_id, number, data))
        return
    conn.execute(sa.insert(table).values(id=file_id, chunk=number, data=data))


def _select_chunks(
    conn: sa.Connection, table: sa.Table, file_id: int, first: int, count: int
) -> list[tuple[int, bytes]]:
    """Rows (chunk, data) of a body from chunk `first` on, at most `count`.

    On psycopg in binary: in text, a bytea travels as hex, twice its size, and is decoded.
    """
    if conn.dialect.driver == "psycopg":
        name = conn.dialect.identifier_preparer.format_table(table)
        statement = (
            f"SELECT chunk, data FROM {name} WHERE id = %s AND chunk >= %s AND chunk < %s "
            "ORDER BY chunk"
        )
        cursor: Any
        with (
            _driver_errors(conn, statement),
            conn.connection.driver_connection.cursor(binary=True) as cursor,  # type: ignore[union-attr]
        ):
            cursor.execute(statement, (file_id, first, first + count))
            return [(int(n), bytes(data)) for n, data in cursor.fetchall()]
    t = table.c
    query = (
        sa.select(t.chunk, t.data)
        .where(t.id == file_id, t.chunk >= first, t.chunk < first + count)
        .order_by(t.chunk)
    )
    return [(int(n), bytes(data)) for n, data in conn.execute(query).all()]


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
        #: Flushes the rows of bodies that wait for it together, and checks them whole
        #: (`_sync`); deletes bodies' rows on a thread of its own, so that a deletion
        #: waiting for a lost database holds no lane (`delete_rows`).
        self._syncer: _Batches[tuple[LargeBody, DatabaseArrival]] | None = None
        self._cleaner: _Batches[int] | None = None
        self._closing = False
        #: Bytes handed to the lanes and not written yet, and the arrivals waiting for
        #: them to drop (`room`).
        self._behind = 0
        self._waiting: list[Wake] = []
        self._lock = threading.Lock()

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

    def behind(self, change: int) -> None:
        """`change` more bytes wait for the lanes (fewer, when negative); once they drop
        to half of BEHIND, the arrivals `room` turned away carry on."""
        with self._lock:
            self._behind += change
            if self._behind > BEHIND // 2 or not self._waiting:
                return
            waiting, self._waiting = self._waiting, []
        for wake in waiting:
            self.call_on_loop(wake)

    def room(self, wake: Wake) -> bool:
        """See `Arrival.room`: False while more than BEHIND bytes wait for the lanes."""
        with self._lock:
            if self._behind <= BEHIND:
                return True
            self._waiting.append(wake)
            return False

    def on_loop(self) -> bool:
        """Whether bodies are written on the lanes (for a broker), not in place (for an
        offline tool)."""
        return self._loop is not None

    def check_whole(self, body: LargeBody, error: str | None) -> None:
        """Sync an offline tool's body, written in place, and check it whole as the
        syncer does (`_sync`): OSError when a row was refused (`error`) or the rows hold
        fewer bytes than the body."""
        if error is None:
            try:
                found = self.sync_rows([body.file_id])
            except (DatabaseError, sa.exc.SQLAlchemyError) as exc:
                error = f"its rows could not be synced: {_first_line(exc)}"
            else:
                error = _short(body, found)
                if error is None:
                    body._now_synced()
                    return
        raise OSError(f"large message {self.describe(body.file_id)}: {error}")

    def written(self, body: LargeBody, sync: bool, arrival: DatabaseArrival) -> None:
        """Every row of `body` is committed (on its lane): synced now, or with `sync`
        once a synchronous commit has checked and flushed them (the syncer's, shared by
        the bodies that wait meanwhile), which `arrival` hears of."""
        if not sync:
            self.call_on_loop(body._now_synced)
        else:
            if self._syncer is None:
                self._syncer = _Batches("scow-db-large-sync", self._sync)
            self._syncer.add((body, arrival))

    def _sync(self, batch: list[tuple[LargeBody, DatabaseArrival]]) -> None:
        """Make the bodies whose rows are committed durable together (on the syncer's
        thread): one synchronous commit flushes the WAL of every row committed before it
        (PostgreSQL's group commit, done by hand), so a body costs no disk flush of its
        own; the same transaction checks that each has all its bytes (see the module's
        doc). Each arrival hears its outcome (`DatabaseArrival.synced`)."""
        try:
            stored = self.sync_rows([body.file_id for body, _arrival in batch])
        except (DatabaseError, sa.exc.SQLAlchemyError) as exc:
            reason = f"its rows could not be synced: {_first_line(exc)}"
            log.error("large message bodies not synced", bodies=len(batch), reason=str(exc))
            for _body, arrival in batch:
                arrival.synced(reason)
            return
        for body, arrival in batch:
            reason = _short(body, stored)
            if reason is None:
                self.call_on_loop(body._now_synced)
            else:
                log.error("large message body short", body=body.file_id, reason=reason)
            arrival.synced(reason)

    def sync_rows(self, file_ids: list[int]) -> dict[int, int]:
        """A fenced synchronous commit, which returns the bytes stored of each body in
        `file_ids`: the rows committed before it are on disk (the lanes commit without
        waiting for the WAL's flush). Gives up on a lost database as the lanes do."""
        assert self.db is not None
        db = self.db
        t = self._table.c
        query = (
            sa.select(t.id, sa.func.sum(sa.func.length(t.data)))
            .where(t.id.in_(file_ids))
            .group_by(t.id)
        )

        def sync(conn: sa.Connection) -> dict[int, int]:
            stored = {int(i): int(n) for i, n in conn.execute(query).all()}
            db.fence(conn)
            return stored

        return db.run("syncing large message bodies", sync, give_up=self._give_up())

    def _give_up(self) -> Callable[[], bool]:
        """`Database.run`'s give_up for a body's rows: once the database has been lost for
        jdbc-network-timeout (from the first failure), or the store is closing."""
        limit = self.settings.network_timeout_ms / 1000
        first: float | None = None

        def give_up() -> bool:
            nonlocal first
            now = time.monotonic()
            if first is None:
                first = now
            return self._closing or now - first > limit

        return give_up

    def reader(self) -> ThreadPoolExecutor:
        if self._reader is None:
            self._reader = ThreadPoolExecutor(READERS, thread_name_prefix="scow-db-large-read")
        return self._reader

    # ------------------------------------------------------------------ on the threads

    def write_chunk(self, file_id: int, number: int, data: bytes) -> None:
        """Insert one chunk, committed without waiting for the disk (`sync_rows` does).

        Not fenced: rows a broker that lost its lock writes are orphans no record refers
        to (its journal's fence refuses the record), removed at the next start.
        """
        assert self.db is not None

        def write(conn: sa.Connection) -> None:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
            _insert_chunk(conn, self._table, file_id, number, data)

        self.db.run(
            f"storing large message {self.describe(file_id)}", write, give_up=self._give_up()
        )

    def rewrite_chunk(self, file_id: int, number: int, at: int, data: bytes) -> None:
        """Write `data` over a chunk's bytes from `at` on (a size learnt at the end)."""
        assert self.db is not None
        t = self._table.c
        row = (t.id == file_id) & (t.chunk == number)

        def rewrite(conn: sa.Connection) -> None:
            old = bytes(conn.execute(sa.select(t.data).where(row)).scalar_one())
            new = old[:at] + data + old[at + len(data) :]
            conn.execute(sa.update(self._table).where(row).values(data=new))

        self.db.run(
            f"storing large message {self.describe(file_id)}", rewrite, give_up=self._give_up()
        )

    def clean(self, file_id: int) -> None:
        """Delete a body's rows once every write handed on before is done (on its lane):
        by the cleaner, or here without an event loop (an offline tool)."""
        if self._loop is None:
            self.delete_rows([file_id])
            return
        if self._cleaner is None:
            self._cleaner = _Batches("scow-db-large-clean", self._clean, most=DELETE_BATCH)
        self._cleaner.add(file_id)

    def _clean(self, file_ids: list[int]) -> None:
        # until the database is back, or the broker stops (orphans at the next start)
        self.delete_rows(file_ids, give_up=lambda: self._closing)

    def delete_rows(self, file_ids: list[int], give_up: Callable[[], bool] | None = None) -> None:
        """Delete these bodies' rows, retrying a lost database until `give_up()` says to
        stop (never by default); a body not deleted is an orphan the next start removes."""
        assert self.db is not None
        db = self.db
        t = self._table.c

        def delete(conn: sa.Connection) -> None:
            conn.execute(sa.delete(self._table).where(t.id.in_(file_ids)))
            db.fence(conn)

        try:
            db.run("deleting large message bodies", delete, give_up=give_up)
        except (DatabaseError, sa.exc.SQLAlchemyError) as exc:  # orphans at the next start
            log.warning("large message body not deleted", bodies=file_ids[:3], reason=str(exc))

    def fetch(self, file_id: int, first: int, count: int) -> list[bytes]:
        """Chunks `first` to `first + count - 1` of a body (fewer at its end); OSError
        when the database cannot be read."""
        assert self.db is not None
        try:
            rows = self.db.run(
                f"reading large message {self.describe(file_id)}",
                lambda conn: _select_chunks(conn, self._table, file_id, first, count),
                read=True,
            )
        except (DatabaseError, sa.exc.SQLAlchemyError) as exc:
            raise OSError(str(exc)) from None
        out: list[bytes] = []
        for number, data in rows:
            if number != first + len(out):  # a gap: the body is not whole
                break
            out.append(data)
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
        self.submit(body.file_id, self.clean, body.file_id)

    def _delete_all_but(self, kept: set[int]) -> int:
        orphans = [file_id for file_id in self._stored if file_id not in kept]
        for start in range(0, len(orphans), DELETE_BATCH):
            self.delete_rows(orphans[start : start + DELETE_BATCH])
        self._stored = {k: v for k, v in self._stored.items() if k in kept}
        return len(orphans)

    def close(self) -> None:
        self._closing = True  # what waits for a lost database gives up
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            lane.shutdown(wait=True)
        if self._syncer is not None:
            self._syncer.close()
            self._syncer = None
        if self._cleaner is not None:
            self._cleaner.close()
            self._cleaner = None
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
