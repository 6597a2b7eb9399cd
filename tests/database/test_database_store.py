"""The database store at work: group commit, moving a broker between files and a database,
the page size cap, and a PostgreSQL server that goes away under load and comes back."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection

from scow.core import cli
from scow.core.testing import BrokerThread, broker_config, wait_for, write_config
from scow.plugins.database_store.journal import DatabaseJournal
from scow.plugins.database_store.settings import resolve
from tests.database.backends import on_database
from tests.database.postgres import PostgresServer
from tests.wire.helpers import bulk_send, connected, consume_all, settle_modified

FILES = ["amqp", "file-journal", "standard-queues", "full-policies", "paging"]
ADDRESSES = ("move.q", "move.other", "move.paged")
PAGE_IT = {"move.paged": {"max-size-bytes": 0, "page-size-bytes": 4096}}


def _broker(tmp_path: Path, name: str, **kwargs: Any) -> BrokerThread:
    config = write_config(tmp_path / f"{name}.toml", broker_config(tmp_path / name, **kwargs))
    return BrokerThread(config).start()


def _seen(broker: BrokerThread, address: str) -> list[tuple[Any, int]]:
    """(body, delivery count) of every message the broker holds for `address`."""
    return [(m.body, m.delivery_count) for m in consume_all(broker.url, address, quiet=0.3)]


def test_group_commit_puts_many_producers_records_in_one_transaction(
    tmp_path: Path, database_url: str
) -> None:
    journal = DatabaseJournal(resolve({"url": database_url}, tmp_path), "messages")
    journal.load()
    done = threading.Semaphore(0)

    def producer(base: int) -> None:
        for i in range(500):
            journal.append_add(base + i, 1, b"p" * 1024, sync=True, on_done=done.release)

    threads = [threading.Thread(target=producer, args=(k * 10_000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _ in range(2000):
        assert done.acquire(timeout=20)
    journal.stop()
    assert journal.rows_written == 2000
    assert journal.batches <= 1000, "records were not grouped into shared transactions"
    reloaded = DatabaseJournal(resolve({"url": database_url}, tmp_path), "messages")
    assert len(reloaded.load().records) == 2000
    reloaded.stop()


def test_export_from_files_import_into_the_database_and_back(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _broker(tmp_path, "files", plugins=FILES, address_settings=PAGE_IT)
    bulk_send(files.url, "move.q", 20, lambda i: Message(body=f"m{i}", durable=True))
    bulk_send(files.url, "move.paged", 10, lambda i: Message(body=f"p{i}", durable=True))
    bulk_send(files.url, "move.other", 3, lambda i: Message(body=f"o{i}", durable=True))
    with connected(files.url) as conn:
        receiver = conn.create_receiver("move.q", credit=1)
        receiver.receive(timeout=10)
        settle_modified(receiver, failed=True)  # m0 comes back with delivery count 1
    files.stop()
    exported = tmp_path / "files.jsonl"
    data = ["--data-dir", str(tmp_path / "files")]
    assert cli.main(["data", "export", *data, "--output", str(exported)]) == 0
    files = BrokerThread(tmp_path / "files.toml").start()  # what the files hold, for reference
    try:
        expected = {address: _seen(files, address) for address in ADDRESSES}
    finally:
        files.stop()
    assert expected["move.q"][0] == ("m0", 1) and len(expected["move.q"]) == 20
    assert [body for body, _count in expected["move.other"]] == ["o0", "o1", "o2"]
    assert [body for body, _count in expected["move.paged"]] == [f"p{i}" for i in range(10)]
    db_tables = broker_config(tmp_path / "db", **on_database({"plugins": FILES}, database_url))
    db_config = write_config(tmp_path / "db.toml", db_tables)
    assert cli.main(["data", "import", "--config", str(db_config), "--input", str(exported)]) == 0
    assert "'messages': 33" in capsys.readouterr().out
    # and back to files, before the database broker consumes them
    again = tmp_path / "db.jsonl"
    assert cli.main(["data", "export", "--config", str(db_config), "--output", str(again)]) == 0
    assert cli.main(["data", "print", "--config", str(db_config)]) == 0
    assert "33 messages in the journal" in capsys.readouterr().out
    assert (
        cli.main(["data", "import", "--data-dir", str(tmp_path / "back"), "--input", str(again)])
        == 0
    )

    on_db = BrokerThread(db_config).start()
    try:
        for address, messages in expected.items():
            assert _seen(on_db, address) == messages
    finally:
        on_db.stop()
    back = _broker(tmp_path, "back", plugins=FILES)
    try:
        for address, messages in expected.items():
            assert _seen(back, address) == messages
    finally:
        back.stop()


def test_importing_into_a_database_that_holds_data_is_refused(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tables = broker_config(tmp_path / "db", **on_database({"plugins": FILES}, database_url))
    config = write_config(tmp_path / "db.toml", tables)
    broker = BrokerThread(config).start()
    bulk_send(broker.url, "full", 1, lambda i: Message(body="x", durable=True))
    broker.stop()
    export = tmp_path / "e.jsonl"
    assert cli.main(["data", "export", "--config", str(config), "--output", str(export)]) == 0
    assert cli.main(["data", "import", "--config", str(config), "--input", str(export)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_jdbc_max_page_size_bytes_caps_the_page_size(tmp_path: Path) -> None:
    kwargs = on_database({}, "", journal=False, page_store=True)
    kwargs["sections"]["database"]["jdbc-max-page-size-bytes"] = 4096
    kwargs["address_settings"] = {"#": {"max-size-bytes": 0, "page-size-bytes": 1 << 20}}
    broker = _broker(tmp_path, "capped", **kwargs)
    try:
        # durable: each is accepted once its page write is synced
        bulk_send(
            broker.url, "capped", 40, lambda i: Message(body=f"{i}:" + "c" * 500, durable=True)
        )

        def page_sizes() -> list[int]:
            store = broker.broker.addresses["capped"].pager.store  # type: ignore[union-attr]
            return [len(store.read(page)) for page in store.page_numbers()]

        sizes = broker.call(page_sizes)
        # with page-size-bytes alone, one page of 1 MiB; capped: pages of 4 KiB + a record
        assert len(sizes) >= 2
        assert all(size < 4096 + 700 for size in sizes)
        assert [m.body for m in consume_all(broker.url, "capped")] == [
            f"{i}:" + "c" * 500 for i in range(40)
        ]
    finally:
        broker.stop()


def _produce(url: str, name: str, accepted: list[str], stop: threading.Event) -> None:
    conn = BlockingConnection(url, timeout=60)
    sender = conn.create_sender("outage")
    n = 0
    while not stop.is_set():
        body = f"{name}-{n}"
        sender.send(Message(body=body, durable=True))
        accepted.append(body)  # send() returned: accepted after the commit
        n += 1
    conn.close()


@pytest.mark.postgres
def test_postgres_stopped_and_restarted_under_load_blocks_then_resumes_losing_nothing(
    tmp_path: Path, private_postgres: PostgresServer
) -> None:
    url = private_postgres.url(private_postgres.create_database())
    kwargs = on_database({"plugins": FILES[:-1]}, url)
    # the disk monitor scans often and finds room: it must not let producers go meanwhile
    kwargs["sections"]["broker"]["disk-scan-period"] = 100
    broker = _broker(tmp_path, "outage", **kwargs)
    stop = threading.Event()
    accepted: list[list[str]] = [[], []]
    threads = [
        threading.Thread(target=_produce, args=(broker.url, f"p{k}", accepted[k], stop))
        for k in range(2)
    ]
    try:
        for thread in threads:
            thread.start()
        count = lambda: sum(map(len, accepted))  # noqa: E731
        wait_for(lambda: count() > 200, timeout=30, what="traffic")
        private_postgres.stop("fast")
        blocked = lambda: broker.call(lambda: broker.broker.limits.disk_full)  # noqa: E731
        wait_for(blocked, timeout=15, what="producers to be blocked")
        during = count()
        window = time.monotonic() + 1.0  # observed across ten disk scans
        while time.monotonic() < window:
            assert blocked(), "producers were let go while the database was down"
            time.sleep(0.05)
        assert count() == during, "messages were accepted while the database was down"
        private_postgres.start()
        wait_for(lambda: not blocked(), timeout=30, what="producers to resume")
        wait_for(lambda: count() > during + 200, timeout=30, what="traffic after the outage")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    try:
        received = [m.body for m in consume_all(broker.url, "outage")]
    finally:
        broker.stop()
    sent = [body for part in accepted for body in part]
    assert len(received) == len(set(received))
    missing = set(sent) - set(received)
    assert not missing, f"{len(missing)} accepted messages lost, e.g. {sorted(missing)[:5]}"
    for part in accepted:  # each producer's messages in the order it sent them
        mine = [body for body in received if body.split("-")[0] == part[0].split("-")[0]]
        assert mine[: len(part)] == part
