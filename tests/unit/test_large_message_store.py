"""The file store of large message bodies passes the shared conformance suite, and a
broker keeps its bodies in the store named like its journal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proton import Message

from scow.core import LargeMessageStore, LargeMessageStoreBackend, hookimpl
from scow.core.conformance.large_message_store import LargeMessageStoreConformance, OpenStore
from scow.core.large_message_files import FileArrival, FileLargeMessageStore
from tests.wire.helpers import connected, receive, send


class TestFileLargeMessageStore(LargeMessageStoreConformance):
    @pytest.fixture
    def open_store(self) -> OpenStore:
        return lambda data_dir: FileLargeMessageStore(data_dir / "large-messages", sync=True)


class _CountingFileStore:
    """A plugin whose large message store, named like the file journal, counts bodies."""

    def __init__(self) -> None:
        self.begun: list[int] = []

    @hookimpl
    def scow_register_large_message_stores(self) -> list[LargeMessageStoreBackend]:
        plugin = self

        class Counting(FileLargeMessageStore):
            def begin(self, file_id: int) -> FileArrival:
                plugin.begun.append(file_id)
                return super().begin(file_id)

        def factory(data_dir: Path, settings: Any, sync: bool) -> LargeMessageStore:
            return Counting(data_dir / "counted", sync=sync)

        return [LargeMessageStoreBackend("file", factory, "files, counted")]


def test_the_large_message_store_named_like_the_journal_keeps_the_bodies(scow_broker):
    plugin = _CountingFileStore()
    broker = scow_broker(
        plugin_objects={"counted-large": plugin},
        plugins=["amqp", "file-journal", "standard-queues", "full-policies"],
        sections={"amqp": {"min-large-message-size": 1024}},
    )
    body = b"b" * 100_000
    with connected(broker.url) as conn:
        send(conn, "big", Message(body=body, durable=True))
        assert len(plugin.begun) == 1
        data_dir = Path(broker.broker.config.section("broker")["data-dir"])
        assert len(list((data_dir / "counted").iterdir())) == 1
        assert not (data_dir / "large-messages").exists()
        (got,) = receive(conn.create_receiver("big", credit=1), 1)
    assert got.body == body
