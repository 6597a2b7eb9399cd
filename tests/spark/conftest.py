"""Fixtures of the spark plugin's tests: brokers with stream queues, one SparkSession."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scow.core.testing import BrokerThread, broker_config, free_port, write_config
from scow.plugins.spark.client import Client, Endpoint
from scow.protocols.amqp.codec import encode_message

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging", "spark"]


def stream(**arguments: Any) -> dict[str, Any]:
    """The config of a stream queue (anycast, named like its address)."""
    return {"routing-type": "ANYCAST", "arguments": {"x-queue-type": "stream", **arguments}}


class Streams:
    """Start brokers whose config declares the given stream queues; restart them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[BrokerThread] = []

    def config(
        self,
        streams: dict[str, dict[str, Any]],
        port: int = 0,
        spark: dict[str, Any] | None = None,
        address_settings: dict[str, dict[str, Any]] | None = None,
        name: str = "",
        amqp: dict[str, Any] | None = None,
    ) -> Path:
        """The config file of broker `name` (each name its own data dir)."""
        root = self.tmp_path / name
        root.mkdir(parents=True, exist_ok=True)
        sections = {"queues": streams, "broker": {"log-level": "warning"}, "spark": spark or {}}
        if amqp:
            sections["amqp"] = amqp
        tables = broker_config(
            root / "data",
            plugins=PLUGINS,
            sections=sections,
            port=port,
            address_settings=address_settings,
        )
        return write_config(root / "scow.toml", tables)

    def start(
        self,
        streams: dict[str, dict[str, Any]],
        *,
        port: int = 0,
        spark: dict[str, Any] | None = None,
        address_settings: dict[str, dict[str, Any]] | None = None,
        name: str = "",
        amqp: dict[str, Any] | None = None,
    ) -> BrokerThread:
        """A broker declaring `streams`, with the `[spark]`, `[amqp]` and address settings
        given; brokers of different `name`s run side by side."""
        config = self.config(streams, port, spark, address_settings, name, amqp)
        broker = BrokerThread(config).start()
        self.started.append(broker)
        return broker

    def stop_all(self) -> None:
        for broker in self.started:
            broker.stop()


@pytest.fixture
def streams(tmp_path: Path) -> Iterator[Streams]:
    started = Streams(tmp_path)
    yield started
    started.stop_all()


@pytest.fixture
def port() -> int:
    return free_port()


def client(url: str) -> Client:
    return Client(Endpoint.parse(url, timeout=10))


def publish(url: str, address: str, bodies: list[str], **fields: Any) -> None:
    """Send each body (a data section) durable, its message-id the body; wait for acceptance."""
    messages = [
        encode_message(
            body,
            durable=True,
            properties={"message_id": body},
            application_properties=fields.get("app", lambda b: None)(body),
        )
        for body in bodies
    ]
    c = client(url)
    try:
        c.send(address, messages)
    finally:
        c.close()


class Producer:
    """Threads that send durable messages to `address` at `url`, each send waiting for its
    acknowledgement, until `stop()` or until the broker goes (a SIGKILL under them).
    `acknowledged` lists the message ids acknowledged, in order per lane."""

    def __init__(self, url: str, address: str, lanes: int = 1) -> None:
        self.url = url
        self.address = address
        self.acknowledged: list[str] = []
        self._stop = threading.Event()
        self._lanes = [threading.Thread(target=self._send, args=(n,)) for n in range(lanes)]
        for lane in self._lanes:
            lane.start()

    def _send(self, lane: int) -> None:
        from proton import Message

        from tests.wire.helpers import connected

        try:
            with connected(self.url) as conn:
                sender = conn.create_sender(self.address)
                for i in range(10**6):
                    if self._stop.is_set():
                        return
                    sender.send(Message(id=f"l{lane}-{i}", body="x" * 100, durable=True))
                    self.acknowledged.append(f"l{lane}-{i}")
        except Exception:  # the broker went away under it
            return

    def stop(self) -> list[str]:
        """Stop the lanes; the ids acknowledged."""
        self._stop.set()
        for lane in self._lanes:
            lane.join(10)
        return list(self.acknowledged)


def management(url: str, kind: str, name: str, operation: str, **properties: Any) -> Any:
    c = client(url)
    try:
        return c.call(kind, name, operation, properties)
    finally:
        c.close()


def stream_bodies(url: str, queue: str, count: int) -> list[Any]:
    """The bodies of the first `count` records of stream `queue` (and of one more, if
    there is one), as the source reads them (needs pyarrow)."""
    from scow.plugins.spark.schema import to_batch

    reader = client(url)
    try:
        found = [to_batch(queue, m) for m in reader.read(queue, 0, count + 1)]
    finally:
        reader.close()
    return [body for part in found for body in part.column(0).to_pylist()]


def wait_stream(broker: BrokerThread, queue: str, count: int) -> None:
    """Wait until `count` messages of `queue` are stored (visible to readers)."""
    from scow.core.testing import wait_for

    wait_for(
        lambda: (broker.queue_stats(queue) or {}).get("next-sequence", 0) >= count,
        what=f"{count} messages stored in {queue}",
    )


def _spark_missing() -> str | None:
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
        return "pyspark and pyarrow are not installed (pip install 'scow[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (java on PATH or JAVA_HOME) for PySpark"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for the whole run, with the scow data source registered."""
    missing = _spark_missing()
    if missing:
        pytest.skip(missing)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from scow.plugins.spark.source import ScowDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("scow-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(ScowDataSource)
    yield session
    session.stop()
