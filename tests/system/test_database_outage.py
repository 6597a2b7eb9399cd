"""`scow run` on the database store whose PostgreSQL is stopped (`pg_ctl -m immediate`)
in the middle of traffic from producers and a consumer in their own processes, then
started again: the broker lives through it, large messages sent meanwhile are refused
with a condition naming the database's table, small ones wait and nothing is accepted
while the server is down, and every acknowledged durable message is there afterwards,
and again after a SIGKILL of the broker and a restart.

In-process variants (the default run): tests/database/test_database_store.py's
`test_postgres_stopped_and_restarted_under_load_...` and
tests/database/test_database_large_message_outages.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scow.core.testing import wait_for
from tests.database.backends import FAST_LOCK
from tests.database.postgres import PostgresServer
from tests.system.broker import SystemBroker
from tests.system.processes import ROOT
from tests.system.records import read_events
from tests.system.topology import LANES, PLUGINS, BrokerSpec
from tests.wire.helpers import consume_all

pytestmark = [pytest.mark.postgres, pytest.mark.slow]  # ~1 min: see the module's doc

#: The store gives up on a lost database after this long (ms): refusals come quickly.
GIVE_UP = 1_000


def _client(logs: Path, role: str, name: str, url: str, *args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tests.system.clients", role, "--url", url]
    command += ["--log", str(logs / f"{name}.jsonl"), "--name", name, *args]
    return subprocess.Popen(command, cwd=ROOT)


def _events(logs: Path, kind: str) -> Iterator[dict[str, Any]]:
    for path in sorted(logs.glob("*.jsonl")):
        yield from (event for event in read_events(path) if event["kind"] == kind)


def _once_still(count: Callable[[], int], still: float, timeout: float = 30) -> int:
    """`count()` once it has not changed for `still` seconds."""
    last, since = count(), time.monotonic()

    def settled() -> bool:
        nonlocal last, since
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= still

    wait_for(settled, timeout, 0.05, f"the count to stay still for {still} s")
    return last


def _counter(logs: Path, kind: str, lane: str) -> Callable[[], int]:
    return lambda: sum(1 for e in _events(logs, kind) if e.get("lane") == lane)


def _missing(
    broker: SystemBroker, logs: Path, taken: set[str], *, durable_only: bool
) -> dict[str, set[str]]:
    """Per lane, the messages the broker accepted, and no consumer acknowledged nor an
    earlier drain took (`taken`), that draining its queue now does not find."""
    acked = {i for e in _events(logs, "acked") for i in e["ids"]}
    missing = {}
    for lane in ("select", "large"):
        owed = {
            e["id"]
            for e in _events(logs, "sent")
            if e["lane"] == lane and (e["durable"] or not durable_only)
        }
        got = {str(m.id) for m in consume_all(broker.url, LANES[lane].address, quiet=2.0)}
        missing[lane] = owed - acked - taken - got
        taken |= got
    return missing


def test_postgresql_stopped_mid_traffic_refuses_clearly_then_loses_no_accepted_message(
    system_broker: Callable[..., SystemBroker], private_postgres: PostgresServer, tmp_path: Path
) -> None:
    server = private_postgres
    url = server.url(server.create_database())
    spec = BrokerSpec(
        plugins=(*PLUGINS, "database-store"),
        lanes=("select", "large"),
        broker={"journal": "database"},
        amqp={"min-large-message-size": "32KiB"},
        sections={"database": {"url": url, "jdbc-network-timeout": GIVE_UP, **FAST_LOCK}},
    )
    broker = system_broker(spec)
    logs = tmp_path / "logs"
    logs.mkdir()
    clients = [
        _client(logs, "producer", f"p{n}", broker.url, "--lanes", "select,large", "--seed", str(n))
        for n in range(2)
    ]
    clients.append(
        _client(logs, "consumer", "c1", broker.url, "--receive", "select", "--ack-every", "5")
    )
    sent, refused = _counter(logs, "sent", "select"), _counter(logs, "refused", "large")
    try:
        wait_for(lambda: sent() > 100, 60, what="traffic")
        server.stop("immediate")
        # large messages in flight are refused once the store gives up on the database
        wait_for(refused, 30, what="a large message refused")
        conditions = {e.get("condition") for e in _events(logs, "refused")}
        assert all(
            c and c.startswith("amqp:resource-limit-exceeded") and "LARGE_MESSAGES" in c
            for c in conditions
        ), conditions
        # small ones wait: nothing is accepted while the server is down, once the
        # answers of writes committed before the stop are in
        during = _once_still(sent, GIVE_UP / 1000)
        time.sleep(3)  # a window with the server down: nothing may be accepted in it
        assert sent() == during, "messages were accepted while PostgreSQL was down"
        assert broker.died() is None, broker.death_report()
        server.start()
        wait_for(lambda: sent() > during + 100, 60, what="traffic after the outage")
    finally:
        for proc in clients:
            proc.send_signal(signal.SIGTERM)
        for proc in clients:
            proc.wait(30)
    assert [proc.returncode for proc in clients] == [0] * len(clients), broker.log_tail()
    taken: set[str] = set()
    assert _missing(broker, logs, taken, durable_only=False) == {"select": set(), "large": set()}
    # what the consumer left behind: sent again, then SIGKILL; the durable ones come back
    more = _client(logs, "producer", "p9", broker.url, "--lanes", "select,large", "--seed", "9")
    p9_sent = lambda: sum(1 for e in _events(logs, "sent") if e["client"] == "p9")  # noqa: E731
    wait_for(lambda: p9_sent() > 50, 60, what="traffic before the kill")
    broker.kill()
    more.wait(30)
    broker.start()
    missing = _missing(broker, logs, taken, durable_only=True)
    assert missing == {"select": set(), "large": set()}, missing
