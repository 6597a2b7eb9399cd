"""`scow run` with its data dir on a small file system that fills (a tmpfs, root only).

A durable producer sends until the disk is full: it is blocked (no credit) or refused with
amqp:resource-limit-exceeded, never closed; the broker stays up; once space returns the
producer goes on by itself; and after a SIGKILL every accepted message is there.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container

from scow.core.testing import BrokerProcess, broker_processes, wait_for
from tests.database.backends import on_database
from tests.tmpfs import free_bytes, tmpfs
from tests.wire.helpers import consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]
BODY = "d" * 4000
ADDRESS = "full"


def leave_free(data: Path, free: int) -> Path:
    """A filler file on `data`'s file system leaving about `free` bytes free."""
    filler = data / "filler"
    size = free_bytes(data) - free
    with open(filler, "wb", buffering=0) as f:
        chunk = bytes(1 << 20)
        while size > 0 and chunk:
            try:
                size -= f.write(chunk[:size])
            except OSError:  # full already (what is free moves while the broker writes)
                chunk = chunk[: len(chunk) // 2]
    return filler


class Producer(MessagingHandler):
    """Sends numbered durable messages as fast as credit allows, from its own thread;
    notes what was accepted and what was refused, and how."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.accepted: list[int] = []
        self.refused: list[tuple[str, str]] = []  # (condition, description)
        self.errors: list[str] = []
        self._pending: dict[object, int] = {}
        self._next = 0
        self._stop = False
        #: Sends no message numbered this or more (None: no limit).
        self.limit: int | None = None
        self._blocked_since: float | None = None
        self._no_credit_since: float | None = None
        self._thread = threading.Thread(target=Container(self).run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        self._stop = True
        self._thread.join(30)
        assert not self._thread.is_alive(), "the producer did not stop"

    def blocked(self) -> bool:
        """No credit and nothing unsettled for a second: the broker withholds credit."""
        since = self._blocked_since
        return since is not None and time.monotonic() - since > 1.0

    def stalled(self) -> bool:
        """No credit for a second (what it sent may wait unsettled)."""
        since = self._no_credit_since
        return since is not None and time.monotonic() - since > 1.0

    def on_start(self, event: Any) -> None:
        self.sender = event.container.create_sender(event.container.connect(self.url), ADDRESS)
        event.container.schedule(0.05, self)

    def on_timer_task(self, event: Any) -> None:
        if self._stop:
            self.sender.connection.close()
            return
        now = time.monotonic()
        if self.sender.credit:
            self._no_credit_since = None
        elif self._no_credit_since is None:
            self._no_credit_since = now
        if self.sender.credit or self._pending:
            self._blocked_since = None
        elif self._blocked_since is None:
            self._blocked_since = now
        event.container.schedule(0.05, self)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and not self._stop and not self._at_limit():
            message = Message(body=BODY, durable=True, properties={"n": self._next})
            self._pending[event.sender.send(message)] = self._next
            self._next += 1

    def _at_limit(self) -> bool:
        return self.limit is not None and self._next >= self.limit

    def on_accepted(self, event: Any) -> None:
        self.accepted.append(self._pending.pop(event.delivery))

    def on_rejected(self, event: Any) -> None:
        self._pending.pop(event.delivery)
        condition = event.delivery.remote.condition
        self.refused.append(
            (condition.name, condition.description) if condition else ("(none)", "")
        )

    def on_released(self, event: Any) -> None:
        self.errors.append(f"released {self._pending.pop(event.delivery)}")

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f"link closed: {event.link.remote_condition}")

    def on_connection_error(self, event: Any) -> None:
        self.errors.append(f"connection closed: {event.connection.remote_condition}")

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(f"transport: {event.transport.condition}")

    def on_disconnected(self, event: Any) -> None:
        if not self._stop:
            self.errors.append("disconnected")
        event.container.stop()


def start_broker(
    start, port: int | None = None, credit: int = 1000, sqlite: bool = False, **broker: object
) -> BrokerProcess:
    kwargs = {
        "port": port,
        "plugins": PLUGINS,
        "sections": {
            "broker": {"disk-scan-period": 200, **broker},
            "journal": {"journal-file-size": "1MiB"},
            "amqp": {"producer-credit": credit},
        },
    }
    return start(**(on_database(kwargs, "") if sqlite else kwargs))


def check_recovered(
    start, broker: BrokerProcess, accepted: list[int], log: Path, sqlite: bool = False
) -> None:
    broker.kill()
    restarted = start_broker(start, broker.port, sqlite=sqlite, **{"max-disk-usage": -1})
    try:
        got = [m.properties["n"] for m in consume_all(restarted.url, ADDRESS)]
    finally:
        restarted.stop()
    assert len(got) == len(set(got)), "a message was recovered twice"
    missing = set(accepted) - set(got)
    assert not missing, f"{len(missing)} accepted messages lost, e.g. {sorted(missing)[:5]}"
    assert "journal failed" not in log.read_text()


def test_a_full_disk_refuses_or_blocks_producers_and_they_resume_when_space_returns(
    tmp_path: Path,
) -> None:
    # The disk limits are off: only the journal's own check of every file it makes stands
    # between the producer and ENOSPC. The credit it holds when blocked (up to 1,000 x 4 kB)
    # is more than the journal takes in: the rest is refused.
    log = tmp_path / "broker.log"
    with tmpfs(tmp_path / "data", "24m") as data, broker_processes(tmp_path) as start:
        broker = start_broker(start, **{"max-disk-usage": -1})
        filler = leave_free(data, 6 << 20)
        producer = Producer(broker.url)
        producer.start()
        try:
            wait_for(producer.blocked, timeout=30, what="the producer to be blocked")
            assert producer.errors == []
            assert producer.refused
            assert {c for c, _ in producer.refused} == {"amqp:resource-limit-exceeded"}
            for _condition, description in producer.refused:
                assert str(data / "journal") in description and "no room" in description
            blocked_at = len(producer.accepted)
            assert blocked_at > 500  # the 6 MiB that were free were used
            assert "producers blocked" in log.read_text()
            assert broker.proc is not None and broker.proc.poll() is None

            filler.unlink()
            wait_for(
                lambda: len(producer.accepted) > blocked_at + 200,
                timeout=15,
                what="the producer to go on once space returned",
            )
        finally:
            producer.finish()
        assert producer.errors == []
        assert broker.proc.poll() is None, "the broker died"
        check_recovered(start, broker, producer.accepted, log)


def test_the_disk_limit_blocks_producers_before_the_disk_is_full(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    with tmpfs(tmp_path / "data", "24m") as data, broker_processes(tmp_path) as start:
        broker = start_broker(start, credit=50, **{"min-disk-free": "4MiB"})
        filler = leave_free(data, 8 << 20)
        producer = Producer(broker.url)
        producer.start()
        try:
            wait_for(producer.blocked, timeout=30, what="the producer to be blocked")
            # blocked with room to spare: nothing refused, the journal never ran out
            assert producer.refused == []
            assert free_bytes(data) > 2 << 20
            blocked_at = len(producer.accepted)
            assert "producers blocked" in log.read_text()
            filler.unlink()
            wait_for(
                lambda: len(producer.accepted) > blocked_at + 200,
                timeout=15,
                what="the producer to go on once space returned",
            )
        finally:
            producer.finish()
        assert producer.errors == []
        check_recovered(start, broker, producer.accepted, log)


def test_the_sqlite_store_on_a_full_disk_holds_producers_until_space_returns(
    tmp_path: Path,
) -> None:
    # SQLite's "database or disk is full" is a database outage to the database store:
    # producers are blocked and the refused batch is written again until it goes in
    log = tmp_path / "broker.log"
    with tmpfs(tmp_path / "data", "24m") as data, broker_processes(tmp_path) as start:
        broker = start_broker(start, sqlite=True, **{"max-disk-usage": -1})
        filler = leave_free(data, 6 << 20)
        producer = Producer(broker.url)
        producer.start()
        try:
            wait_for(producer.stalled, timeout=30, what="the producer to be blocked")
            wait_for(lambda: "disk is full" in log.read_text(), what="the outage")
            assert producer.refused == [] and producer.errors == []
            stalled_at = len(producer.accepted)
            # the held ones and some 6 MiB more (twice that with SQLite's log): as fast as
            # credit allows, the producer would fill the freed space again before it stops,
            # and the restart below would find no room to open the database
            producer.limit = len(producer.accepted) + len(producer._pending) + 1600
            filler.unlink()
            wait_for(
                lambda: len(producer.accepted) > stalled_at + 1200,  # the held ones, and more
                timeout=30,
                what="the producer to go on once space returned",
            )
        finally:
            producer.finish()
        assert producer.errors == [] and producer.refused == []
        assert broker.proc is not None and broker.proc.poll() is None, "the broker died"
        check_recovered(start, broker, producer.accepted, log, sqlite=True)


class TxSender(MessagingHandler, TransactionHandler):
    """Declares a transaction, sends `count` durable messages in it and commits."""

    def __init__(self, url: str, count: int) -> None:
        super().__init__()
        self.url, self.count = url, count
        self.outcome: str | None = None
        self.condition: tuple[str, str] | None = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, "txq")
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        for _ in range(self.count):
            event.transaction.send(self.sender, Message(body=BODY, durable=True))
        event.transaction.commit()

    def _finish(self, outcome: str) -> None:
        self.outcome = outcome
        self.conn.close()

    def on_transaction_committed(self, event: Any) -> None:
        self._finish("committed")

    def on_transaction_commit_failed(self, event: Any) -> None:
        condition = event.delivery.remote.condition
        self.condition = (condition.name, condition.description) if condition else None
        self._finish("commit-failed")

    def on_transaction_declare_failed(self, event: Any) -> None:
        self._finish("declare-failed")


def test_a_commit_the_disk_cannot_hold_is_rolled_back_and_the_next_one_commits(
    tmp_path: Path, scow_broker
) -> None:
    with tmpfs(tmp_path / "data-0", "8m") as data:
        broker = scow_broker(
            plugins=PLUGINS,
            sections={
                "broker": {"max-disk-usage": -1},
                "journal": {"journal-file-size": "1MiB"},
            },
        )
        figures = broker.call(lambda: (broker.broker.limits.size, broker.broker.limits.messages))
        filler = leave_free(data, 0)
        tx = TxSender(broker.url, 400)  # 1.6 MB: more than the journal's files at hand
        Container(tx).run()
        assert tx.outcome == "commit-failed"
        assert tx.condition is not None and tx.condition[0] == "amqp:transaction:rollback"
        assert str(data / "journal") in tx.condition[1] and "no room" in tx.condition[1]
        # nothing of it is left: no message, no memory counted, journal consistent
        assert broker.queue_stats("txq")["message-count"] == 0
        assert (
            broker.call(lambda: (broker.broker.limits.size, broker.broker.limits.messages))
            == figures
        )
        assert broker.call(lambda: broker.broker.storage.stats()["messages"]["transactions"]) == 0

        filler.unlink()
        wait_for(lambda: not broker.call(lambda: broker.broker.limits.disk_full), what="room")
        tx = TxSender(broker.url, 400)
        Container(tx).run()
        assert tx.outcome == "committed"
        assert broker.queue_stats("txq")["message-count"] == 400
