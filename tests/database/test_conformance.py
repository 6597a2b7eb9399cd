"""The shared Journal and PageStore conformance suites on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from scow.core.journal_suite import JournalConformance, MakeJournal
from scow.core.page_store_suite import OpenStore, PageStoreConformance
from scow.plugins.database_store.journal import DatabaseJournal
from scow.plugins.database_store.page_store import DatabasePageStore
from scow.plugins.database_store.settings import resolve
from tests.database.backends import FAST_LOCK


class TestDatabaseJournal(JournalConformance):
    @pytest.fixture
    def make_journal(self, database_url: str) -> MakeJournal:
        return lambda path: DatabaseJournal(
            resolve({"url": database_url, **FAST_LOCK}, path), "messages"
        )


class TestDatabasePageStore(PageStoreConformance):
    @pytest.fixture
    def open_store(self, database_url: str) -> OpenStore:
        def open_store(directory: Path, address: str) -> DatabasePageStore:
            return DatabasePageStore(resolve({"url": database_url}, directory), address)

        return open_store
