"""`DatabaseStoreLock`: HA's store lock over the database store's lock row.

The member that takes the lock row (`node_manager` table, row `LOCK_ROW`) serves. It takes
it by opening the broker's shared `Database` (`database.acquire`), so the journals and page
stores the broker opens next share that `Database`: one holder, one renewal thread, and a
journal batch that would write without the lock fails (`fence`). A lease not renewed in time
shows in `trouble()` before another member may take the row.

The store's state is the lock row's `state` column; each member's announcement is a row of
its own in the same table (ids from `MEMBER_ROWS` up, the member's name in `holder_id`, its
announcement as JSON in `node_id`), as Artemis keeps several rows there. A member that does
not hold the lock reads and writes them through an engine of its own.
"""

from __future__ import annotations

import contextlib
import json
import threading
import zlib
from collections.abc import Iterator

import sqlalchemy as sa
import structlog
from sqlalchemy import exc

from scow.core.ha import Member
from scow.plugins.database_store import database
from scow.plugins.database_store.database import Database, DatabaseUnreachable, LockHeld
from scow.plugins.database_store.schema import LOCK_ROW, SCHEMA_VERSION, Schema
from scow.plugins.database_store.settings import DatabaseSettings

log = structlog.get_logger("scow.database")

#: Rows from this id up are members' announcements (the lock row is `LOCK_ROW`).
MEMBER_ROWS = 1000


def member_row(name: str) -> int:
    """The id of the row announcing member `name`."""
    return MEMBER_ROWS + zlib.crc32(name.encode()) % 1_000_000_000


class DatabaseStoreLock:
    """The `scow.core.ha.StoreLock` of a broker on the database store.

    Every method may block for up to jdbc-network-timeout (they run off the event loop),
    except `trouble()`, which never touches the database. `read_state` and `write_state`
    raise DatabaseError (DatabaseUnreachable when the database cannot be reached): the
    state decides who serves. Announcements are for people and peers: while the database
    cannot be reached, `announce` logs and returns (the member goes stale in the others'
    eyes, as it should) and `members` gives the members last read.
    """

    def __init__(self, settings: DatabaseSettings) -> None:
        self.settings = settings
        self.where = f"database {settings.masked_url}"
        self._db: Database | None = None
        # an engine for the state and announcements while the lock is not held
        self._side: Database | None = None
        self._holder = ""
        self._guard = threading.RLock()
        self._nm = Schema(settings.tables).node_manager
        self._members: list[Member] = []
        self._announce_failing = False

    @property
    def db(self) -> Database | None:
        """The broker's open database while the lock is held."""
        return self._db

    # ------------------------------------------------------------------ the lock

    def try_acquire(self) -> bool:
        """Take the lock row if no live member holds it; False (and `holder()` says why)
        while one does or while the database cannot be reached.

        Raises DatabaseError when trying again cannot help: a URL, driver or schema this
        broker cannot use, or a server refusing it (a wrong password, a missing database):
        a backup waiting on that would never take over.
        """
        with self._guard:
            if self._db is not None:
                return True
            try:
                db = database.acquire(self.settings)
            except (LockHeld, DatabaseUnreachable) as error:
                self._holder = str(error)
                return False
            db.stop_state = None  # HA writes the state it leaves (STOPPED or FAILOVER)
            self._db = db
            self._holder = ""
            side, self._side = self._side, None
        if side is not None:
            side.engine.dispose()
        return True

    def holder(self) -> str:
        """The holder as the lock row names it (or why the database could not be used)."""
        db = self._db
        if db is not None:
            return f"this broker ({db.holder_id})"
        return self._holder

    def release(self) -> None:
        """Give the lock row back (the last user of the database closes it) and close the
        engine used while waiting."""
        with self._guard:
            db, self._db = self._db, None
            side, self._side = self._side, None
        if db is not None:
            database.release(db)
        if side is not None:
            side.engine.dispose()

    close = release

    def trouble(self) -> str | None:
        db = self._db
        return db.trouble() if db is not None else None

    # ------------------------------------------------------------------ state

    def read_state(self) -> str | None:
        nm = self._nm
        with self._transaction("read the HA state", read=True) as conn:
            return conn.execute(sa.select(nm.c.state).where(nm.c.id == LOCK_ROW)).scalar()

    def write_state(self, state: str) -> None:
        nm = self._nm
        with self._transaction(f"write the HA state {state}") as conn:
            done = conn.execute(sa.update(nm).where(nm.c.id == LOCK_ROW).values(state=state))
            if done.rowcount == 0:
                conn.execute(
                    sa.insert(nm).values(id=LOCK_ROW, schema_version=SCHEMA_VERSION, state=state)
                )

    # ------------------------------------------------------------------ members

    def announce(self, member: Member) -> None:
        nm = self._nm
        row = member_row(member.name)
        values = {
            "holder_id": member.name,
            "node_id": json.dumps(member.to_dict()),
            "state": f"{member.role} {member.state}",
            "holder_expiration_time": int(member.updated * 1000),
            "schema_version": SCHEMA_VERSION,
        }
        try:
            with self._transaction(f"announce member {member.name!r}") as conn:
                if conn.execute(sa.update(nm).where(nm.c.id == row).values(values)).rowcount == 0:
                    conn.execute(sa.insert(nm).values(id=row, **values))
        except DatabaseUnreachable as error:
            if not self._announce_failing:
                log.warning("ha: announcement not stored", member=member.name, reason=str(error))
            self._announce_failing = True
            return
        self._announce_failing = False

    def members(self) -> list[Member]:
        nm = self._nm
        try:
            with self._transaction("read the HA members", read=True) as conn:
                texts = conn.execute(sa.select(nm.c.node_id).where(nm.c.id >= MEMBER_ROWS))
                found = []
                for text in texts.scalars():
                    with contextlib.suppress(TypeError, ValueError, KeyError):
                        found.append(Member.from_dict(json.loads(text)))
        except DatabaseUnreachable:
            return list(self._members)
        self._members = sorted(found, key=lambda m: m.name)
        return list(self._members)

    # ------------------------------------------------------------------ plumbing

    @contextlib.contextmanager
    def _transaction(self, what: str, *, read: bool = False) -> Iterator[sa.Connection]:
        """One short transaction on the held database's engine, or on an engine of this
        lock's own while it is not held (creating the tables if missing); not retried."""
        with self._guard:
            try:
                engine = self._engine()
                with engine.connect() as conn:
                    if read:  # SQLite: a deferred BEGIN, which never waits for writers
                        conn = conn.execution_options(scow_read=True)
                    with conn.begin():
                        yield conn
            except exc.SQLAlchemyError as error:
                raise database.failure(f"{self.where}: cannot {what}", error) from None

    def _engine(self) -> sa.Engine:
        if self._db is not None:
            return self._db.engine
        if self._side is None:
            side = Database(self.settings)
            try:
                side.prepare()
            except BaseException:
                side.engine.dispose()
                raise
            self._side = side
        return self._side.engine
