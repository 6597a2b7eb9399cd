"""Connections the connector keeps (one per worker, the driver's per query) are checked
before each use: one the broker has closed meanwhile (its idle-timeout passed between two
micro-batches) is replaced, not used to fail a task."""

from __future__ import annotations

import select
from pathlib import Path

import pytest

from scow.core.testing import (
    BrokerProcess,
    BrokerThread,
    broker_config,
    free_port,
    wait_for,
    write_config,
)
from scow.protocols.amqp.codec import encode_message
from tests.spark.conftest import PLUGINS, stream

pytest.importorskip("pyspark")


def test_a_kept_connection_the_broker_closed_for_idleness_is_replaced(tmp_path: Path):
    from scow.plugins.spark.source import Options, ScowDataSource, pooled

    tables = broker_config(
        tmp_path / "data",
        plugins=PLUGINS,
        sections={"amqp": {"idle-timeout": 300}, "queues": {"s": stream()}},
    )
    broker = BrokerThread(write_config(tmp_path / "scow.toml", tables)).start()
    try:
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
    finally:
        broker.stop()


def test_a_kept_connection_to_a_broker_killed_and_restarted_is_replaced(tmp_path: Path):
    """Found by CI: a read leaves the broker's last frames (its detach) unread in the
    kept connection; once that broker is gone, the check before the next use read those
    frames, missed the end of the connection behind them, and the next call on the dead
    connection failed its task ("the broker closed the connection")."""
    from scow.plugins.spark.source import Options, pooled

    port = free_port()
    tables = broker_config(
        tmp_path / "data", plugins=PLUGINS, sections={"queues": {"s": stream()}}, port=port
    )
    config = write_config(tmp_path / "scow.toml", tables)
    broker = BrokerProcess(config, port, tmp_path / "broker.log").start()
    try:
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
    finally:
        broker.kill()
