"""The `database-store` plugin: the journal, pages, streams and large messages in a SQL
database.

Enable it with `[plugins] enable = [..., "database-store"]`, then choose it with
`[broker] journal = "database"` (which keeps large messages' bodies there too, and the
spark plugin's streams unless `[spark] stream-store` says otherwise) and/or `[paging]
store = "database"`; `[database]` says where (SQLite file `scow.db` under the data dir
by default, PostgreSQL for production).
`scow database print|export|import` read and fill a broker's database like `scow data`
does its files, so export and import move a broker between files and a database. With
`[ha]`, a primary and a backup share one database: its lock row says which one serves
(`ha.DatabaseStoreLock`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from scow.core import hookimpl
from scow.core.config import ConfigSection
from scow.core.descriptors import (
    JournalBackend,
    LargeMessageStoreBackend,
    PageStoreBackend,
    StreamStoreBackend,
)
from scow.plugins.database_store.settings import SECTION, resolve

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.ha import StoreLock
    from scow.core.interfaces import PageStore, Service, StreamStore
    from scow.core.large_messages import LargeMessageStore
    from scow.plugins.database_store import database
    from scow.plugins.database_store.journal import DatabaseJournal

# SQLAlchemy is an extra (scow[database]): the modules that need it are imported when a
# backend is used, and `resolve` names the missing package before that.

log = structlog.get_logger("scow.database")

NAME = "database"


def _journal(data_dir: Path, kind: str, settings: Mapping[str, Any]) -> DatabaseJournal:
    resolved = resolve(settings, data_dir)
    from scow.plugins.database_store.journal import DatabaseJournal

    return DatabaseJournal(resolved, kind)


def _discard(data_dir: Path, settings: Mapping[str, Any]) -> None:
    """Empty the broker's tables (see `JournalBackend.discard`)."""
    resolved = resolve(settings, data_dir)
    from scow.plugins.database_store import database

    db = database.acquire(resolved)
    try:
        db.empty()
    finally:
        database.release(db)


def _store_lock(data_dir: Path, settings: Mapping[str, Any]) -> StoreLock:
    """HA's lock: the lock row; once taken, the journals share its open database."""
    resolved = resolve(settings, data_dir)
    from scow.plugins.database_store.ha import DatabaseStoreLock

    return DatabaseStoreLock(resolved)


def _open_store(directory: Path, address: str, settings: Mapping[str, Any]) -> PageStore:
    from scow.plugins.database_store import page_store

    return page_store.open_store(directory, address, settings)


def _discover(directory: Path, settings: Mapping[str, Any]) -> list[str]:
    from scow.plugins.database_store import page_store

    return page_store.discover(directory, settings)


def _open_stream_store(
    data_dir: Path, name: str, segment_bytes: int, settings: Mapping[str, Any]
) -> StreamStore:
    from scow.plugins.database_store import stream_store

    return stream_store.open_store(data_dir, name, segment_bytes, settings)


def _open_large_message_store(
    data_dir: Path, settings: Mapping[str, Any], sync: bool
) -> LargeMessageStore:
    from scow.plugins.database_store import large_messages

    return large_messages.open_store(data_dir, settings, sync)


class OutageGuard:
    """Withholds producer credit while the broker's database is lost, resumes it after.

    It also holds the database (and its lock row) for as long as the broker runs, whether
    the journal, the page store or both live there.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.db: database.Database | None = None
        self._listener: database.OutageListener | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        data_dir = Path(str(self.broker.config.section("broker")["data-dir"]))
        settings = resolve(self.broker.config.section(NAME), data_dir)
        from scow.plugins.database_store import database

        db: database.Database = await loop.run_in_executor(None, database.acquire, settings)
        self.db = db
        self._listener = lambda lost, reason: loop.call_soon_threadsafe(self._apply, lost, reason)
        db.listen(self._listener)

    def _apply(self, lost: bool, reason: str) -> None:
        limits = self.broker.limits
        if lost and not limits.blocked_by(NAME):
            limits.block(NAME)
            log.warning("database lost: producers blocked until it is back", reason=reason)
        elif not lost and limits.blocked_by(NAME):
            log.info("database back: producers resume")
            limits.unblock(NAME)

    async def stop(self) -> None:
        if self.db is not None:
            db, self.db = self.db, None
            if self._listener is not None:
                db.unlisten(self._listener)
            from scow.plugins.database_store import database

            await asyncio.get_running_loop().run_in_executor(None, database.release, db)


def _uses_database(broker: Broker) -> bool:
    config = broker.config
    journal = config.section("broker")["journal"] == NAME
    paging = "paging" in config.section_names and config.section("paging")["store"] == NAME
    streams = "spark" in config.section_names and config.section("spark")["stream-store"] == NAME
    return bool(journal or paging or streams)


@hookimpl
def scow_config_sections() -> list[ConfigSection]:
    return [SECTION]


@hookimpl
def scow_register_journals() -> list[JournalBackend]:
    return [
        JournalBackend(
            NAME,
            _journal,
            "bindings and messages as rows of SQL tables, group commit per transaction",
            config_section=SECTION.name,
            store_lock=_store_lock,
            discard=_discard,
        )
    ]


@hookimpl
def scow_register_page_stores() -> list[PageStoreBackend]:
    return [
        PageStoreBackend(
            NAME,
            _open_store,
            _discover,
            "pages as rows of a SQL table (page size capped by jdbc-max-page-size-bytes)",
            config_section=SECTION.name,
            max_page_size=lambda settings: int(settings["jdbc-max-page-size-bytes"]),
        )
    ]


@hookimpl
def scow_register_stream_stores() -> list[StreamStoreBackend]:
    return [
        StreamStoreBackend(
            NAME,
            _open_stream_store,
            "stream records as rows of a SQL table, one per record",
            config_section=SECTION.name,
            discard=_discard,
        )
    ]


@hookimpl
def scow_register_large_message_stores() -> list[LargeMessageStoreBackend]:
    return [
        LargeMessageStoreBackend(
            NAME,
            _open_large_message_store,
            "large message bodies as rows of a SQL table, in chunks",
            config_section=SECTION.name,
        )
    ]


@hookimpl
def scow_services(broker: Broker) -> list[Service]:
    return [OutageGuard(broker)] if _uses_database(broker) and broker.persistent else []
