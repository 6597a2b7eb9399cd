"""Stream stores: the file backend passes the conformance suite, and `[spark]
stream-store` chooses among the backends plugins register (`scow_register_stream_stores`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from scow.core import StreamStoreBackend, hookimpl
from scow.core.conformance.stream_store import OpenStore, StreamStoreConformance
from scow.core.page_frames import HEADER_SIZE
from scow.core.testing import broker_config, scow_command, write_config
from scow.plugins.spark.records import RECORD
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


@pytest.mark.parametrize("where", ["payload", "length"])
def test_a_damaged_frame_in_an_old_segment_is_passed_over_not_delivered(tmp_path, where):
    """A flipped byte in a record's payload was delivered as a changed message; in its
    frame's length, readers stopped there for the rest of the segment."""
    store = FileStreamStore(tmp_path / "s", "s", 4096, sync=False)
    store.open()
    for start in range(0, 100, 10):  # 100-byte records: several segments
        store.append([(i, 1, i, bytes([i]) * 100) for i in range(start, start + 10)])
    store.close()
    first = sorted((tmp_path / "s").glob("*.seg"))[0]
    data = bytearray(first.read_bytes())
    frame = HEADER_SIZE + RECORD.size + 100
    data[3 * frame + (HEADER_SIZE + 50 if where == "payload" else 2)] ^= 0xFF  # record 3
    first.write_bytes(data)
    again = FileStreamStore(tmp_path / "s", "s", 4096, sync=False)
    again.open()
    got: list[tuple[int, int, bytes]] = []
    seq = 0
    while seq < 100:
        out, seq = again.read(seq, 100, 7)
        got += out
    again.close()
    assert [rseq for rseq, _t, _b in got] == [i for i in range(100) if i != 3]
    assert all(body == bytes([rseq]) * 100 for rseq, _t, body in got)
