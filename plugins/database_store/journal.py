"""`DatabaseJournal`: the `Journal` as rows of a SQL table, written by group commit.

Threads:

* the caller (the broker's event loop) appends: a tuple into a list under a lock,
  nothing that touches the database;
* the writer thread takes everything appended so far and writes it in one database
  transaction (many producers' records, one commit), then hands every completion of the
  batch to the dispatcher in one call. While the database is unreachable it retries the
  same batch with backoff; nothing in it was confirmed, so nothing confirmed is lost.

A batch is planned before it is written: a delete drops the rows of its record that the
same batch would insert (a message sent and acknowledged within one batch costs no
statement at all), a replaceable update drops the earlier ones of its type. The plan runs
deletes first and inserts last, so each statement can cover many records (`IN` lists and
executemany). Every row gets its `seq` here, which is what makes a retry after an unknown
commit outcome safe: the batch is in if its last `seq` is.

Transactions are kept in memory until they are decided; `prepare` writes their records
with their `tx_id` (so they survive a restart undecided) and `commit` rewrites them as
committed records at the commit's place in the journal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa
import structlog

from scow.core.interfaces import Completion, LoadResult, PreparedTransaction, RecordInfo
from scow.plugins.database_store import database
from scow.plugins.database_store.schema import (
    ADD,
    DELETE_TX,
    PREPARE,
    UPDATE,
    UPDATE_REPLACEABLE,
    insert_rows,
)
from scow.plugins.database_store.settings import DatabaseError, DatabaseSettings

log = structlog.get_logger("scow.database")

#: Ids per DELETE ... IN (...) statement (SQLite allows 32766 parameters; keep it modest).
IN_CHUNK = 500

# ops, as the caller appends them
_ROW = 0  # (_ROW, id, kind, type, data, tx_id)
_DEL = 1  # (_DEL, id): a committed record and its updates go
_DELTX = 2  # (_DELTX, tx_id): a prepared transaction's rows go

_NEW, _OPEN, _CLOSING, _STOPPED = 0, 1, 2, 3


class JournalError(DatabaseError):
    """The journal cannot take more records (stopped, or its database is gone for good)."""


def _run_completions(completions: list[Completion]) -> None:
    for completion in completions:
        completion()


class _Plan:
    """What one batch does to the table, in the order it does it."""

    __slots__ = ("deletes", "first_seq", "last_seq", "replaced", "rows", "tx_deletes")

    def __init__(self, ops: Iterable[tuple[Any, ...]], first_seq: int) -> None:
        rows: list[dict[str, Any] | None] = []
        committed: dict[int, list[int]] = {}  # id -> indexes in rows (tx_id None)
        prepared: dict[int, list[int]] = {}  # tx_id -> indexes in rows
        latest: dict[tuple[int, int], int] = {}  # (id, type) -> its replaceable row
        added: set[int] = set()
        self.replaced: set[tuple[int, int]] = set()
        self.deletes: list[int] = []
        self.tx_deletes: list[int] = []
        for op in ops:
            if op[0] == _ROW:
                _, rid, kind, rtype, data, tx_id = op
                index = len(rows)
                if tx_id is None:
                    if kind == UPDATE_REPLACEABLE:
                        earlier = latest.get((rid, rtype))
                        if earlier is not None:
                            rows[earlier] = None
                        latest[rid, rtype] = index
                        self.replaced.add((rid, rtype))
                    elif kind == ADD:
                        added.add(rid)
                    committed.setdefault(rid, []).append(index)
                else:
                    prepared.setdefault(tx_id, []).append(index)
                rows.append(
                    {"id": rid, "kind": kind, "record_type": rtype, "tx_id": tx_id, "data": data}
                )
            elif op[0] == _DEL:
                rid = op[1]
                for index in committed.pop(rid, ()):
                    rows[index] = None
                if rid in added:
                    added.discard(rid)  # never written: nothing to delete
                else:
                    self.deletes.append(rid)
            else:
                for index in prepared.pop(op[1], ()):
                    rows[index] = None
                self.tx_deletes.append(op[1])
        self.rows = [row for row in rows if row is not None]
        self.first_seq = first_seq
        for seq, row in enumerate(self.rows, start=first_seq):
            row["seq"] = seq
        self.last_seq = first_seq + len(self.rows) - 1

    def execute(self, conn: sa.Connection, table: sa.Table) -> None:
        c = table.c
        if self.replaced:
            conn.execute(
                sa.delete(table).where(
                    c.id == sa.bindparam("rid"),
                    c.record_type == sa.bindparam("rtype"),
                    c.kind == UPDATE_REPLACEABLE,
                    c.tx_id.is_(None),
                    c.seq < self.first_seq,  # a retried batch keeps its own rows
                ),
                [{"rid": rid, "rtype": rtype} for rid, rtype in self.replaced],
            )
        for start in range(0, len(self.deletes), IN_CHUNK):
            ids = self.deletes[start : start + IN_CHUNK]
            conn.execute(sa.delete(table).where(c.id.in_(ids), c.tx_id.is_(None)))
        if self.tx_deletes:
            conn.execute(sa.delete(table).where(c.tx_id.in_(self.tx_deletes)))
        if self.rows:
            insert_rows(conn, table, self.rows)


#: Operations waiting for the writer past which producers are held back.
MAX_WAITING = 10_000


class DatabaseJournal:
    """The bindings or message journal of one broker, in a table of its database."""

    def __init__(self, settings: DatabaseSettings, kind: str) -> None:
        self.kind = kind
        self.db = database.acquire(settings)
        self.table = self.db.schema.journal(kind)
        self._dispatch: Callable[[list[Completion]], None] = _run_completions
        self._cond = threading.Condition()
        self._ops: list[tuple[Any, ...]] = []
        self._completions: list[Completion] = []
        #: Told True once MAX_WAITING operations wait for the writer (a database whose
        #: commits stall), False once it takes them: producers wait meanwhile.
        self._on_backlog: Callable[[bool], None] | None = None
        self._holding = False
        self._submitted = 0  # appends so far
        self._written = 0  # appends whose batch is written and dispatched
        self._state = _NEW
        self._failure: BaseException | None = None
        self._txs: dict[int, list[tuple[int, int, int, bytes]]] = {}
        self._prepared: set[int] = set()
        self._seq = 1
        self._thread: threading.Thread | None = None
        self._give_up_at = float("inf")
        #: Instrumentation: batches written and rows inserted.
        self.batches = 0
        self.rows_written = 0

    def set_dispatcher(self, dispatch: Callable[[list[Completion]], None]) -> None:
        self._dispatch = dispatch

    def hold_producers(self, on_backlog: Callable[[bool], None]) -> None:
        """`on_backlog(True)` once MAX_WAITING operations wait for the writer, False once
        it has taken them; called with the journal's lock held (hand it to the loop)."""
        self._on_backlog = on_backlog

    # ------------------------------------------------------------------ recovery

    def load(self) -> LoadResult:
        if self._state != _NEW:
            raise JournalError(f"{self.table.name}: load() runs once, before any append")
        result = self.db.run(f"loading {self.table.name}", self._read, read=True)
        self._thread = threading.Thread(target=self._run, name=f"scow-db-{self.kind}", daemon=True)
        self._state = _OPEN
        self._thread.start()
        return result

    def _read(self, conn: sa.Connection) -> LoadResult:
        c = self.table.c
        rows = conn.execution_options(stream_results=True, yield_per=10_000).execute(
            sa.select(c.seq, c.id, c.kind, c.record_type, c.tx_id, c.data).order_by(c.seq)
        )
        entries: list[RecordInfo | None] = []
        live: dict[int, list[int]] = {}
        latest: dict[tuple[int, int], int] = {}
        prepared: dict[int, PreparedTransaction] = {}
        txs: dict[int, list[tuple[int, int, int, bytes]]] = {}
        max_id = last_seq = 0
        for seq, rid, kind, rtype, tx_id, data in rows:
            last_seq = seq
            data = bytes(data)
            max_id = max(max_id, rid)
            if tx_id is not None:
                tx = prepared.get(tx_id)
                if tx is None:
                    tx = prepared[tx_id] = PreparedTransaction(tx_id, b"")
                if kind == PREPARE:
                    tx.data = data
                    continue
                txs.setdefault(tx_id, []).append((kind, rid, rtype, data))
                if kind == DELETE_TX:
                    tx.deletes.append(rid)
                else:
                    tx.records.append(RecordInfo(rid, rtype, data, kind != ADD))
                continue
            if kind == ADD:
                live[rid] = [len(entries)]
                entries.append(RecordInfo(rid, rtype, data))
                continue
            indexes = live.get(rid)
            if indexes is None:
                continue  # an update of a record deleted in its batch
            if kind == UPDATE_REPLACEABLE:
                earlier = latest.get((rid, rtype))
                if earlier is not None:
                    entries[earlier] = None
                latest[rid, rtype] = len(entries)
            indexes.append(len(entries))
            entries.append(RecordInfo(rid, rtype, data, True))
        self._seq = last_seq + 1
        self._txs = txs
        self._prepared = set(prepared)
        return LoadResult(
            records=[e for e in entries if e is not None],
            prepared=list(prepared.values()),
            max_id=max_id,
        )

    # ------------------------------------------------------------------ appends

    def _submit(self, ops: list[tuple[Any, ...]], on_done: Completion | None) -> None:
        with self._cond:
            if self._state != _OPEN:
                raise JournalError(f"journal {self.table.name} is not open")
            if self._failure is not None:
                raise JournalError(f"journal {self.table.name} failed: {self._failure}")
            self._ops += ops
            if on_done is not None:
                self._completions.append(on_done)
            self._submitted += 1
            self._cond.notify()
            if len(self._ops) >= MAX_WAITING and not self._holding and self._on_backlog:
                self._holding = True
                log.warning(
                    "database journal behind: producers held until it catches up",
                    table=self.table.name,
                    waiting=len(self._ops),
                )
                self._on_backlog(True)

    def append_add(
        self,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        sync: bool,
        on_done: Completion | None = None,
    ) -> None:
        self._submit([(_ROW, record_id, ADD, record_type, data, None)], on_done)

    def append_update(
        self,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        sync: bool,
        on_done: Completion | None = None,
        replaceable: bool = False,
    ) -> None:
        kind = UPDATE_REPLACEABLE if replaceable else UPDATE
        self._submit([(_ROW, record_id, kind, record_type, data, None)], on_done)

    def append_delete(
        self, record_id: int, *, sync: bool, on_done: Completion | None = None
    ) -> None:
        self._submit([(_DEL, record_id)], on_done)

    def _tx_op(self, tx_id: int, op: tuple[int, int, int, bytes]) -> None:
        with self._cond:
            self._txs.setdefault(tx_id, []).append(op)

    def append_add_tx(self, tx_id: int, record_id: int, record_type: int, data: bytes) -> None:
        self._tx_op(tx_id, (ADD, record_id, record_type, data))

    def append_update_tx(self, tx_id: int, record_id: int, record_type: int, data: bytes) -> None:
        self._tx_op(tx_id, (UPDATE, record_id, record_type, data))

    def append_delete_tx(self, tx_id: int, record_id: int) -> None:
        self._tx_op(tx_id, (DELETE_TX, record_id, 0, b""))

    def prepare(
        self, tx_id: int, data: bytes, *, sync: bool, on_done: Completion | None = None
    ) -> None:
        with self._cond:
            ops = [
                (_ROW, rid, kind, rtype, d, tx_id)
                for kind, rid, rtype, d in self._txs.get(tx_id, ())
            ]
            self._prepared.add(tx_id)
        ops.append((_ROW, tx_id, PREPARE, 0, data, tx_id))
        self._submit(ops, on_done)

    def commit(self, tx_id: int, *, sync: bool, on_done: Completion | None = None) -> None:
        with self._cond:
            records = self._txs.pop(tx_id, [])
            ops: list[tuple[Any, ...]] = []
            if tx_id in self._prepared:
                self._prepared.discard(tx_id)
                ops.append((_DELTX, tx_id))
        for kind, rid, rtype, data in records:
            if kind == DELETE_TX:
                ops.append((_DEL, rid))
            else:
                ops.append((_ROW, rid, kind, rtype, data, None))
        self._submit(ops, on_done)

    def rollback(self, tx_id: int, *, sync: bool, on_done: Completion | None = None) -> None:
        with self._cond:
            self._txs.pop(tx_id, None)
            ops: list[tuple[Any, ...]] = []
            if tx_id in self._prepared:
                self._prepared.discard(tx_id)
                ops.append((_DELTX, tx_id))
        self._submit(ops, on_done)

    # ------------------------------------------------------------------ the writer

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._submitted > self._written and self._state == _OPEN:
                    self._cond.wait()
                if not self._submitted > self._written:
                    return  # closing, and everything is written
                ops, self._ops = self._ops, []
                completions, self._completions = self._completions, []
                taken = self._submitted
                if self._holding:
                    self._holding = False
                    log.info("database journal caught up: producers resume", table=self.table.name)
                    self._on_backlog(False)  # type: ignore[misc]
            try:
                if ops:
                    self._write(ops)
            except BaseException as error:  # the journal is unusable from here on
                log.critical(
                    "database journal write failed; nothing more is written",
                    table=self.table.name,
                    error=str(error),
                    unconfirmed=len(completions),
                )
                with self._cond:
                    self._failure = error
                    self._written = taken
                    self._cond.notify_all()
                return
            if completions:
                self._dispatch(completions)
            with self._cond:
                self._written = taken
                self._cond.notify_all()

    def _write(self, ops: list[tuple[Any, ...]]) -> None:
        plan = _Plan(ops, self._seq)
        self._seq = plan.last_seq + 1
        table = self.table
        attempts = 0

        def work(conn: sa.Connection) -> None:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and plan.rows and self._written_already(conn, plan.last_seq):
                return  # the last attempt committed, but its answer was lost
            plan.execute(conn, table)
            # last before the commit: the lock row is locked only from here, so a session cut
            # off in the middle of the write does not hold it (a cut after this leaves it idle
            # in its transaction, which the server ends after jdbc-lock-expiration)
            self.db.fence(conn)

        self.db.run(f"writing {table.name}", work, give_up=self._giving_up)
        self.batches += 1
        self.rows_written += len(plan.rows)

    def _written_already(self, conn: sa.Connection, seq: int) -> bool:
        c = self.table.c
        return conn.execute(sa.select(c.seq).where(c.seq == seq)).first() is not None

    def _giving_up(self) -> bool:
        return time.monotonic() > self._give_up_at

    # ------------------------------------------------------------------ flush and stop

    def flush(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                f"journal {self.table.name}: flush() from a completion would deadlock "
                "(the writer thread runs completions)"
            )
        with self._cond:
            target = self._submitted
            self._cond.wait_for(lambda: self._written >= target or self._thread is None)
            if self._failure is not None:
                raise JournalError(f"journal {self.table.name} failed: {self._failure}")

    def stop(self) -> None:
        with self._cond:
            if self._state in (_CLOSING, _STOPPED):
                return
            started = self._state == _OPEN
            self._state = _CLOSING
            # at shutdown, an unreachable database is retried this long, then given up
            # (what was not written was not confirmed either)
            self._give_up_at = time.monotonic() + self.db.settings.network_timeout_ms / 1000
            self._cond.notify_all()
        if started and self._thread is not None:
            self._thread.join()
        self._state = _STOPPED
        database.release(self.db)
