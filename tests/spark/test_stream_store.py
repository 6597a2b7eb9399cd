"""Stream stores: the file backend passes the conformance suite, and `[spark]
stream-store` chooses among the backends plugins register (`scow_register_stream_stores`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from scow.core import StreamStoreBackend, hookimpl
from scow.core.conformance.stream_store import OpenStore, StreamStoreConformance
from scow.core.testing import broker_config, scow_command, write_config
from scow.plugins.spark.segments import FileStreamStore, open_store
from tests.spark.conftest import PLUGINS, publish, stream, wait_stream


class TestFileStreamStore(StreamStoreConformance):
    @pytest.fixture
    def open_store(self) -> OpenStore:
        return lambda directory, name, segment_bytes: open_store(directory, name, segment_bytes, {})


class _CountingFileStores:
    """A plugin whose stream store is the file store, counting the streams it built."""

    def __init__(self) -> None:
        self.built: list[str] = []

    @hookimpl
    def scow_register_stream_stores(self) -> list[StreamStoreBackend]:
        def factory(data_dir: Path, name: str, segment_bytes: int, settings: Any) -> Any:
            self.built.append(name)
            return FileStreamStore(data_dir / "counted" / name, name, segment_bytes)

        return [StreamStoreBackend("counted", factory, "file segments, counted")]


def test_a_registered_stream_store_named_by_the_config_keeps_the_streams(scow_broker):
    plugin = _CountingFileStores()
    broker = scow_broker(
        plugin_objects={"counted-streams": plugin},
        plugins=PLUGINS,
        sections={"queues": {"s": stream()}, "spark": {"stream-store": "counted"}},
    )
    publish(broker.url, "s", ["a", "b"])
    wait_stream(broker, "s", 2)
    assert plugin.built == ["s"]
    data_dir = Path(broker.broker.config.section("broker")["data-dir"])
    assert len(list((data_dir / "counted" / "s").glob("*.seg"))) == 1


def test_an_unknown_stream_store_stops_scow_run_naming_it_and_the_available_ones(tmp_path):
    tables = broker_config(
        tmp_path / "data",
        plugins=PLUGINS,
        sections={"queues": {"s": stream()}, "spark": {"stream-store": "nope"}},
    )
    config = write_config(tmp_path / "scow.toml", tables)
    run = subprocess.run(
        [scow_command(), "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"scow: {config}: [spark] stream-store = 'nope': no enabled plugin provides it " in (
        run.stderr
    )
    assert "(available: file)" in run.stderr
    assert "Traceback" not in run.stderr
