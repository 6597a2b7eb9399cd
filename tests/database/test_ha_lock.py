"""The database store's HA lock (`DatabaseStoreLock`) on real databases: the lock row
excludes a second member and is freed by a SIGKILLed holder at once, the store's state and
the members' announcements are shared through the database, and a lease that cannot be
renewed (its database cut off) is reported before it can expire."""

from __future__ import annotations

import contextlib
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from scow.core.ha import (
    BACKUP,
    FAILBACK,
    FAILOVER,
    LIVE,
    PRIMARY,
    SERVING,
    STOPPED,
    WAITING,
    Member,
    StoreLock,
)
from scow.core.testing import free_port, wait_for
from scow.plugins.database_store import database
from scow.plugins.database_store.ha import MEMBER_ROWS, DatabaseStoreLock, member_row
from scow.plugins.database_store.journal import DatabaseJournal
from scow.plugins.database_store.schema import LOCK_ROW, Schema
from scow.plugins.database_store.settings import DatabaseError, resolve
from tests.database.backends import FAST_LOCK
from tests.database.postgres import PostgresServer

REPO = Path(__file__).resolve().parents[2]

MakeLock = Callable[..., DatabaseStoreLock]


@pytest.fixture
def make_lock(tmp_path: Path) -> Iterator[MakeLock]:
    """`make_lock(url, member, **database_settings)`: a lock over `url` for a member with
    its own data dir (a broker of its own: its own holder id); released at the end."""
    made: list[DatabaseStoreLock] = []

    def make(url: str, member: str, **settings: Any) -> DatabaseStoreLock:
        values = {"url": url, **FAST_LOCK, **{k.replace("_", "-"): v for k, v in settings.items()}}
        lock = DatabaseStoreLock(resolve(values, tmp_path / member))
        made.append(lock)
        return lock

    yield make
    for lock in made:
        lock.release()


def _lock_row(url: str) -> Any:
    """The lock row as it is in the database now (read without the locks' engines)."""
    engine = sa.create_engine(url)
    try:
        nm = Schema(resolve({"url": url}, Path("/")).tables).node_manager
        with engine.connect() as conn:
            return conn.execute(sa.select(nm).where(nm.c.id == LOCK_ROW)).first()
    finally:
        engine.dispose()


def test_the_lock_row_admits_one_member_and_the_journals_share_its_database(
    make_lock: MakeLock, database_url: str
) -> None:
    primary, backup = make_lock(database_url, "primary"), make_lock(database_url, "backup")
    checked: StoreLock = primary  # it is what core/ha.py drives
    assert checked.where == f"database {resolve({'url': database_url}, Path('/')).masked_url}"
    assert primary.try_acquire()
    assert primary.try_acquire()  # already held: still held, nothing reopened
    assert primary.db is not None
    assert not backup.try_acquire()
    assert "in use by another broker" in backup.holder()
    assert primary.db.holder_id in backup.holder()
    assert _lock_row(database_url).holder_id == primary.db.holder_id

    # the journals the primary opens next are on the lock's database: one holder
    journal = DatabaseJournal(primary.settings, "messages")
    try:
        assert journal.db is primary.db
        journal.load()
        journal.append_add(1, 1, b"written under the lock", sync=True)
        journal.flush()
    finally:
        journal.stop()
    assert not backup.try_acquire()  # the journal's release left the lock's database open

    primary.release()
    assert _lock_row(database_url).holder_id is None
    assert backup.try_acquire()
    assert not primary.try_acquire()
    assert "in use by another broker" in primary.holder()


def test_members_started_together_on_an_empty_database_get_one_holder_and_no_error(
    make_lock: MakeLock, database_url: str
) -> None:
    locks = [make_lock(database_url, f"member{i}") for i in range(4)]
    start = threading.Barrier(len(locks))
    results: dict[int, bool | BaseException] = {}

    def race(i: int) -> None:
        start.wait()
        try:
            results[i] = locks[i].try_acquire()
        except BaseException as error:  # creating the tables twice must not fail one
            results[i] = error

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(locks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results.values(), key=str) == [False, False, False, True], results


def test_members_creating_the_tables_at_once_all_succeed(database_url: str, tmp_path: Path) -> None:
    # what `open` does first; connected beforehand so that the creations really overlap
    members = [
        database.Database(resolve({"url": database_url}, tmp_path / f"m{i}")) for i in range(4)
    ]
    for db in members:
        db.engine.connect().close()  # the pool keeps it
    start = threading.Barrier(len(members))
    failures: list[BaseException] = []

    def prepare(db: database.Database) -> None:
        start.wait()
        try:
            db.prepare()
        except BaseException as error:  # a duplicate table must not stop a member
            failures.append(error)

    threads = [threading.Thread(target=prepare, args=(db,)) for db in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for db in members:
        db.engine.dispose()
    assert failures == []


def test_the_state_a_waiting_member_writes_is_what_the_holder_reads(
    make_lock: MakeLock, database_url: str
) -> None:
    primary, backup = make_lock(database_url, "primary"), make_lock(database_url, "backup")
    assert backup.read_state() is None  # an empty database: no tables, no state yet
    backup.write_state(STOPPED)  # a member that never held the lock
    assert primary.read_state() == STOPPED
    assert primary.try_acquire()
    assert primary.read_state() == STOPPED  # taking the lock leaves the state as it was
    primary.write_state(LIVE)
    assert backup.read_state() == LIVE
    backup.write_state(FAILBACK)  # the waiting member asks for the store back
    assert primary.read_state() == FAILBACK
    assert _lock_row(database_url).holder_id == primary.db.holder_id  # lease untouched


def test_a_released_lock_keeps_the_state_ha_wrote_where_a_plain_broker_leaves_stopped(
    make_lock: MakeLock, database_url: str
) -> None:
    primary, backup = make_lock(database_url, "primary"), make_lock(database_url, "backup")
    assert primary.try_acquire()
    primary.write_state(FAILOVER)
    primary.release()
    row = _lock_row(database_url)
    assert (row.state, row.holder_id, row.holder_expiration_time) == (FAILOVER, None, None)
    assert backup.read_state() == FAILOVER

    plain = database.acquire(backup.settings)  # a broker without HA
    assert plain.stop_state == STOPPED
    database.release(plain)
    assert _lock_row(database_url).state == STOPPED


def test_members_announce_themselves_in_rows_beside_the_lock_row(
    make_lock: MakeLock, database_url: str, tmp_path: Path
) -> None:
    primary, backup = make_lock(database_url, "primary"), make_lock(database_url, "backup")
    assert primary.members() == []
    assert primary.try_acquire()
    primary.write_state(LIVE)
    one = Member("one", PRIMARY, SERVING, "amqp://h1:5672", 11, "h1", 1_700_000_000.5)
    two = Member("two", BACKUP, WAITING, "amqp://h2:5672", 22, "h2", 1_700_000_001.25)
    backup.announce(two)  # not holding the lock
    primary.announce(one)
    assert primary.members() == backup.members() == [one, two]
    two.state, two.updated = SERVING, 1_700_000_009.0
    backup.announce(two)  # refreshed in place, not added
    assert backup.members() == [one, two]
    assert member_row("two") >= MEMBER_ROWS and member_row("two") != member_row("one")

    # the lock row is the lock row still: held, its state and version as they were
    row = _lock_row(database_url)
    assert (row.holder_id, row.state) == (primary.db.holder_id, LIVE)
    assert not backup.try_acquire()
    primary.release()
    # a broker without HA opens the database with the announcements in it
    journal = DatabaseJournal(
        resolve({"url": database_url, **FAST_LOCK}, tmp_path / "x"), "messages"
    )
    journal.load()
    journal.stop()
    assert backup.members() == [one, two]


def test_a_sigkilled_holder_frees_the_lock_row_at_once_on_its_host(
    make_lock: MakeLock, database_url: str, tmp_path: Path
) -> None:
    long_lease = {"jdbc_lock_expiration": 600_000}  # expiry is not what frees it
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from scow.plugins.database_store.ha import DatabaseStoreLock\n"
        "from scow.plugins.database_store.settings import resolve\n"
        "settings = {'url': sys.argv[1], 'jdbc-lock-expiration': 600000,\n"
        "            'jdbc-lock-renew-period': 200}\n"
        "lock = DatabaseStoreLock(resolve(settings, Path(sys.argv[2])))\n"
        "assert lock.try_acquire(), lock.holder()\n"
        "lock.write_state('LIVE')\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, database_url, str(tmp_path / "killed")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        backup = make_lock(database_url, "backup", **long_lease)
        assert not backup.try_acquire()
        assert f"{socket.gethostname()}:{holder.pid}:" in backup.holder()
        holder.kill()
        holder.wait(10)
        killed = time.monotonic()
        assert backup.try_acquire(), backup.holder()
        assert time.monotonic() - killed < 5
        assert backup.read_state() == LIVE  # what the dead primary left: a failover
    finally:
        holder.kill()
        holder.wait(10)


def test_a_lock_row_taken_by_another_broker_is_trouble(
    make_lock: MakeLock, database_url: str
) -> None:
    primary = make_lock(database_url, "primary")
    assert primary.try_acquire()
    assert primary.trouble() is None
    nm = primary._nm
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:  # say, after an expiry another broker took it
        conn.execute(sa.update(nm).where(nm.c.id == LOCK_ROW).values(holder_id="elsewhere:1:x"))
    engine.dispose()
    assert wait_for(primary.trouble, 5) == "lock row taken by another broker"


class PausingProxy:
    """A TCP proxy to `upstream` that can stop forwarding (`cut`) without closing anything:
    what a client meets when its link to the server goes silent. `restore` lets the held
    bytes through, so the connections go on where they stopped."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self._flowing.wait()
                if self._closed:
                    return
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def _cut_off(database_url: str) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """(url, cut, restore): a URL to the database whose renewals `cut` starves for real:
    PostgreSQL through a proxy that goes silent, SQLite with its write lock held by
    another connection (writers wait out their busy timeout, then fail)."""
    url = sa.engine.make_url(database_url)
    if url.get_backend_name() == "sqlite":
        holder = sqlite3.connect(str(url.database), isolation_level=None, check_same_thread=False)

        def lock_file() -> None:
            holder.execute("BEGIN IMMEDIATE")

        def unlock_file() -> None:
            holder.execute("ROLLBACK")

        try:
            yield database_url, lock_file, unlock_file
        finally:
            holder.close()
        return
    proxy = PausingProxy((str(url.host), int(url.port or 5432)))
    try:
        proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
        yield proxied, proxy.cut, proxy.restore
    finally:
        proxy.restore()
        proxy.close()


def test_a_lease_that_cannot_be_renewed_is_trouble_before_it_can_expire(
    make_lock: MakeLock, database_url: str
) -> None:
    expiration, renew = 6_000, 500  # trouble once not renewed for 6 - 2 * 0.5 = 5 s
    with _cut_off(database_url) as (url, cut, restore):
        primary = make_lock(
            url,
            "primary",
            jdbc_lock_expiration=expiration,
            jdbc_lock_renew_period=renew,
            jdbc_network_timeout=3_000,
        )
        assert primary.try_acquire()
        time.sleep(1.5)  # a few renewals
        assert primary.trouble() is None
        cut()
        cut_at = time.monotonic()
        while (trouble := primary.trouble()) is None:
            assert time.monotonic() - cut_at < 15, "never reported"
            time.sleep(0.02)
        asked = time.monotonic()
        assert primary.trouble() is not None
        assert time.monotonic() - asked < 0.1  # answered without the database
        reported_after = asked - cut_at
        # the lease the database holds (read past the cut) has not run out yet
        lease_left = _lock_row(database_url).holder_expiration_time - time.time() * 1000
        assert lease_left > 0, f"reported {-lease_left:.0f} ms after the lease ran out"
        assert reported_after > 5 - renew / 1000 - 0.2, f"reported early: {reported_after:.1f} s"
        assert re.fullmatch(
            r"lock row not renewed for \d+\.\d s \(jdbc-lock-expiration 6 s\): stepping down "
            r"before another broker may take it",
            trouble,
        ), trouble
        restore()
        # nobody took the row meanwhile: renewals land again and the trouble goes
        wait_for(lambda: primary.trouble() is None, 15, what="renewals after the cut")
        primary.release()


@pytest.mark.postgres
def test_members_last_read_are_kept_while_the_database_is_gone(
    make_lock: MakeLock, postgres_url: str
) -> None:
    url = sa.engine.make_url(postgres_url)
    proxy = PausingProxy((str(url.host), int(url.port or 5432)))
    via_proxy = url.set(port=proxy.port).render_as_string(hide_password=False)
    try:
        waiting = make_lock(via_proxy, "backup", jdbc_network_timeout=1_000)
        one = Member("one", PRIMARY, SERVING, "amqp://h1:5672", 11, "h1", time.time())
        waiting.announce(one)
        assert waiting.members() == [one]
    finally:
        proxy.close()  # the database is gone: connections reset, new ones refused
    assert not waiting.try_acquire()
    waiting.announce(one)  # logged, not raised: a waiting member keeps waiting
    assert waiting.members() == [one]
    with pytest.raises(database.DatabaseUnreachable):
        waiting.read_state()


@pytest.mark.postgres
def test_an_unreachable_database_is_waited_for_but_a_refusal_raises(
    make_lock: MakeLock, postgres_server: PostgresServer
) -> None:
    nowhere = f"postgresql://scow:pw@127.0.0.1:{free_port()}/scow"
    waiting = make_lock(nowhere, "backup", jdbc_network_timeout=1_000)
    assert not waiting.try_acquire()
    assert re.search(r"refused|could not connect|failed", waiting.holder(), re.I)
    assert "pw@" not in waiting.holder()

    # the state decides who serves: not knowing it is an error; announcements go stale
    with pytest.raises(database.DatabaseUnreachable, match="cannot read the HA state"):
        waiting.read_state()
    with pytest.raises(database.DatabaseUnreachable, match="cannot write the HA state"):
        waiting.write_state(FAILBACK)
    waiting.announce(Member("b", BACKUP, WAITING, "", 1, "h", time.time()))  # logged only
    assert waiting.members() == []

    url = postgres_server.url(postgres_server.create_database(), password=False)
    refused = make_lock(url.replace("scow@", "scow:wrong@"), "other")
    with pytest.raises(DatabaseError, match="password authentication failed") as info:
        refused.try_acquire()
    assert not isinstance(info.value, database.DatabaseUnreachable)
