"""HA pairs as users run them: a primary and a backup `scow run` over one store (a shared
data dir, or PostgreSQL), clients in their own processes reconnecting over both URLs, the
primary SIGKILLed, stopped, brought back, or cut off its database. The checker
(tests/system/ha.py) holds each history to: every accepted message delivered, no first
delivery doubled by one broker process, nothing the broker acknowledged delivered again
(but for an acknowledgement a SIGKILL or the lost database took with it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from proton import Message, Terminus
from proton.utils import BlockingConnection, BlockingReceiver

from scow.core.storage import StorageManager
from scow.core.testing import BrokerThread, broker_config, wait_for, write_config
from scow.plugins import database_store
from scow.plugins.file_journal.journal import FileJournal
from scow.plugins.file_journal.plugin import journal_settings
from scow.protocols.amqp.codec import MessageInfo, encode_message
from tests.database.test_database_large_messages import stored_bodies
from tests.spark.conftest import Producer, client
from tests.system.ha import (
    ASKING,
    SERVING,
    STEPPING_DOWN,
    WAITING,
    CutProxy,
    Member,
    Move,
    Pair,
    Traffic,
    check,
    ha_status,
    remote_properties,
)
from tests.wire.helpers import (
    Capabilities,
    Durable,
    connected,
    consume_all,
    detach,
    receive,
    send,
)

#: A backup takes over a SIGKILLed primary's file store within this many seconds.
FILE_TAKEOVER = 3.0


@pytest.fixture
def pairs(tmp_path: Path) -> Iterator[list[Pair]]:
    """Pairs a test starts; every member killed at the end, and one that exited on its own
    (not by the test) fails the test."""
    made: list[Pair] = []
    yield made
    deaths = [death for pair in made for death in pair.close()]
    assert not deaths, "\n".join(deaths)


def _pair(pairs: list[Pair], directory: Path, **kwargs) -> Pair:
    pair = Pair(directory, **kwargs)
    pairs.append(pair)
    return pair.start()


def _assert_clean(traffic: Traffic, pair: Pair) -> None:
    findings = check(traffic.events(), pair.moves)
    print(findings)  # shown with -s, and with a failure
    assert findings.ok, str(findings)
    assert findings.accepted > 0


# --------------------------------------------------------------------------- file store


def test_file_store_backup_takes_over_a_sigkilled_primary_without_losing_messages(
    pairs: list[Pair], tmp_path: Path
) -> None:
    pair = _pair(pairs, tmp_path / "pair")
    traffic = Traffic(tmp_path / "clients", pair.urls, consume=False)
    try:
        traffic.wait_accepted(200)
        traffic.start_consumer()  # the primary dies while the consumer works off a backlog
        traffic.wait_acked(20)
        pair.kill(pair.primary)
        took = pair.backup.wait_serving(15)
        assert took <= FILE_TAKEOVER, f"the backup served {took:.1f} s after the SIGKILL"
        pair.backup.wait_logged(SERVING)
        traffic.wait_accepted(100)  # both clients found the backup
        traffic.wait_acked(100)
        traffic.stop()
    finally:
        traffic.kill()
    traffic.drain(pair.backup.url)
    _assert_clean(traffic, pair)


def _fail_over(pair: Pair, traffic: Traffic) -> None:
    """Traffic on the primary, the primary SIGKILLed, traffic on the backup."""
    traffic.wait_accepted(100)
    traffic.start_consumer()
    traffic.wait_acked(20)
    pair.kill(pair.primary)
    pair.backup.wait_serving(15)
    traffic.wait_accepted(50)
    traffic.wait_acked(50)


def test_file_store_primary_that_comes_back_takes_the_store_back_from_the_backup(
    pairs: list[Pair], tmp_path: Path
) -> None:
    pair = _pair(pairs, tmp_path / "pair")  # allow-failback defaults to true
    traffic = Traffic(tmp_path / "clients", pair.urls, consume=False)
    try:
        _fail_over(pair, traffic)
        pair.primary.launch()
        pair.backup.wait_logged(STEPPING_DOWN)
        pair.moves.append(Move(pair.backup.url, pair.backup.logged_at(STEPPING_DOWN)[0], "stop"))
        pair.primary.wait_logged(SERVING, count=2)
        pair.backup.wait_logged(WAITING, count=2)  # the same process, waiting again
        assert pair.backup.refuses()
        assert pair.primary.accepts()
        assert pair.primary.logged(ASKING) == 1
        # never both serving: the primary served after the backup let the store go
        assert pair.primary.logged_at(SERVING)[-1] > pair.moves[-1].t
        traffic.wait_accepted(50)
        traffic.wait_acked(50)
        traffic.stop()
    finally:
        traffic.kill()
    traffic.drain(pair.primary.url)
    _assert_clean(traffic, pair)


def test_file_store_without_failback_the_returning_primary_waits_and_the_backup_serves_on(
    pairs: list[Pair], tmp_path: Path
) -> None:
    pair = _pair(pairs, tmp_path / "pair", ha={"allow-failback": False})
    traffic = Traffic(tmp_path / "clients", pair.urls, consume=False)
    try:
        _fail_over(pair, traffic)
        pair.primary.launch().wait_logged(WAITING, count=2)
        served = traffic.producer.count("accepted")

        def backup_alone() -> bool:
            return (
                pair.backup.accepts()
                and pair.primary.refuses()
                and pair.primary.logged(SERVING) == 1
                and pair.primary.logged(ASKING) == 0
                and pair.backup.logged(STEPPING_DOWN) == 0
            )

        pair.backup.keeps(backup_alone, 3, "the backup serving alone")
        assert traffic.producer.count("accepted") > served + 50  # traffic went on there
        traffic.stop()
    finally:
        traffic.kill()
    traffic.drain(pair.backup.url)
    _assert_clean(traffic, pair)


def test_file_store_clean_stop_of_the_primary_leaves_the_backup_waiting(
    pairs: list[Pair], tmp_path: Path
) -> None:
    pair = _pair(pairs, tmp_path / "pair")  # failover-on-shutdown defaults to false
    assert pair.stop(pair.primary) == 0
    pair.backup.wait_logged("not ours to take")
    pair.backup.keeps(
        lambda: pair.backup.refuses() and pair.backup.logged(SERVING) == 0,
        2.5,
        "the backup waiting",
    )
    status = json.loads(ha_status(pair.backup.config_path, "--json").stdout)
    assert status["state"] == "STOPPED"


def test_file_store_clean_stop_with_failover_on_shutdown_hands_over_to_the_backup(
    pairs: list[Pair], tmp_path: Path
) -> None:
    pair = _pair(pairs, tmp_path / "pair", ha={"failover-on-shutdown": True})
    traffic = Traffic(tmp_path / "clients", pair.urls)
    try:
        traffic.wait_accepted(50)
        traffic.wait_acked(20)
        assert pair.stop(pair.primary) == 0
        pair.backup.wait_serving(15)
        pair.backup.wait_logged(SERVING)
        traffic.wait_accepted(50)
        traffic.wait_acked(50)
        traffic.stop()
    finally:
        traffic.kill()
    traffic.drain(pair.backup.url)
    _assert_clean(traffic, pair)  # a clean stop loses no acknowledgement either


def _failover_servers(url: str) -> list[tuple[str, int, str]]:
    servers = remote_properties(url).get("failover-server-list") or []
    return [(str(s["hostname"]), int(s["port"]), str(s["scheme"])) for s in servers]


def test_open_frame_names_the_other_member_in_failover_server_list(
    pairs: list[Pair], tmp_path: Path
) -> None:
    pair = _pair(pairs, tmp_path / "pair")
    backup = ("127.0.0.1", pair.backup.port, "amqp")
    wait_for_value = [backup]
    deadline = time.monotonic() + 10
    while (servers := _failover_servers(pair.primary.url)) != wait_for_value:
        assert time.monotonic() < deadline, f"failover-server-list: {servers}"
        time.sleep(0.2)
    pair.kill(pair.primary)
    pair.backup.wait_serving(15)
    assert _failover_servers(pair.backup.url) == [("127.0.0.1", pair.primary.port, "amqp")]


def test_ha_status_shows_each_members_role_state_and_url(pairs: list[Pair], tmp_path: Path) -> None:
    pair = _pair(pairs, tmp_path / "pair")
    result = ha_status(pair.backup.config_path, "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["state"] == "LIVE"
    assert status["store"] == f"data dir {pair.primary.data_dir.resolve()}"
    members = {m["name"]: (m["role"], m["state"], m["url"]) for m in status["members"]}
    assert members == {
        "primary": ("primary", "serving", pair.primary.url),
        "backup": ("backup", "waiting", pair.backup.url),
    }
    text = ha_status(pair.primary.config_path).stdout
    assert "state: LIVE" in text
    for name, (role, state, url) in members.items():
        assert any(line.split()[:4] == [name, role, state, url] for line in text.splitlines())


def test_management_api_shows_the_members_role_state_and_peers(
    pairs: list[Pair], tmp_path: Path
) -> None:
    pair = _pair(pairs, tmp_path / "pair")
    # the primary reads the backup's announcement within a heartbeat
    ha = wait_for(lambda: (ha := pair.primary.api("/api/broker")["ha"])["peers"] and ha, 10)
    assert (ha["policy"], ha["state"], ha["url"]) == ("primary", "serving", pair.primary.url)
    assert [(p["name"], p["state"]) for p in ha["peers"]] == [("backup", "waiting")]


# --------------------------------------------------------------------------- streams

STREAM = "ha.stream"


def _stream_fails_over(pair: Pair, takeover: float) -> None:
    """A producer on the primary's stream, a cursor moved, the primary SIGKILLed
    mid-traffic: the backup serves the stream with every acknowledged message once, the
    cursor where it was, and sequence numbers that go on."""
    producer = Producer(pair.primary.url, STREAM)
    wait_for(lambda: len(producer.acknowledged) >= 200, 30, what="200 acknowledged sends")
    c = client(pair.primary.url)
    c.call("stream", STREAM, "CURSOR-MOVE", {"cursor": "q", "sequence": 150})
    c.close()
    wait_for(lambda: len(producer.acknowledged) >= 300, 30, what="300 acknowledged sends")
    pair.kill(pair.primary)  # mid-traffic
    acked = producer.stop()
    took = pair.backup.wait_serving(takeover + 15)
    assert took <= takeover, f"the backup served {took:.1f} s after the SIGKILL"
    c = client(pair.backup.url)
    try:
        assert c.call("stream", STREAM, "CURSOR-READ", {"cursor": "q"})["sequence"] == 150
        records = [MessageInfo(m) for batch in c.read(STREAM, 0, 10**9) for m in batch]
        ids = [record.message_id for record in records]
        assert len(ids) == len(set(ids)), "a message was stored twice"
        missing = set(acked) - set(ids)
        assert not missing, f"{len(missing)} acknowledged messages lost: {sorted(missing)[:3]}"
        next_seq = c.call("stream", STREAM, "READ")["next-sequence"]
        assert next_seq == len(ids)  # nothing retention took: one record per sequence number
        with connected(pair.backup.url) as conn:
            conn.create_sender(STREAM).send(Message(id="after", durable=True))
        wait_for(lambda: c.call("stream", STREAM, "READ")["next-sequence"] == next_seq + 1, 10)
        (after,) = [MessageInfo(m).message_id for b in c.read(STREAM, next_seq, 10**9) for m in b]
        assert after == "after"
    finally:
        c.close()


def test_file_store_backup_serves_a_stream_with_its_cursors_after_a_sigkill(
    pairs: list[Pair], tmp_path: Path
) -> None:
    pair = _pair(pairs, tmp_path / "pair", streams=[STREAM])
    _stream_fails_over(pair, FILE_TAKEOVER)


# --------------------------------------------------------------------------- state


#: A paging address (its messages mostly in page files) beside the pair's queues.
PAGED = "ha.paged"
PAGED_SETTINGS = {PAGED: {"max-size-bytes": 10_000, "page-size-bytes": 8_000}}
TOPIC = "ha.news"


def _prepare_transaction(data_dir: Path, database: Mapping[str, Any] | None = None) -> None:
    """Messages a and b on queue `prep`, and a prepared transaction that adds c and acks a
    (held undecided by whichever member loads the store: the data dir's journal, or with
    `database` ([database] settings) the database's)."""
    data_dir.mkdir(parents=True)
    plugins = ["amqp", "file-journal", "standard-queues"]
    config = broker_config(data_dir, plugins=[*plugins, "database-store"] if database else plugins)
    if database:
        config["broker"]["journal"] = "database"
        config["database"] = dict(database)
    broker = BrokerThread(write_config(data_dir.parent / "setup.toml", config)).start()
    with connected(broker.url) as conn:
        send(conn, "prep", Message(body="a", durable=True), Message(body="b", durable=True))
    broker.stop()
    if database:
        [backend] = database_store.scow_register_journals()
        journals = [backend.factory(data_dir, kind, database) for kind in ("bindings", "messages")]
    else:
        journals = [
            FileJournal(journal_settings(data_dir, k, {})) for k in ("bindings", "messages")
        ]
    storage = StorageManager(*journals)
    recovered = storage.load()
    queue_id = recovered.queues[0]["id"]
    body = encode_message("c", durable=True, body_kind="value")
    tx = 990_000
    storage.store_message(storage.next_id(), "prep", 0, 4, [queue_id], body, None, tx_id=tx)
    storage.acknowledge(recovered.messages[0].id, queue_id, True, tx_id=tx)
    storage.messages.prepare(tx, b"xid", sync=True)
    storage.stop()


def _holds_prepared(member: Member) -> None:
    """`member` holds the prepared transaction undecided: a is held, c not yet visible."""
    assert member.api("/api/queues/prep")["message-count"] == 1


def _durable_receiver(conn: BlockingConnection) -> BlockingReceiver:
    return conn.create_receiver(
        TOPIC, name="audit", options=[Capabilities("topic"), Durable(Terminus.DELIVERIES)]
    )


def _leave_state(member: Member) -> BlockingConnection:
    """A durable subscription with messages sent while it was detached, a paging address
    part consumed, and a message delivered but not settled on the connection returned."""
    subscription = "app-1.audit"
    with connected(member.url, container_id="app-1") as conn:
        receiver = _durable_receiver(conn)
        detach(
            conn,
            receiver,
            until=lambda: member.api(f"/api/queues/{subscription}")["consumer-count"] == 0,
        )
    with connected(member.url) as conn:
        send(conn, TOPIC, *[Message(body=f"n{i}", durable=True) for i in range(20)])
        filler = "x" * 200
        send(conn, PAGED, *[Message(body=f"p{i} {filler}", durable=True) for i in range(300)])
        assert member.api(f"/api/addresses/{PAGED}")["paging"], "the address did not page"
        receiver = conn.create_receiver(PAGED)
        assert [m.body.split()[0] for m in receive(receiver, 50)] == [f"p{i}" for i in range(50)]
        receiver.close()
        # a durable send is acknowledged once synced, and the journal is written in order:
        # the acknowledgements above are on disk with it
        send(conn, "ha.barrier", Message(body="sync", durable=True))
    mid = BlockingConnection(member.url, timeout=10)
    send(mid, "ha.mid", Message(body="m", durable=True))
    assert receive(mid.create_receiver("ha.mid"), 1, accept=False)[0].body == "m"
    return mid


def _abandon(conn: BlockingConnection) -> None:
    """Let go of a connection whose broker was killed (its close cannot be answered)."""
    conn.timeout = 1
    with contextlib.suppress(Exception):
        conn.close()


def _check_state(member: Member) -> None:
    """What `_leave_state` left, as a restart would give it back."""
    with connected(member.url, container_id="app-1") as conn:
        receiver = _durable_receiver(conn)
        assert [m.body for m in receive(receiver, 20)] == [f"n{i}" for i in range(20)]
    assert [m.body.split()[0] for m in consume_all(member.url, PAGED)] == [
        f"p{i}" for i in range(50, 300)
    ]
    assert [m.body for m in consume_all(member.url, "ha.mid")] == ["m"]  # given back


def test_file_store_subscription_paging_cursor_unsettled_and_prepared_tx_come_through_failover(
    pairs: list[Pair], tmp_path: Path
) -> None:
    _prepare_transaction(tmp_path / "pair" / "data")
    pair = _pair(pairs, tmp_path / "pair", address_settings=PAGED_SETTINGS)
    _holds_prepared(pair.primary)
    mid = _leave_state(pair.primary)
    pair.kill(pair.primary)
    pair.backup.wait_serving(15)
    _abandon(mid)
    _check_state(pair.backup)
    _holds_prepared(pair.backup)
    assert [m.body for m in consume_all(pair.backup.url, "prep")] == ["b"]


# --------------------------------------------------------------------------- database store

#: Short leases keep these tests quick: a primary whose renewals stop steps down after
#: 4 - 2 * 0.5 = 3 s without one, the backup may take the row after 4 s.
FAST_LEASE = {"jdbc-lock-renew-period": 500, "jdbc-lock-expiration": 4000}
EXPIRATION = FAST_LEASE["jdbc-lock-expiration"] / 1000


def _database_pair(
    pairs: list[Pair], directory: Path, primary_url: str, backup_url: str, **kwargs: Any
) -> Pair:
    return _pair(
        pairs,
        directory,
        database={
            "primary": {"url": primary_url, **FAST_LEASE, "jdbc-network-timeout": 2000},
            "backup": {"url": backup_url, **FAST_LEASE, "jdbc-network-timeout": 2000},
        },
        **kwargs,
    )


@pytest.mark.postgres
def test_database_store_backup_serves_a_stream_from_the_database_after_a_sigkill(
    pairs: list[Pair], tmp_path: Path, postgres_url: str
) -> None:
    pair = _database_pair(pairs, tmp_path / "pair", postgres_url, postgres_url, streams=[STREAM])
    _stream_fails_over(pair, EXPIRATION + 3)
    # the backup has its own data dir: the stream came from the database, not from files
    assert not list(pair.backup.data_dir.rglob("*.seg"))
    assert not list(pair.primary.data_dir.rglob("*.seg"))


@pytest.mark.postgres
def test_database_store_backup_takes_over_a_sigkilled_primary_without_losing_messages(
    pairs: list[Pair], tmp_path: Path, postgres_url: str
) -> None:
    pair = _database_pair(pairs, tmp_path / "pair", postgres_url, postgres_url)
    traffic = Traffic(tmp_path / "clients", pair.urls, consume=False)
    try:
        traffic.wait_accepted(200)
        traffic.start_consumer()
        traffic.wait_acked(20)
        pair.kill(pair.primary)
        took = pair.backup.wait_serving(EXPIRATION + 15)
        assert took <= EXPIRATION + 3, f"the backup served {took:.1f} s after the SIGKILL"
        traffic.wait_accepted(100)
        traffic.wait_acked(100)
        traffic.stop()
    finally:
        traffic.kill()
    traffic.drain(pair.backup.url)
    _assert_clean(traffic, pair)


@pytest.mark.postgres
def test_database_store_backup_serves_large_messages_from_the_database_after_a_sigkill(
    pairs: list[Pair], tmp_path: Path, postgres_url: str
) -> None:
    pair = _database_pair(pairs, tmp_path / "pair", postgres_url, postgres_url)
    # over the default min-large-message-size (100 KiB): bodies in the LARGE_MESSAGES table
    bodies = [bytes([i]) * (300_000 + i) for i in range(5)]
    with connected(pair.primary.url) as conn:
        send(conn, "ha.large", *(Message(body=b, durable=True) for b in bodies))
        receiver = conn.create_receiver("ha.large", credit=1)
        assert receive(receiver, 1)[0].body == bodies[0]
    # acknowledged (the close sent the accept): its body goes, the others' stay
    wait_for(lambda: len(stored_bodies(postgres_url)) == 4, 10, what="the acked body to go")
    pair.kill(pair.primary)
    pair.backup.wait_serving(EXPIRATION + 15)
    got = consume_all(pair.backup.url, "ha.large", quiet=0.5)
    assert [bytes(m.body) for m in got] == bodies[1:]
    # the backup has its own data dir: the bodies came from the database, not from files
    assert not list(pair.backup.data_dir.rglob("*.msg"))
    assert not list(pair.primary.data_dir.rglob("*.msg"))


@pytest.mark.postgres
def test_database_store_backup_takes_over_at_once_from_a_killed_primary_not_yet_reaped(
    pairs: list[Pair], tmp_path: Path, postgres_url: str
) -> None:
    lease = {"url": postgres_url, "jdbc-lock-renew-period": 500, "jdbc-lock-expiration": 10_000}
    pair = _pair(pairs, tmp_path / "pair", database={"primary": lease, "backup": lease})
    pair.primary.deliberate = True
    os.kill(pair.primary.pid, signal.SIGKILL)  # its parent (this test) has not waited yet
    pair.moves.append(Move(pair.primary.url, time.time(), "kill"))
    pair.backup.wait_serving(5)  # the lease would take 10 s


@pytest.fixture
def cut_pair(
    pairs: list[Pair], tmp_path: Path, postgres_url: str
) -> Iterator[tuple[Pair, CutProxy]]:
    """A database-store pair whose primary reaches PostgreSQL through a `CutProxy`, and
    whose backup reaches it directly."""
    url = sa.engine.make_url(postgres_url)
    proxy = CutProxy((str(url.host), int(url.port or 5432)))
    try:
        through_proxy = url.set(port=proxy.port).render_as_string(hide_password=False)
        yield _database_pair(pairs, tmp_path / "pair", through_proxy, postgres_url), proxy
    finally:
        for member in pairs[-1].members if pairs else []:
            member.kill()  # before the proxy lets go of their connections
        proxy.close()


def _takeover_after_cut(pair: Pair, proxy: CutProxy, timeout: float) -> tuple[float, float]:
    """Watch both ports from the cut on: (when the primary refused, when the backup
    accepted); fails if the backup accepted first or not within `timeout`."""
    primary_gone: float | None = None
    deadline = time.monotonic() + timeout
    while not pair.backup.accepts():
        assert time.monotonic() < deadline, (
            f"the backup did not take over within {timeout:.0f} s of the cut\n--- primary ---\n"
            f"{pair.primary.log_tail(12)}\n--- backup ---\n{pair.backup.log_tail(6)}"
        )
        if primary_gone is None and pair.primary.refuses():
            primary_gone = time.time()
        time.sleep(0.02)
    backup_up = time.time()
    assert primary_gone is not None, "the backup served while the primary still did"
    return primary_gone, backup_up


@pytest.mark.postgres
def test_database_store_primary_cut_off_the_database_stops_serving_before_the_backup_starts(
    cut_pair: tuple[Pair, CutProxy], tmp_path: Path
) -> None:
    pair, proxy = cut_pair
    traffic = Traffic(tmp_path / "clients", pair.urls, consume=False)
    try:
        traffic.wait_accepted(200)
        traffic.start_consumer()
        traffic.wait_acked(20)
        proxy.cut(between_transactions=True)  # see the mid-transaction test below
        primary_gone, _ = _takeover_after_cut(pair, proxy, EXPIRATION + 10)
        # acknowledgements the primary took after its last write are lost with it
        pair.moves.append(Move(pair.primary.url, primary_gone, "lost", since=proxy.cut_at))
        pair.backup.wait_logged(SERVING)  # its port opens just before it says so
        stepped = pair.primary.logged_at(STEPPING_DOWN)
        served = pair.backup.logged_at(SERVING)
        assert stepped and served and stepped[0] < served[0], (stepped, served)
        assert proxy.cut_at is not None
        assert served[0] - proxy.cut_at >= EXPIRATION - 1, "the backup did not wait the lease"
        traffic.wait_accepted(100)
        traffic.wait_acked(100)
        traffic.stop()
    finally:
        traffic.kill()
    traffic.drain(pair.backup.url)
    _assert_clean(traffic, pair)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "inside",
    [
        pytest.param(b'"NODE_MANAGER_STORE" SET holder_expiration_time=', id="a-lock-renewal"),
        pytest.param(b'COPY "MESSAGES"', id="a-journal-write"),
    ],
)
def test_database_store_primary_cut_off_mid_transaction_does_not_keep_the_backup_out(
    cut_pair: tuple[Pair, CutProxy], tmp_path: Path, inside: bytes
) -> None:
    """The cut falls inside a transaction that holds the lock row (its fence UPDATE
    done): PostgreSQL must not let that row lock keep the backup out past the lease."""
    pair, proxy = cut_pair
    proxy.cut(after=inside)
    traffic = Traffic(tmp_path / "clients", pair.urls)  # journal writes
    try:
        cut_at = wait_for(lambda: proxy.cut_at, 10, what=f"a request with {inside!r}")
        pair.primary.wait_logged(STEPPING_DOWN, timeout=EXPIRATION + 5)
        # the lease ran out EXPIRATION after the renewal that was cut; the backup's own
        # jdbc-network-timeout (2 s) bounds a request to a server that answers
        primary_gone, _ = _takeover_after_cut(
            pair, proxy, cut_at + EXPIRATION + 2 + 3 - time.time()
        )
        pair.moves.append(Move(pair.primary.url, primary_gone, "lost", since=cut_at))
        traffic.wait_accepted(20)
        traffic.wait_acked(20)
        traffic.stop()
    finally:
        traffic.kill()
    traffic.drain(pair.backup.url)
    _assert_clean(traffic, pair)


@pytest.mark.postgres
def test_database_store_subscription_paging_cursor_unsettled_and_prepared_tx_come_through_failover(
    pairs: list[Pair], tmp_path: Path, postgres_url: str
) -> None:
    member = {"url": postgres_url, **FAST_LEASE}
    _prepare_transaction(tmp_path / "pair" / "data-setup", member)
    pair = _pair(
        pairs,
        tmp_path / "pair",
        database={"primary": member, "backup": member},
        address_settings=PAGED_SETTINGS,
    )
    _holds_prepared(pair.primary)
    mid = _leave_state(pair.primary)
    pair.kill(pair.primary)
    pair.backup.wait_serving(EXPIRATION + 15)
    _abandon(mid)
    _check_state(pair.backup)
    _holds_prepared(pair.backup)
    assert [m.body for m in consume_all(pair.backup.url, "prep")] == ["b"]


def test_checker_flags_lost_doubled_and_reacknowledged_sends() -> None:
    """The oracle itself: a kill excuses a repeated delivery, nothing else does."""
    a, b = "amqp://a:1", "amqp://b:2"

    def ev(kind: str, t: float, **fields) -> dict:
        return {"kind": kind, "t": t, "client": "c", **fields}

    base = [
        ev("connected", 0, conn=1, url=a),
        ev("connected", 10, conn=2, url=b),
        *[ev("accepted", 1, id=f"p-{n}", attempt=1) for n in (1, 2, 3, 4)],
        ev("delivered", 2, id="p-1", attempt=1, count=0, conn=1, url=a),
        ev("acked", 2.1, id="p-1", attempt=1, conn=1),
        ev("delivered", 2, id="p-2", attempt=1, count=0, conn=1, url=a),
        ev("acked", 2.1, id="p-2", attempt=1, conn=1),
        ev("delivered", 2, id="p-3", attempt=1, count=0, conn=1, url=a),
        ev("delivered", 11, id="p-3", attempt=1, count=0, conn=2, url=b),  # never acked
        ev("delivered", 11, id="p-4", attempt=1, count=0, conn=2, url=b),
    ]
    killed = [Move(a, 2.5, "kill")]
    assert check(base, killed).ok
    again = [*base, ev("delivered", 12, id="p-1", attempt=1, count=0, conn=2, url=b)]
    findings = check(again, killed)  # its acknowledgement went with the SIGKILL
    assert findings.ok and findings.ack_lost_with_kill == 1
    findings = check(again, [Move(a, 2.5, "stop")])  # a clean stop keeps acknowledgements
    assert findings.acked_twice and not findings.lost
    findings = check(again, [Move(a, 9, "kill")])  # acknowledged long before the kill
    assert findings.acked_twice
    assert check(again, [Move(a, 5, "lost", since=2.5)]).ok  # cut off its store at 2.5
    assert check(again, [Move(a, 5, "lost", since=4)]).acked_twice  # written before
    doubled = [*base, ev("delivered", 12, id="p-4", attempt=1, count=0, conn=2, url=b)]
    assert check(doubled, killed).doubled == [f"p-4#1 by {b} (its process 1)"]
    resent = [*doubled[:-1], ev("delivered", 12, id="p-4", attempt=2, count=0, conn=2, url=b)]
    assert check(resent, killed).ok  # a second attempt is a second send
    lost = [e for e in base if e.get("id") != "p-4" or e["kind"] == "accepted"]
    assert check(lost, killed).lost == ["p-4"]
