"""Paging recovery: a restart reconciles pages, cursor records and journaled messages.

Each broker here runs in this process on one data dir kept across restarts, so a test can
leave the pages in a state a SIGKILL leaves them in, deterministically.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message, Timeout
from proton.reactor import Copy, Selector

from scow.core.page_frames import iter_frames
from scow.core.storage import StorageManager
from scow.core.testing import BrokerThread, broker_config, wait_for, write_config
from scow.plugins.paging.manager import PagingManager
from tests.wire.helpers import connected, consume_all, receive, round_trip, send

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging"]
FAST_JOURNAL = {"journal": {"journal-file-size": "1MiB", "journal-buffer-timeout": 500000}}
#: Everything pages; pages of ~9 messages of 500 bytes.
PAGE_ALWAYS = {"#": {"max-size-bytes": 0, "page-size-bytes": 5_000}}
#: Pages once 3 messages of 2,500 bytes are in memory; leaves page mode when drained.
PAGE_WHEN_FULL = {"#": {"max-size-bytes": "8KiB", "page-size-bytes": "16KiB"}}


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Callable[..., BrokerThread]]:
    """Factory: a broker on the test's one data dir (a restart is another call)."""
    started: list[BrokerThread] = []

    def start(address_settings: dict[str, Any]) -> BrokerThread:
        config = broker_config(
            tmp_path / "data",
            plugins=PLUGINS,
            sections=FAST_JOURNAL,
            address_settings=address_settings,
        )
        path = write_config(tmp_path / f"scow-{len(started)}.toml", config)
        broker = BrokerThread(path)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        broker.stop()


def durable(i: int, size: int = 500) -> Message:
    return Message(id=f"m{i}", body="d" * size, durable=True)


def test_restart_deletes_a_fully_acknowledged_page_and_its_cursor_record_once(
    restartable, monkeypatch
):
    """A SIGKILL between the acknowledgement of a page's last message and the page's
    deletion leaves the page and its cursor record: the restart deletes both, once."""
    kept: list[int] = []  # pages whose deletion the crash cut off
    monkeypatch.setattr(
        PagingManager, "delete_page", lambda _, pager, page, info: kept.append(page)
    )
    broker = restartable(PAGE_ALWAYS)
    with connected(broker.url) as conn:
        send(conn, "q", *(durable(i) for i in range(30)))
        receiver = conn.create_receiver("q", credit=20)
        assert [m.id for m in receive(receiver, 20)] == [f"m{i}" for i in range(20)]
        send(conn, "flush", durable(-1))  # a round trip after the acks: they are journaled
    records = broker.call(lambda: dict(broker.broker.page_manager.pagers["q"].cursors["q"].records))
    assert len(kept) == 2 and set(kept) <= set(records)  # two acked pages left behind
    broker.stop()
    monkeypatch.undo()

    deleted: list[int] = []
    delete_record = StorageManager.delete_record

    def counted(storage: StorageManager, record_id: int) -> None:
        deleted.append(record_id)
        delete_record(storage, record_id)  # raises "no live record has that id" the 2nd time

    monkeypatch.setattr(StorageManager, "delete_record", counted)
    restarted = restartable(PAGE_ALWAYS)
    manager = restarted.broker.page_manager
    barrier = threading.Event()  # the writer deletes in order: past the recovery's deletions
    restarted.call(lambda: manager.writer.delete(manager.pagers["q"].store, 1 << 40, barrier.set))
    wait_for(barrier.is_set, 10, 0.05, "the page deletions queued by recovery")
    restarted.call(lambda: None)  # and the completions handed back with the barrier ran
    assert {records[page] for page in kept} <= set(deleted)
    assert sorted(deleted) == sorted(set(deleted)), "a journal record was deleted twice"
    assert [m.id for m in consume_all(restarted.url, "q")] == [f"m{i}" for i in range(20, 30)]
    restarted.stop()

    again = restartable(PAGE_ALWAYS)  # and the journal it left starts too
    assert consume_all(again.url, "q") == []


def test_restart_keeps_send_order_across_journaled_and_paged_messages(restartable):
    """Paged m3-m5 unsettled when the address leaves page mode, m6 journaled after them:
    the restart gives m3-m6 back in send order, not m6 first."""
    broker = restartable(PAGE_WHEN_FULL)

    def paging() -> bool:
        return broker.call(lambda: broker.broker.addresses["o"].pager.paging)

    with connected(broker.url) as conn:
        sender = conn.create_sender("o")
        receiver = conn.create_receiver("o", credit=0)
        for i in range(6):
            sender.send(durable(i, 2500))
        assert paging()
        receiver.flow(6)
        got = [receiver.receive(timeout=10).id for _ in range(6)]
        assert got == [f"m{i}" for i in range(6)]
        for _ in range(3):
            receiver.accept()
        conn.create_sender("flush")  # a round trip: the acks are in
        wait_for(lambda: not paging(), 10, 0.05, "the address to leave page mode")
        sender.send(durable(6, 2500))
    broker.stop()

    restarted = restartable(PAGE_WHEN_FULL)
    assert [m.id for m in consume_all(restarted.url, "o")] == ["m3", "m4", "m5", "m6"]


def test_released_paged_messages_go_back_ahead_of_a_later_memory_message(restartable):
    """The live broker in the same state: paged m3-m5 released (their consumer's
    connection ends) after m6 went to memory come back before m6."""
    broker = restartable(PAGE_WHEN_FULL)
    with connected(broker.url) as conn:
        sender = conn.create_sender("o")
        for i in range(6):
            sender.send(durable(i, 2500))
        with connected(broker.url) as consumer:
            receiver = consumer.create_receiver("o", credit=6)
            got = [receiver.receive(timeout=10).id for _ in range(6)]
            assert got == [f"m{i}" for i in range(6)]
            for _ in range(3):
                receiver.accept()
            consumer.create_sender("flush")  # a round trip: the acks are in
            wait_for(
                lambda: not broker.call(lambda: broker.broker.addresses["o"].pager.paging),
                10,
                0.05,
                "the address to leave page mode",
            )
            sender.send(durable(6, 2500))
        # the consumer's connection is gone: m3-m5 are released
    assert [m.id for m in consume_all(broker.url, "o")] == ["m3", "m4", "m5", "m6"]


def _corrupt_fourth_record(page: Path) -> int:
    """Damage the body of `page`'s fourth record in place; returns where it starts."""
    frames = list(iter_frames(page.read_bytes()))
    with open(page, "r+b") as f:
        f.seek(frames[3][2] - 10)
        byte = f.read(1)[0]
        f.seek(frames[3][2] - 10)
        f.write(bytes([byte ^ 0xFF]))
    return frames[2][2]


@pytest.mark.parametrize("when", ["before-restart", "while-running"])
def test_a_corrupt_record_mid_page_loses_that_record_only_and_says_so(
    restartable, tmp_path, capfd, when
):
    """Bytes damaged on disk: the record they hit is lost, and the log names it; the
    readers go on at the next valid frame. While running, the cursor first read the
    corrupt frame again and again and stopped there; then it lost the rest of the page."""
    broker = restartable(PAGE_ALWAYS)
    with connected(broker.url) as conn:
        send(conn, "q", *(durable(i) for i in range(40)))
    page = next((tmp_path / "data" / "paging").rglob("000000002.page"))
    if when == "before-restart":
        broker.stop()
        valid = _corrupt_fourth_record(page)
        capfd.readouterr()
        broker = restartable(PAGE_ALWAYS)
    else:
        valid = _corrupt_fourth_record(page)
        capfd.readouterr()
    got = [m.id for m in consume_all(broker.url, "q", quiet=1.0)]
    lost = [f"m{i}" for i in range(40) if f"m{i}" not in got]
    reports = [line for line in capfd.readouterr().err.splitlines() if "unreadable" in line]
    assert len(reports) == 1, (len(got), reports)
    [report] = reports
    assert f"offset={valid} page=2" in report and "read on at its next valid record" in report
    assert lost == ["m12"]  # the page's fourth record
    assert got == [f"m{i}" for i in range(40) if f"m{i}" not in lost]


def _colored(i: int) -> Message:
    """m0-m8 (page 1) blue; from m9 on red when odd."""
    color = "red" if i >= 9 and i % 2 else "blue"
    return Message(id=f"m{i}", body="d" * 500, durable=True, properties={"color": color})


def _take(url: str, options: list[Any], count: int, *, accept: bool) -> list[str]:
    """Ids of up to `count` messages given to a receiver with `options`."""
    got: list[str] = []
    with connected(url) as conn:
        receiver = conn.create_receiver("q", credit=count, options=options)
        while len(got) < count:
            try:
                message = receiver.receive(timeout=3)
            except Timeout:
                break
            got.append(str(message.id))
            if accept:
                receiver.accept()
    return got


@pytest.mark.parametrize("reader", ["browser", "selector"])
def test_a_corrupt_record_mid_page_does_not_stop_browsers_or_selector_scans(
    restartable, tmp_path, capfd, reader
):
    """A browser, and a consumer whose selector sends the cursor looking ahead of its
    position (page 1 holds nothing it matches), pass a damaged frame as the cursor's own
    read does: they read up to it, then on from the next valid frame. Both used to stay
    on it."""
    broker = restartable(PAGE_ALWAYS)
    with connected(broker.url) as conn:
        send(conn, "q", *(_colored(i) for i in range(40)))
    _corrupt_fourth_record(next((tmp_path / "data" / "paging").rglob("000000002.page")))
    lost = {"m12"}  # the fourth record of page 2
    if reader == "browser":
        got = _take(broker.url, [Copy()], 40, accept=False)
        wanted = [f"m{i}" for i in range(40) if f"m{i}" not in lost]
    else:
        got = _take(broker.url, [Selector("color = 'red'")], 40, accept=True)
        wanted = [f"m{i}" for i in range(9, 40, 2) if f"m{i}" not in lost]
    assert got == wanted
    round_trip(broker.url)  # the loop still serves
    assert any("unreadable" in line for line in capfd.readouterr().err.splitlines())
