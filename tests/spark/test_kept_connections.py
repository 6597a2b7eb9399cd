"""Connections the connector keeps (one per worker, the driver's per query) are checked
before each use: one the broker has closed meanwhile (its idle-timeout passed between two
micro-batches) is replaced, not used to fail a task."""

from __future__ import annotations

import select
from pathlib import Path

import pytest

from scow.core.testing import BrokerThread, broker_config, wait_for, write_config
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
