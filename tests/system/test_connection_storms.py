"""Storms of connections, as `scow run` meets them: many clients at once (a restart of
the broker or of their fleet, a reconnect loop), sockets that never speak.

The open-file limit: every client socket is a file descriptor, and so is every file the
broker's storage opens. Before, `scow run` kept the soft limit it was given (often 1024,
here 64) and let client sockets take all of it: a few hundred sockets that connected and
said nothing left the journal unable to make its next file. It then failed for good
("journal failed; no more appends") and the broker served on storing nothing: every later
durable send and acknowledgement was refused until a restart. Now `scow run` raises its
soft limit to the hard one and keeps a reserve of it from client sockets: a socket beyond
that is closed as soon as it is accepted, and logged. On the TLS port a socket was counted
only once its handshake was done, so a storm there that never sent a ClientHello still
took the reserve for handshake-timeout; it is counted at its accept now too.

The listen backlog: asyncio's default of 100 overflowed when clients connected faster
than the broker accepted; the kernel dropped their SYNs and each such client waited a
second (the first retransmission) or more. 2,000 connections took 13 s to open; with a
backlog of 4,096 they take 0.6 s.

Heartbeats on demand: a client's open names the idle-time-out it enforces, and the broker
owes it a frame every half of it. Fifty clients asking for 1 ms kept `scow run` at 99 % of
a core sending about 90,000 empty frames a second. Now an idle-time-out below
`[amqp] min-peer-idle-timeout` (100 ms) is refused at open, naming the minimum.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from proton import Delivery, Message

from scow.core.testing import amqp_client, wait_for
from scow.protocols.amqp.codec import UInt
from tests.security import frames
from tests.system.broker import closed_by_peer, scow_behind
from tests.system.topology import BrokerSpec
from tests.wire.helpers import AMQP_HEADER, close_condition, exchange

#: The hard limit the broker runs under, and the soft one it is started with.
FILES, SOFT = 256, 64
#: Sockets the broker may keep with that limit: 256 less the reserve of 100.
CLIENT_SOCKETS = 156
QUEUE = "storm"
COUNT, BODY = 2_000, 4096  # 8 MiB through 1 MiB journal files: new files are needed


def _open_files_limits(pid: int) -> list[str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return line.split()[3:5]
    raise AssertionError("no 'Max open files' in /proc/<pid>/limits")


@pytest.mark.parametrize("listener", ["amqp", "amqps", "management"])
def test_a_connection_storm_leaves_storage_the_files_it_needs(
    system_broker, tmp_path: Path, pki, listener: str
):
    """On the TLS port the storm's sockets send nothing, not even a ClientHello: they
    were counted only once their handshake was done, so they took the storage's reserve.
    The management API's sockets were not counted at all."""
    broker = system_broker(
        BrokerSpec(
            amqp={"handshake-timeout": 120_000},
            tls=(pki.server_cert, pki.server_key) if listener == "amqps" else None,
            sections={"management": {"idle-timeout": 120_000}},
        ),
        command=scow_behind(tmp_path / "scow-limited", f"ulimit -Sn {SOFT} && ulimit -Hn {FILES}"),
    )
    storm_port = {"amqp": broker.port, "amqps": broker.tls_port, "management": broker.http_port}
    assert _open_files_limits(broker.pid) == [str(FILES), str(FILES)]  # soft raised to hard
    assert broker.api("/api/broker")["max-client-sockets"] == CLIENT_SOCKETS

    with amqp_client(broker) as conn:  # connected before the storm
        sender = conn.create_sender(QUEUE)
        storm = [
            socket.create_connection(("127.0.0.1", storm_port[listener])) for _ in range(FILES)
        ]
        try:
            for sock in storm:
                if listener == "amqp":
                    sock.sendall(b"AMQP\x03\x01\x00\x00")  # the SASL header, then nothing
            refused = FILES - (CLIENT_SOCKETS - 1)  # the sender has one
            closed: set[int] = set()

            def all_refused() -> bool:
                closed.update(
                    i for i, s in enumerate(storm) if i not in closed and closed_by_peer(s)
                )
                return len(closed) >= refused

            wait_for(all_refused, 30, what=f"{refused} sockets closed by the broker")
            assert len(closed) == refused
            # the management API's socket counts too: a storm socket makes room for it
            storm[next(i for i in range(FILES) if i not in closed)].close()
            attempts: list[Exception] = []
            figures = wait_for(lambda: _api_or_none(broker, attempts), 30, what="the API")
            assert figures["client-sockets"] == CLIENT_SOCKETS
            assert figures["client-sockets-refused"] == refused + len(attempts), attempts

            # the journal still makes the files it needs: every durable message is stored
            deliveries = [
                sender.send(
                    Message(body=b"x" * BODY, durable=True, properties={"seq": seq}), timeout=False
                )
                for seq in range(COUNT - 1)
            ]
            deliveries.append(
                sender.send(
                    Message(body=b"last", durable=True, properties={"seq": COUNT - 1}), timeout=60
                )
            )
            wait_for(lambda: all(d.settled for d in deliveries), 60, what="every send settled")
            assert {d.remote_state for d in deliveries} == {Delivery.ACCEPTED}
        finally:
            for sock in storm:
                sock.close()

    wait_for(  # all but the API's own
        lambda: broker.api("/api/broker")["client-sockets"] == 1, 30, what="sockets closed"
    )
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=10)
    assert f"scow_client_sockets_refused_total {refused + len(attempts)}.0" in (
        metrics.read().decode().splitlines()
    )
    with amqp_client(broker) as conn:  # room again once the storm is gone
        receiver = conn.create_receiver(QUEUE, credit=500)
        seqs = []
        for _ in range(COUNT):
            seqs.append(receiver.receive(timeout=30).properties["seq"])
            receiver.accept()
    assert seqs == list(range(COUNT))
    assert not broker.log_lines("journal failed")
    (warning,) = broker.log_lines("connection refused")  # one warning per 10 s, not per socket
    assert "limit='open files'" in warning and f"open-file limit ({FILES})" in warning
    (opened,) = broker.log_lines("open files ")
    assert f"limit={FILES}" in opened and f"raised-from={SOFT}" in opened


def _api_or_none(broker, failures: list[Exception]) -> dict | None:
    """The broker's figures, or None (noted in `failures`) when its socket was refused."""
    try:
        return broker.api("/api/broker")  # type: ignore[no-any-return]
    except (OSError, http.client.HTTPException) as exc:  # closed at its accept
        failures.append(exc)
        return None


def test_the_management_api_closes_connections_that_send_no_request(system_broker):
    """aiohttp keeps a connection that never sends a request (or stops halfway through
    one) for an hour: a few thousand such sockets held the file reserve as long.
    Now `[management] idle-timeout` closes them."""
    broker = system_broker(BrokerSpec(sections={"management": {"idle-timeout": 1000}}))
    port = broker.http_port
    silent = socket.create_connection(("127.0.0.1", port))
    halfway = socket.create_connection(("127.0.0.1", port))
    halfway.sendall(b"GET /api/broker HTTP/1.1\r\nHost: scow\r\n")  # no end of headers
    kept_alive = socket.create_connection(("127.0.0.1", port))
    kept_alive.sendall(b"GET /api/broker HTTP/1.1\r\nHost: scow\r\n\r\n")
    kept_alive.settimeout(10)
    assert kept_alive.recv(12) == b"HTTP/1.1 200"  # served, then idle
    started = time.monotonic()
    for sock in (silent, halfway, kept_alive):
        wait_for(lambda s=sock: closed_by_peer(s), 15, 0.05, "the broker to close the socket")
        sock.close()
    assert time.monotonic() - started < 10
    assert broker.api("/api/broker")["client-sockets"] == 1  # this request's


#: Clients connecting at once, each with an AMQP open right after its connect.
STORM = 1_000
#: The kernel retransmits a dropped SYN after 1 s: a connect that took this long waited.
RETRANSMITTED = 0.9


def test_a_thousand_clients_connecting_at_once_are_all_accepted_without_waiting(system_broker):
    broker = system_broker(BrokerSpec(idle_timeout_ms=60_000))
    socks, slowest = [], 0.0
    try:
        for _ in range(STORM):
            started = time.monotonic()
            sock = socket.create_connection(("127.0.0.1", broker.port), timeout=30)
            slowest = max(slowest, time.monotonic() - started)
            sock.sendall(AMQP_HEADER + frames.open_())
            socks.append(sock)
        for sock in socks:  # every one has its open answered
            assert sock.recv(8) == AMQP_HEADER
        assert slowest < RETRANSMITTED, f"a connect took {slowest:.2f} s: its SYN was dropped"
        assert broker.api("/api/broker")["connections"] == STORM
    finally:
        for sock in socks:
            sock.close()


def _open_asking_heartbeats(idle_timeout_ms: int) -> bytes:
    """A raw AMQP open: container-id, hostname, max-frame-size, channel-max, idle-time-out."""
    return AMQP_HEADER + frames.performative(
        frames.OPEN, ["greedy", None, UInt(65536), None, UInt(idle_timeout_ms)]
    )


def test_clients_asking_for_heartbeats_every_millisecond_are_refused_at_open(system_broker):
    broker = system_broker(BrokerSpec())
    for _ in range(50):  # each would have cost 2,000 frames a second
        reply = exchange(broker.port, _open_asking_heartbeats(1), timeout=10)
        condition, description = close_condition(reply)
        assert condition == "amqp:invalid-field"
        assert "idle-time-out 1 ms is below the broker's min-peer-idle-timeout (100 ms)" in (
            description or ""
        )
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(_open_asking_heartbeats(100))  # the minimum is served
        assert sock.recv(8) == AMQP_HEADER
        sock.settimeout(3)
        reply = sock.recv(4096)  # its open, not a close
        assert close_condition(AMQP_HEADER + reply) == (None, None)
    assert broker.api("/api/broker")["connections"] == 0
