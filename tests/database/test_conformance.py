"""The shared Journal, PageStore, StreamStore and LargeMessageStore conformance suites on
SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from scow.core.conformance.journal import JournalConformance, MakeJournal
from scow.core.conformance.large_message_store import LargeMessageStoreConformance
from scow.core.conformance.large_message_store import OpenStore as OpenLargeMessageStore
from scow.core.conformance.page_store import OpenStore, PageStoreConformance
from scow.core.conformance.stream_store import OpenStore as OpenStreamStore
from scow.core.conformance.stream_store import StreamStoreConformance
from scow.plugins.database_store.journal import DatabaseJournal
from scow.plugins.database_store.large_messages import DatabaseLargeMessageStore
from scow.plugins.database_store.page_store import DatabasePageStore
from scow.plugins.database_store.settings import resolve
from scow.plugins.database_store.stream_store import DatabaseStreamStore
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


class TestDatabaseStreamStore(StreamStoreConformance):
    @pytest.fixture
    def open_store(self, database_url: str) -> OpenStreamStore:
        def open_store(directory: Path, name: str, segment_bytes: int) -> DatabaseStreamStore:
            return DatabaseStreamStore(
                resolve({"url": database_url}, directory), name, segment_bytes
            )

        return open_store


class TestDatabaseLargeMessageStore(LargeMessageStoreConformance):
    @pytest.fixture
    def open_store(self, database_url: str) -> OpenLargeMessageStore:
        return lambda data_dir: DatabaseLargeMessageStore(
            resolve({"url": database_url, **FAST_LOCK}, data_dir), sync=True
        )
