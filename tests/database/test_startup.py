"""What stops a broker on a database from starting, and what it says: bad URLs, missing
drivers, unreachable servers, a newer schema, a lock held by another broker."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from scow.core import app
from scow.core.testing import BrokerThread, broker_config, free_port, write_config
from scow.plugins.database_store.journal import DatabaseJournal
from scow.plugins.database_store.schema import Schema
from scow.plugins.database_store.settings import DatabaseError, resolve
from tests.database.backends import FAST_LOCK, on_database
from tests.database.postgres import PASSWORD, PostgresServer

PLUGINS = ["amqp", "standard-queues", "full-policies", "database-store"]


def _config(tmp_path: Path, name: str, database: dict[str, object]) -> Path:
    kwargs = on_database({"plugins": PLUGINS[:-1]}, "")
    kwargs["sections"]["database"].update(database)
    return write_config(tmp_path / f"{name}.toml", broker_config(tmp_path / name, **kwargs))


def _startup_error(config: Path) -> str:
    broker = BrokerThread(config)
    try:
        with pytest.raises(app.StartupError) as info:
            broker.start()
    finally:
        broker.stop()
    return str(info.value)


def test_a_url_that_does_not_parse_stops_startup_naming_it(tmp_path: Path) -> None:
    message = _startup_error(_config(tmp_path, "a", {"url": "postgres//scow:pw@host/db"}))
    assert "[database] url = 'postgres//scow:***@host/db'" in message
    assert "not a SQLAlchemy URL" in message
    assert "pw@" not in message


def test_a_missing_driver_stops_startup_naming_the_url_and_the_module(tmp_path: Path) -> None:
    url = "mysql+pymysql://scow:hunter2@db.example:3306/scow"
    message = _startup_error(_config(tmp_path, "a", {"url": url}))
    assert "mysql+pymysql://scow:***@db.example:3306/scow" in message
    assert "pymysql" in message and "not installed" in message
    assert "hunter2" not in message


def test_an_unknown_dialect_stops_startup(tmp_path: Path) -> None:
    message = _startup_error(_config(tmp_path, "a", {"url": "nosuchdb://h/x"}))
    assert "'nosuchdb://h/x'" in message and "no SQLAlchemy dialect" in message


def test_an_unreachable_server_stops_startup_with_the_cause(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql://scow:hunter2@127.0.0.1:{port}/scow"
    message = _startup_error(_config(tmp_path, "a", {"url": url, "jdbc-network-timeout": 2000}))
    assert f"postgresql+psycopg://scow:***@127.0.0.1:{port}/scow" in message
    assert re.search(r"refused|could not connect|failed", message, re.I), message
    assert "hunter2" not in message


@pytest.mark.postgres
def test_a_wrong_password_stops_startup_with_the_server_s_answer(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    url = postgres_server.url(postgres_server.create_database(), password=False)
    url = url.replace("scow@", "scow:wrong-password@")
    message = _startup_error(_config(tmp_path, "a", {"url": url}))
    assert "scow:***@" in message and "password authentication failed" in message
    assert "wrong-password" not in message


@pytest.mark.postgres
def test_the_password_comes_from_an_environment_variable_or_a_file(
    tmp_path: Path, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = postgres_server.url(postgres_server.create_database(), password=False)
    monkeypatch.setenv("SCOW_TEST_DB_PASSWORD", PASSWORD)
    secret = tmp_path / "db-password"
    secret.write_text(PASSWORD + "\n")
    for where in ({"password-env": "SCOW_TEST_DB_PASSWORD"}, {"password-file": str(secret)}):
        journal = DatabaseJournal(resolve({"url": url, **where}, tmp_path / "d"), "messages")
        journal.load()
        journal.append_add(1, 1, b"x", sync=True)
        journal.stop()
    without = _startup_error(_config(tmp_path, "a", {"url": url}))
    assert "password" in without  # the server asks for the one that was not given


def test_a_password_source_that_is_missing_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="password-env = 'SCOW_NO_SUCH_VARIABLE'"):
        resolve({"password-env": "SCOW_NO_SUCH_VARIABLE"}, tmp_path)
    with pytest.raises(DatabaseError, match=r"password-file = .*cannot be read"):
        resolve({"password-file": str(tmp_path / "missing")}, tmp_path)
    with pytest.raises(DatabaseError, match="not both"):
        resolve({"password-env": "A", "password-file": "b"}, tmp_path)


def test_settings_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="message-table-name = 'bad name'"):
        resolve({"message-table-name": "bad name"}, tmp_path)
    with pytest.raises(DatabaseError, match="must be below jdbc-lock-expiration"):
        resolve({"jdbc-lock-renew-period": 5000, "jdbc-lock-expiration": 5000}, tmp_path)
    with pytest.raises(DatabaseError, match="in-memory SQLite"):
        DatabaseJournal(resolve({"url": "sqlite://"}, tmp_path), "messages")


def test_the_default_is_sqlite_scow_db_under_the_data_dir(tmp_path: Path) -> None:
    settings = resolve({}, tmp_path / "data")
    assert settings.url.render_as_string() == f"sqlite:///{tmp_path / 'data' / 'scow.db'}"
    relative = resolve({"url": "sqlite:///sub/x.db"}, tmp_path / "data")
    assert relative.url.database == str(tmp_path / "data" / "sub" / "x.db")
    assert resolve({"url": "postgresql://u@h/d"}, tmp_path).url.drivername == "postgresql+psycopg"


def test_a_schema_newer_than_known_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, "a", {})
    BrokerThread(config).start().stop()
    with sa.create_engine(f"sqlite:///{tmp_path / 'a' / 'scow.db'}").begin() as conn:
        conn.execute(sa.text("UPDATE NODE_MANAGER_STORE SET schema_version = 2"))
    message = _startup_error(config)
    assert "schema version 2, newer than this broker knows (1)" in message


def test_a_second_broker_on_the_same_database_is_refused_naming_the_holder(
    tmp_path: Path, database_url: str
) -> None:
    first = BrokerThread(_config(tmp_path, "first", {"url": database_url})).start()
    try:
        message = _startup_error(_config(tmp_path, "second", {"url": database_url}))
    finally:
        first.stop()
    holder = f"{socket.gethostname()}:{os.getpid()}:"
    assert "in use by another broker" in message and holder in message
    assert str(tmp_path / "first") in message  # the holder's data dir
    # once the first one stopped, the second starts
    BrokerThread(_config(tmp_path, "second", {"url": database_url})).start().stop()


def test_a_lock_left_by_a_dead_process_or_expired_is_taken(
    tmp_path: Path, database_url: str
) -> None:
    settings = resolve({"url": database_url, **FAST_LOCK}, tmp_path)
    DatabaseJournal(settings, "messages").stop()  # creates the schema
    lock = Schema(settings.tables).node_manager
    engine = sa.create_engine(settings.url)

    def held_by(holder: str, expires: int) -> None:
        with engine.begin() as conn:
            conn.execute(sa.update(lock).values(holder_id=holder, holder_expiration_time=expires))

    later = int(time.time() * 1000) + 3_600_000
    held_by(f"{socket.gethostname()}:{_dead_pid()}:gone", later)  # this host, process gone
    DatabaseJournal(settings, "messages").stop()
    held_by("elsewhere:1:x", 0)  # another host, expired
    DatabaseJournal(settings, "messages").stop()
    held_by("elsewhere:1:x", later)
    with pytest.raises(DatabaseError, match="holder elsewhere:1:x"):
        DatabaseJournal(settings, "messages")
    engine.dispose()


def _dead_pid() -> int:
    pid = 999_999
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_a_broker_whose_lock_was_taken_writes_nothing_more(
    tmp_path: Path, database_url: str
) -> None:
    settings = resolve({"url": database_url, **FAST_LOCK}, tmp_path)
    journal = DatabaseJournal(settings, "messages")
    journal.load()
    journal.append_add(1, 1, b"written", sync=True)
    journal.flush()
    lock = Schema(settings.tables).node_manager
    engine = sa.create_engine(settings.url)
    with engine.begin() as conn:  # another broker took over (say, after an expiry)
        conn.execute(sa.update(lock).values(holder_id="elsewhere:1:x"))
    confirmed: list[int] = []
    journal.append_add(2, 1, b"refused", sync=True, on_done=lambda: confirmed.append(2))
    with pytest.raises(DatabaseError, match="lost its lock row to another broker"):
        journal.flush()
    journal.stop()
    assert confirmed == []
    with engine.begin() as conn:
        conn.execute(sa.update(lock).values(holder_id=None))
    engine.dispose()
    reloaded = DatabaseJournal(settings, "messages")
    assert [r.id for r in reloaded.load().records] == [1]
    reloaded.stop()
