"""What a restart restores: topology, messages in order, delivery counts, transactions."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from proton import Delivery, Message
from proton.reactor import Container
from proton.utils import BlockingConnection

from tests.wire.helpers import consume_all
from tests.wire.test_transactions import TxClient

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]


def _send(url: str, address: str, bodies: list[str], durable: bool = True) -> None:
    conn = BlockingConnection(url, timeout=10)
    sender = conn.create_sender(address)
    for body in bodies:
        sender.send(Message(body=body, durable=durable))
    conn.close()


def _drain(url: str, address: str) -> list[tuple[str, int]]:
    return [(m.body, m.delivery_count) for m in consume_all(url, address)]


def test_durable_messages_survive_a_restart_in_order_and_non_durable_do_not(
    scow_broker_process,
):
    broker = scow_broker_process(plugins=PLUGINS)
    _send(broker.url, "fresh", [f"d{i}" for i in range(20)])
    _send(broker.url, "fresh", ["transient"], durable=False)
    assert broker.stop() == 0
    restarted = scow_broker_process(plugins=PLUGINS, port=broker.port)
    assert [b for b, _ in _drain(restarted.url, "fresh")] == [f"d{i}" for i in range(20)]


def test_delivery_counts_survive_a_restart(scow_broker_process):
    broker = scow_broker_process(plugins=PLUGINS)
    _send(broker.url, "counted", ["c"])
    for _ in range(2):
        conn = BlockingConnection(broker.url, timeout=10)
        receiver = conn.create_receiver("counted")
        receiver.receive(timeout=10)
        receiver.fetcher.unsettled[0].local.failed = True
        receiver.settle(Delivery.MODIFIED)  # modified with delivery-failed
        conn.close()
    # the broker offers the message again only once its new count is on disk
    conn = BlockingConnection(broker.url, timeout=10)
    receiver = conn.create_receiver("counted")
    assert receiver.receive(timeout=10).delivery_count == 2
    broker.kill()
    restarted = scow_broker_process(plugins=PLUGINS, port=broker.port)
    assert _drain(restarted.url, "counted") == [("c", 2)]


def test_transactions_committed_rolled_back_and_in_flight_at_the_crash(scow_broker_process):
    broker = scow_broker_process(plugins=PLUGINS)
    committed = TxClient(broker.url, "txcrash", 3, commit=True)
    Container(committed).run()
    aborted = TxClient(broker.url, "txcrash", 2, commit=False)
    Container(aborted).run()
    assert (committed.outcome, aborted.outcome) == ("committed", "aborted")
    in_flight = InFlightTx(broker.url, "txcrash")
    runner = threading.Thread(target=Container(in_flight).run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while not in_flight.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_flight.sent
    broker.kill()
    runner.join(10)  # the client stops once its connection is gone (no reconnecting)
    assert not runner.is_alive()
    restarted = scow_broker_process(plugins=PLUGINS, port=broker.port)
    assert [b for b, _ in _drain(restarted.url, "txcrash")] == ["tx0", "tx1", "tx2"]


class InFlightTx(TxClient):
    """Declares, sends, and never discharges."""

    def __init__(self, url: str, address: str) -> None:
        super().__init__(url, address, 2, commit=True)
        self.sent = False

    def on_transport_closed(self, event):
        event.container.stop()

    def on_transaction_declared(self, event):
        for i in range(2):
            event.transaction.send(self.sender, Message(body=f"pending{i}", durable=True))
        self.sent = True

    def on_transport_error(self, event):
        event.container.stop()  # the broker was killed: stop, do not reconnect


def test_topology_survives_a_restart(scow_broker_process):
    broker = scow_broker_process(plugins=PLUGINS)
    _send(broker.url, "topo.a", ["x"])
    assert broker.stop() == 0
    restarted = scow_broker_process(plugins=PLUGINS, port=broker.port)
    assert _drain(restarted.url, "topo.a") == [("x", 0)]


def test_export_then_import_round_trip(scow_broker_process, tmp_path):
    broker = scow_broker_process(plugins=PLUGINS)
    _send(broker.url, "exp.q", [f"e{i}" for i in range(5)])
    assert broker.stop() == 0
    data = tmp_path / "data"
    export = tmp_path / "export.jsonl"
    scow = [sys.executable, "-m", "scow.core.cli"]
    run = subprocess.run(
        [*scow, "data", "export", "--data-dir", str(data), "--output", str(export)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    fresh = tmp_path / "fresh"
    run = subprocess.run(
        [*scow, "data", "import", "--data-dir", str(fresh), "--input", str(export)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "'messages': 5" in run.stdout
    # a broker on the imported data dir serves the messages
    data.rename(tmp_path / "old")
    fresh.rename(data)
    restarted = scow_broker_process(plugins=PLUGINS, port=broker.port)
    assert [b for b, _ in _drain(restarted.url, "exp.q")] == [f"e{i}" for i in range(5)]


def test_persistence_disabled_writes_nothing(scow_broker_process, tmp_path):
    broker = scow_broker_process(
        plugins=PLUGINS, sections={"broker": {"persistence-enabled": False}}
    )
    _send(broker.url, "nothing", ["n"])
    broker.stop()
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*"))


def test_journal_section_settings_reach_the_journal(scow_broker_process, tmp_path):
    broker = scow_broker_process(
        plugins=PLUGINS, sections={"journal": {"journal-file-size": "1MiB", "journal-min-files": 3}}
    )
    _send(broker.url, "sized", ["s"])
    broker.stop()
    files = sorted((tmp_path / "data" / "journal").glob("*.scow"))
    assert len(files) >= 3
    assert {f.stat().st_size for f in files} == {1 << 20}
