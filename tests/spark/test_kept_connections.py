"""Connections the connector keeps (one per worker, the driver's per query) are checked
before each use: one the broker has closed meanwhile (its idle-timeout passed between two
micro-batches) is replaced, not used to fail a task."""

from __future__ import annotations

import importlib.util
import select
from pathlib import Path
from typing import Any

import pytest

from scow.core.testing import (
    BrokerThread,
    broker_processes,
    wait_for,
)
from scow.protocols.amqp.codec import encode_message
from tests.spark.conftest import PLUGINS, stream

#: The pool of kept connections lives in the data source's module, which needs pyspark;
#: the client's own tests below do not.
needs_pyspark = pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None, reason="pip install 'scow[spark]'"
)


def _stream_broker(scow_broker: Any, amqp: dict[str, Any] | None = None) -> BrokerThread:
    """A broker in this process with the stream `s`, and `amqp` settings."""
    return scow_broker(plugins=PLUGINS, sections={"amqp": amqp or {}, "queues": {"s": stream()}})


@needs_pyspark
def test_a_kept_connection_the_broker_closed_for_idleness_is_replaced(scow_broker):
    from scow.plugins.spark.source import Options, ScowDataSource, pooled

    broker = _stream_broker(scow_broker, {"idle-timeout": 300})
    options = Options.parse({"url": broker.url, "queues": "s"})
    first = pooled(options)
    assert first.call("stream", "s", "READ")["next-sequence"] == 0
    reader = ScowDataSource({"url": broker.url, "queues": "s"}).streamReader(None)
    assert reader.initialOffset() == {"s": 0}
    driver = reader._clients[0]
    # both stay silent past the broker's idle-timeout: it closes them
    for kept in (first, driver):
        wait_for(lambda c=kept: select.select([c.sock], [], [], 0)[0], what="a close")
    second = pooled(options)
    assert second is not first and first.closed
    assert second.call("stream", "s", "READ")["next-sequence"] == 0
    assert reader.latestOffset({"s": 0}, reader.getDefaultReadLimit()) == {"s": 0}
    assert reader._clients[0] is not driver
    second.close()
    reader.stop()


@needs_pyspark
def test_a_kept_connection_to_a_broker_killed_and_restarted_is_replaced(tmp_path: Path):
    """Found by CI: a read leaves the broker's last frames (its detach) unread in the
    kept connection; once that broker is gone, the check before the next use read those
    frames, missed the end of the connection behind them, and the next call on the dead
    connection failed its task ("the broker closed the connection")."""
    from scow.plugins.spark.source import Options, pooled

    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS, sections={"queues": {"s": stream()}})
        options = Options.parse({"url": broker.url, "queues": "s"})
        first = pooled(options)
        first.send("s", [encode_message(b"one")])
        stored = lambda: first.call("stream", "s", "READ")["next-sequence"] == 1  # noqa: E731
        wait_for(stored, what="the message in the stream")
        assert [m for batch in first.read("s", 0, 1) for m in batch]
        # the broker's answer to the read's end waits in the socket, unread
        wait_for(lambda: select.select([first.sock], [], [], 0)[0], what="frames to wait")
        broker.kill()
        broker.start()
        second = pooled(options)
        assert second is not first and first.closed
        assert second.call("stream", "s", "READ")["next-sequence"] == 1
        second.close()


def _links(client) -> int:
    """The links proton holds for the client's connection (closed ones included)."""
    from cproton_ffi import lib

    count, link = 0, lib.pn_link_head(client.connection, 0)
    while link:
        count, link = count + 1, lib.pn_link_next(link, 0)
    return count


def test_a_kept_connection_holds_no_link_of_the_reads_it_served(scow_broker):
    """Every read opens a link: a connection kept for a worker's life must let each go
    (a link closed and never freed stayed in proton, ~3 KB a read), including a read
    left early with its next round already asked for."""
    from scow.plugins.spark.client import READ_CREDIT, Client, Endpoint

    broker = _stream_broker(scow_broker)
    client = Client(Endpoint.parse(broker.url))
    count = 3 * READ_CREDIT  # a round's packs (~128 KiB) hold two each at most
    client.send("s", [encode_message(b"%d" % n + b"x" * (70 << 10)) for n in range(count)])
    wait_for(lambda: client.call("stream", "s", "READ")["next-sequence"] == count)
    before = _links(client)
    for _ in range(5):
        assert len([m for batch in client.read("s", 0, count) for m in batch]) == count
        left = client.read("s", 0, count)
        assert len(next(left)) < count  # the next round is on its way
        left.close()
    assert len([m for batch in client.read("s", 0, count) for m in batch]) == count
    assert _links(client) <= before + 2  # the last reads' links, until answered
    client.close()


def test_a_call_to_a_broker_gone_silent_times_out_saying_how_long_it_was_silent(
    tmp_path: Path,
):
    """A broker that stops answering (here stopped with SIGSTOP) fails the call after the
    endpoint's timeout, and the error tells a silent broker from a slow answer: how long
    ago the broker last sent anything, on a connection how old."""
    import signal

    from scow.plugins.spark.client import Client, ClientError, Endpoint

    with broker_processes(tmp_path) as start:  # SIGKILL at the end ends it stopped too
        broker = start(plugins=PLUGINS, sections={"queues": {"s": stream()}})
        client = Client(Endpoint.parse(broker.url, timeout=1.0))
        assert client.call("stream", "s", "READ")["next-sequence"] == 0
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGSTOP)
        with pytest.raises(ClientError) as raised:
            client.call("stream", "s", "READ")
        message = str(raised.value)
        assert message.startswith("timed out after 1.0 s: READ stream 's' (the broker 127.0.0.1:")
        silent = float(message.split("last sent anything ")[1].split(" s ago")[0])
        assert 1.0 <= silent < 10
        client.close()


def test_a_call_to_a_broker_that_is_up_but_does_not_answer_times_out_saying_it_was_heard(
    tmp_path: Path,
):
    """The other half of the silent-broker test: a broker that is up sends heartbeats
    while the client waits (the client asks for frames every `timeout`), so a wait that
    times out says the broker was heard within half of it."""
    from scow.plugins.spark.client import Client, ClientError, Endpoint

    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS)
        client = Client(Endpoint.parse(broker.url, timeout=2.0))
        with pytest.raises(ClientError) as raised:
            client.wait(lambda: False, "an answer that never comes")
        message = str(raised.value)
        heard = float(message.split("last sent anything ")[1].split(" s ago")[0])
        assert heard < 1.5, message  # a heartbeat every 1 s
        reads = int(message.split(" bytes in ")[1].split(" reads")[0])
        assert reads >= 2, message  # the broker's open, and at least one heartbeat
        client.close()


def test_a_client_made_before_it_is_used_outlives_the_broker_s_handshake_timeout(
    scow_broker,
):
    """The client sends its open when it is made: a broker closes a connection that has
    not opened within handshake-timeout, and a client may first be used later than that
    (spark_bench's was, after a 15 s baseline run)."""
    import socket

    from scow.plugins.spark.client import Client, Endpoint

    broker = _stream_broker(scow_broker, {"handshake-timeout": 300})
    client = Client(Endpoint.parse(broker.url, timeout=10))
    silent = socket.create_connection(("127.0.0.1", broker.port))  # made just after
    silent.settimeout(10)
    assert silent.recv(1) == b""  # closed: the handshake-timeout has passed for both
    assert client.call("stream", "s", "READ")["next-sequence"] == 0
    client.close()
    silent.close()
