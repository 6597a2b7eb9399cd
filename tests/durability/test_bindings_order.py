"""A message is confirmed only once the bindings records it relies on are durable: the
bindings journal syncs apart from the message journal, and a crash right after the
confirmation must not lose the auto-created queue the message went to."""

from __future__ import annotations

import threading

from scow.core.storage import StorageManager
from scow.plugins.file_journal.journal import FileJournal
from scow.plugins.file_journal.plugin import journal_settings


def _on_disk(directory, needle: bytes) -> bool:
    return any(needle in path.read_bytes() for path in directory.iterdir() if path.is_file())


def test_message_confirmation_waits_for_its_queue_record(tmp_path):
    # the bindings journal waits 300 ms to group its writes, the message journal 0.1 ms
    storage = StorageManager(
        FileJournal(
            journal_settings(tmp_path, "bindings", {"journal-buffer-timeout": 300_000_000})
        ),
        FileJournal(journal_settings(tmp_path, "messages", {"journal-buffer-timeout": 100_000})),
    )
    storage.load()
    try:
        queue_id = storage.next_id()
        storage.store_queue(queue_id, {"name": "orders-queue-record"})
        seen: list[bool] = []
        confirmed = threading.Event()

        def on_done() -> None:
            seen.append(_on_disk(tmp_path / "bindings", b"orders-queue-record"))
            confirmed.set()

        storage.store_message(storage.next_id(), "orders", 0, 4, [queue_id], b"m", on_done)
        assert confirmed.wait(10), "the message was never confirmed"
        assert seen == [True], "confirmed before its queue's record was written"
    finally:
        storage.stop()
