"""One broker's connection to its database: engine, schema, lock row and outages.

A broker's bindings journal, message journal and page stores share one `Database`
(`acquire` / `release` count the users). Opening it connects (a wrong URL, a missing
driver or an unreachable server stops startup naming the URL with its password masked),
creates the tables on first use, refuses a schema newer than `SCHEMA_VERSION`, and takes
the lock row: a second broker on the same tables is refused, naming the holder. A holder
that stopped renewing for `jdbc-lock-expiration`, or whose process is gone from this host,
counts as dead. A renewal thread keeps the lock; every journal batch checks it too
(`fence`), so a broker that lost its lock never writes again. `trouble()` says when the
lock can no longer be relied on: lost, or not renewed for so long that it may expire
before the next renewal (HA steps down then, before another broker may take it).

Work runs through `run`: a transaction that is retried with backoff while the database
cannot be reached; `listen` callbacks hear when the database is lost and back.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy import event, exc

from scow.core.ha import StoreUnreachable
from scow.plugins.database_store.schema import LOCK_ROW, SCHEMA_VERSION, Schema
from scow.plugins.database_store.settings import DatabaseError, DatabaseSettings

log = structlog.get_logger("scow.database")

T = TypeVar("T")
#: Seconds between retries while the database is unreachable: doubling up to the cap.
BACKOFF_START = 0.05
BACKOFF_CAP = 2.0

OutageListener = Callable[[bool, str], None]
#: PostgreSQL's SQLSTATE for a row lock NOWAIT could not take.
LOCK_NOT_AVAILABLE = "55P03"


class LockLost(DatabaseError):
    """Another broker holds this broker's lock row: nothing more may be written."""


class LockHeld(DatabaseError):
    """The lock row is held by another live broker: this one may not open the database."""


class DatabaseUnreachable(DatabaseError, StoreUnreachable):
    """The database could not be reached (no server, no answer in time, busy): try again.

    Not for a server that answered and refused this broker (a wrong password, a missing
    database or role): that needs the configuration changed.
    """


def _now_ms() -> int:
    return int(time.time() * 1000)


def _retryable(error: BaseException) -> bool:
    """A lost or refused connection (or a busy SQLite file): worth trying again."""
    if isinstance(error, (exc.OperationalError, exc.InterfaceError)):
        return True
    return isinstance(error, exc.DBAPIError) and bool(error.connection_invalidated)


#: Connection errors that are a server's refusal, not an outage (psycopg gives no SQLSTATE
#: for a failed connection: its words are all there is).
_REFUSED = re.compile(
    r"authentication failed|no pg_hba\.conf entry|does not exist|unable to open database file",
    re.I,
)


def _unreachable(error: BaseException) -> bool:
    """Not reached, rather than refused: another try later may succeed."""
    return _retryable(error) and not _REFUSED.search(str(getattr(error, "orig", None) or error))


def failure(what: str, error: BaseException) -> DatabaseError:
    """`what` failed because of `error`: DatabaseUnreachable when the database was not
    reached (try again later), DatabaseError otherwise; the message ends with the cause."""
    kind = DatabaseUnreachable if _unreachable(error) else DatabaseError
    return kind(f"{what}: {_cause(error)}")


def _cause(error: BaseException) -> str:
    """The driver's own words, first line, without SQLAlchemy's boilerplate."""
    inner = getattr(error, "orig", None) or error
    text = str(inner).strip().splitlines()
    return text[0] if text else type(inner).__name__


class Database:
    """The engine, schema and lock of one broker's database."""

    def __init__(self, settings: DatabaseSettings) -> None:
        self.settings = settings
        self.schema = Schema(settings.tables)
        self.holder_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.refs = 0
        self.lost = False
        #: The state `close` leaves in the lock row; None leaves the row's state as it is
        #: (HA writes its own before closing).
        self.stop_state: str | None = "STOPPED"
        #: `time.monotonic()` when the last committed renewal began (the lease it wrote
        #: lasts jdbc-lock-expiration from no earlier than that).
        self.renewed_at = time.monotonic()
        self._fenced = threading.local()
        self._listeners: list[OutageListener] = []
        self._outages: dict[str, str] = {}
        self._outage_lock = threading.Lock()
        self._closing = threading.Event()
        self._renewer: threading.Thread | None = None
        self.engine = self._engine()

    @property
    def where(self) -> str:
        return f"[database] url = {self.settings.masked_url!r}"

    # ------------------------------------------------------------------ opening

    def _engine(self) -> sa.Engine:
        s = self.settings
        timeout = s.network_timeout_ms / 1000
        backend = s.url.get_backend_name()
        try:
            if backend == "sqlite":
                if s.url.database in (None, "", ":memory:"):
                    raise DatabaseError(
                        f"{self.where}: an in-memory SQLite database keeps nothing; give a "
                        "file (or leave url empty for scow.db under the data dir)"
                    )
                os.makedirs(os.path.dirname(s.url.database) or ".", exist_ok=True)
                engine = sa.create_engine(
                    s.url,
                    pool_size=s.pool_size,
                    connect_args={"timeout": timeout, "check_same_thread": False},
                )
                _sqlite_transactions(engine)
                return engine
            connect_args: dict[str, Any] = {}
            if backend == "postgresql":
                connect_args = {
                    "connect_timeout": max(1, math.ceil(timeout)),
                    # a request the server never answers fails after the timeout
                    "tcp_user_timeout": s.network_timeout_ms,
                    "keepalives": 1,
                    "keepalives_idle": max(1, int(timeout / 2)),
                    "keepalives_interval": 1,
                    "keepalives_count": 3,
                    "application_name": "scow",
                    # a session cut off in the middle of a transaction (its fence's UPDATE
                    # done, the COMMIT never arriving) is ended by the server, so the row
                    # lock it holds cannot keep a backup out past the lease
                    "options": f"-c idle_in_transaction_session_timeout={s.lock_expiration_ms}",
                }
            return sa.create_engine(
                s.url,
                pool_size=s.pool_size,
                max_overflow=s.pool_size,
                # no pre-ping: a round trip per batch; a dead connection fails its batch,
                # which `run` retries on a fresh one
                connect_args=connect_args,
            )
        except DatabaseError:
            raise
        except exc.NoSuchModuleError as error:
            raise DatabaseError(
                f"{self.where}: no SQLAlchemy dialect or driver {s.url.drivername!r} "
                f"({error}); use sqlite:///path or postgresql://user@host/db"
            ) from None
        except ImportError as error:
            raise DatabaseError(
                f"{self.where}: the database driver is not installed ({error}); "
                "install scow[database]"
            ) from None
        except (exc.ArgumentError, TypeError, ValueError) as error:
            raise DatabaseError(f"{self.where}: {error}") from None

    def open(self) -> None:
        """Connect, create or check the schema, take the lock row and start renewing it.

        LockHeld when another live broker holds the row, DatabaseUnreachable when the
        database cannot be reached, DatabaseError for anything else.
        """
        try:
            self.prepare()
            started = time.monotonic()
            with self.engine.begin() as conn:
                self._take_lock(conn)
        except DatabaseError:
            self.engine.dispose()
            raise
        except exc.SQLAlchemyError as error:
            self.engine.dispose()
            if getattr(getattr(error, "orig", None), "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise LockHeld(
                    f"{self.where}: the lock row of table {self.schema.node_manager.name} is "
                    "locked by another broker's transaction (a holder renewing it, or one cut "
                    "off mid-renewal, which the server ends after jdbc-lock-expiration)"
                ) from None
            raise failure(f"{self.where}: cannot use the database", error) from None
        self.renewed_at = started
        self._renewer = threading.Thread(target=self._renew, name="scow-db-lock", daemon=True)
        self._renewer.start()

    def prepare(self) -> None:
        """Create the missing tables and the lock row.

        Two brokers doing this at once (an HA pair started together on an empty
        PostgreSQL database) collide on a duplicate; the loser tries again and finds them.
        """
        nm = self.schema.node_manager
        for attempt in range(3):
            try:
                with self.engine.begin() as conn:
                    self.schema.metadata.create_all(conn, checkfirst=True)
                    if conn.execute(sa.select(nm.c.id).where(nm.c.id == LOCK_ROW)).first() is None:
                        conn.execute(
                            sa.insert(nm).values(id=LOCK_ROW, schema_version=SCHEMA_VERSION)
                        )
                return
            except exc.SQLAlchemyError as error:
                if _retryable(error) or attempt == 2:
                    raise
                time.sleep(0.1 * (attempt + 1))

    def _take_lock(self, conn: sa.Connection) -> None:
        """Take the lock row, leaving its state as the last holder wrote it (HA reads it).

        A plain read first: a backup trying every poll period must not lock the row its
        primary fences in every journal write while the holder is plainly alive."""
        nm = self.schema.node_manager
        select = sa.select(nm).where(nm.c.id == LOCK_ROW)
        self._check_holder(conn.execute(select).first())
        row = conn.execute(select.with_for_update(nowait=True)).first()
        if row is None:
            conn.execute(sa.insert(nm).values(id=LOCK_ROW, schema_version=SCHEMA_VERSION))
        self._check_holder(row)
        conn.execute(
            sa.update(nm)
            .where(nm.c.id == LOCK_ROW)
            .values(
                holder_id=self.holder_id,
                holder_expiration_time=_now_ms() + self.settings.lock_expiration_ms,
                node_id=str(self.settings.data_dir),
            )
        )

    def _check_holder(self, row: Any) -> None:
        """LockHeld while another live broker holds the lock row; DatabaseError for a
        schema newer than this broker knows."""
        if row is None:
            return
        nm = self.schema.node_manager
        if row.schema_version > SCHEMA_VERSION:
            raise DatabaseError(
                f"{self.where}: table {nm.name} says schema version {row.schema_version}, "
                f"newer than this broker knows ({SCHEMA_VERSION}); run the scow version "
                "that wrote it"
            )
        if row.holder_id and row.holder_expiration_time > _now_ms() and _alive(row.holder_id):
            raise LockHeld(
                f"{self.where}: the database is in use by another broker: holder "
                f"{row.holder_id} (host:pid:tag, data dir {row.node_id}) holds the lock row "
                f"of table {nm.name} until {_when(row.holder_expiration_time)} unless it "
                "renews it; stop that broker or give this one other table names"
            )

    # ------------------------------------------------------------------ the lock

    def fence(self, conn: sa.Connection) -> None:
        """Renew the lock inside a write transaction; LockLost if another broker took it.

        Inside `run` (and the renewal thread) the renewal counts for `renewed_at` once its
        transaction commits: a renewal rolled back renewed nothing.
        """
        started = time.monotonic()
        nm = self.schema.node_manager
        result = conn.execute(
            sa.update(nm)
            .where(nm.c.id == LOCK_ROW, nm.c.holder_id == self.holder_id)
            .values(holder_expiration_time=_now_ms() + self.settings.lock_expiration_ms)
        )
        if result.rowcount != 1:
            self._lose_lock()
        self._fenced.at = started

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sa.Connection]:
        """A write transaction; a `fence` in it moves `renewed_at` once it committed."""
        self._fenced.at = None
        with self.engine.begin() as conn:
            yield conn
        fenced = self._fenced.at
        if fenced is not None:
            self.renewed_at = max(self.renewed_at, fenced)

    def trouble(self) -> str | None:
        """Why the lock can no longer be relied on, or None.

        Lost to another broker, or not renewed for longer than jdbc-lock-expiration less
        two renewal periods (at least half the expiration): the lease may run out before
        the next renewal lands, and a broker that stops now stops before another may take
        the row. Needs no database: it answers at once while a renewal hangs.
        """
        if self.lost:
            return "lock row taken by another broker"
        expiration = self.settings.lock_expiration_ms
        limit = max(expiration - 2 * self.settings.lock_renew_ms, expiration / 2) / 1000
        since = time.monotonic() - self.renewed_at
        if since <= limit:
            return None
        return (
            f"lock row not renewed for {since:.1f} s (jdbc-lock-expiration "
            f"{expiration / 1000:g} s): stepping down before another broker may take it"
        )

    def _lose_lock(self) -> None:
        self.lost = True
        message = (
            f"{self.where}: this broker ({self.holder_id}) lost its lock row to another "
            "broker; it writes nothing more"
        )
        log.critical("database lock lost", url=self.settings.masked_url, holder=self.holder_id)
        self._set_outage("lock", message)
        raise LockLost(message)

    def _renew(self) -> None:
        period = self.settings.lock_renew_ms / 1000
        while not self._closing.wait(period):
            try:
                with self._writing() as conn:
                    self.fence(conn)
                self._set_outage("lock renewal", None)
            except LockLost:
                return
            except exc.SQLAlchemyError as error:
                # lost connections and anything else alike: the next period tries again,
                # and the journal's own check (`fence`) stops writes if the lock went
                self._set_outage("lock renewal", _cause(error))

    # ------------------------------------------------------------------ work

    def run(
        self,
        what: str,
        work: Callable[[sa.Connection], T],
        *,
        read: bool = False,
        give_up: Callable[[], bool] | None = None,
    ) -> T:
        """`work(conn)` in one transaction, retried with backoff while the database is lost.

        Raises what `work` raises when it is not a lost connection, LockLost once the lock
        is gone, and the last error when `give_up()` says to stop retrying (the outage
        this work reported is then over for it: nothing waits on it any more).
        """
        delay = BACKOFF_START
        while True:
            if self.lost:
                raise LockLost(self._outages.get("lock", f"{self.where}: lock lost"))
            try:
                if read:
                    with self.engine.connect() as conn:
                        conn = conn.execution_options(scow_read=True)
                        with conn.begin():
                            result = work(conn)
                else:
                    with self._writing() as conn:
                        result = work(conn)
            except exc.SQLAlchemyError as error:
                if not _retryable(error) or (give_up is not None and give_up()):
                    if delay != BACKOFF_START:
                        self._set_outage(what, None)
                    raise
                self._set_outage(what, _cause(error))
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_CAP)
                continue
            if delay != BACKOFF_START:
                self._set_outage(what, None)
            return result

    def empty(self) -> None:
        """Delete every row of this broker's tables but its node manager table's (the
        lock row and HA's announcements), in one transaction: journals, pages, streams
        and large message bodies. Not retried: a lost database fails it at once."""
        nm = self.schema.node_manager

        def delete(conn: sa.Connection) -> None:
            for table in reversed(self.schema.metadata.sorted_tables):
                if table is not nm:
                    conn.execute(sa.delete(table))
            self.fence(conn)

        self.run("emptying the tables", delete, give_up=lambda: True)

    # ------------------------------------------------------------------ outages

    def listen(self, listener: OutageListener) -> None:
        """`listener(lost, reason)` runs (on a database thread) as the database is lost and
        back; at once if it is lost now."""
        with self._outage_lock:
            self._listeners.append(listener)
            reasons = "; ".join(self._outages.values())
        if reasons:
            listener(True, reasons)

    def unlisten(self, listener: OutageListener) -> None:
        with self._outage_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    @property
    def outage(self) -> str | None:
        """Why the database is unusable now, or None."""
        with self._outage_lock:
            return "; ".join(self._outages.values()) or None

    def _set_outage(self, what: str, reason: str | None) -> None:
        with self._outage_lock:
            before = bool(self._outages)
            if reason is None:
                if self._outages.pop(what, None) is None:
                    return
            else:
                if what in self._outages:
                    self._outages[what] = f"{what}: {reason}"
                    return
                self._outages[what] = f"{what}: {reason}"
            after = bool(self._outages)
            listeners = list(self._listeners)
            reasons = "; ".join(self._outages.values())
        if before == after:
            return
        if after:
            log.error("database lost: retrying", url=self.settings.masked_url, reason=reasons)
        else:
            log.info("database back", url=self.settings.masked_url)
        for listener in listeners:
            listener(after, reasons)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Stop renewing, give the lock row back (best effort, leaving `stop_state` in it
        unless that is None) and close connections."""
        self._closing.set()
        if self._renewer is not None:
            self._renewer.join(self.settings.network_timeout_ms / 1000 + 1)
        if not self.lost:
            nm = self.schema.node_manager
            values: dict[str, Any] = {"holder_id": None, "holder_expiration_time": None}
            if self.stop_state is not None:
                values["state"] = self.stop_state
            try:
                with self.engine.begin() as conn:
                    conn.execute(
                        sa.update(nm)
                        .where(nm.c.id == LOCK_ROW, nm.c.holder_id == self.holder_id)
                        .values(**values)
                    )
            except exc.SQLAlchemyError as error:  # it expires on its own
                log.warning(
                    "database lock row not released",
                    url=self.settings.masked_url,
                    reason=_cause(error),
                )
        self.engine.dispose()


def _when(ms: int) -> str:
    try:
        return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC"
    except (OverflowError, ValueError, OSError):
        return f"{ms} ms after the epoch"


def _alive(holder_id: str) -> bool:
    """False when the holder was a process on this host that no longer exists."""
    host, _, rest = holder_id.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return True
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(int(pid_text))


def _zombie(pid: int) -> bool:
    """A process that ended but that its parent has not reaped yet (Linux's /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _sqlite_transactions(engine: sa.Engine) -> None:
    """SQLite: durable WAL commits, and writers that take the write lock at BEGIN.

    A deferred transaction that turns into a write fails at once when another connection
    wrote meanwhile; BEGIN IMMEDIATE waits (up to the busy timeout) instead. Readers
    (`scow_read`) begin deferred so that they never wait for writers.
    """

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's BEGIN below, not pysqlite's
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        read = conn.get_execution_options().get("scow_read")
        conn.exec_driver_sql("BEGIN" if read else "BEGIN IMMEDIATE")


# ---------------------------------------------------------------------- sharing

_open: dict[Any, Database] = {}
_open_lock = threading.Lock()


def acquire(settings: DatabaseSettings) -> Database:
    """The open database of these settings (one per URL, tables and data dir), opening
    it on first use; pair with `release`."""
    with _open_lock:
        db = _open.get(settings.key)
        if db is None:
            db = Database(settings)
            db.open()
            _open[settings.key] = db
        db.refs += 1
        return db


def release(db: Database) -> None:
    """One user less; the last one closes it."""
    with _open_lock:
        db.refs -= 1
        if db.refs > 0:
            return
        if _open.get(db.settings.key) is db:
            del _open[db.settings.key]
    db.close()
