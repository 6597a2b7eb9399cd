"""One broker per data dir: a second `scow run` on it is refused, naming the directory and
the holder; a SIGKILLed holder's lock is free at once."""

from __future__ import annotations

import subprocess

from proton import Message

from scow.core.testing import (
    BrokerProcess,
    amqp_client,
    broker_config,
    free_port,
    scow_command,
    write_config,
)
from tests.wire.helpers import consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging", "spark"]


def _broker(tmp_path, name: str, data_dir) -> BrokerProcess:
    port = free_port()
    config = write_config(
        tmp_path / f"{name}.toml", broker_config(data_dir, plugins=PLUGINS, port=port)
    )
    return BrokerProcess(config, port, tmp_path / f"{name}.log")


def test_second_broker_on_a_data_dir_is_refused_naming_the_holder(tmp_path):
    data = tmp_path / "data"
    first = _broker(tmp_path, "first", data).start()
    try:
        with amqp_client(first) as conn:
            conn.create_sender("orders").send(Message(body="kept", durable=True))
        second = _broker(tmp_path, "second", data)
        result = subprocess.run(
            [scow_command(), "run", "--config", str(second.config_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stdout + result.stderr
        assert str(data.resolve()) in result.stderr, result.stderr
        assert f"pid {first.proc.pid}" in result.stderr, result.stderr
        # the first broker is untouched and still serves
        assert [m.body for m in consume_all(first.url, "orders")] == ["kept"]
        assert first.proc.poll() is None
    finally:
        first.kill()


def test_a_sigkilled_brokers_data_dir_is_free_at_once(tmp_path):
    data = tmp_path / "data"
    first = _broker(tmp_path, "first", data).start()
    with amqp_client(first) as conn:
        conn.create_sender("orders").send(Message(body="survives", durable=True))
    first.kill()
    second = _broker(tmp_path, "second", data).start()  # fails if the lock were still held
    try:
        assert [m.body for m in consume_all(second.url, "orders")] == ["survives"]
    finally:
        assert second.stop() == 0


def test_import_and_compact_refuse_a_data_dir_a_broker_runs_on(tmp_path):
    data = tmp_path / "data"
    first = _broker(tmp_path, "first", data).start()
    try:
        with amqp_client(first) as conn:
            conn.create_sender("orders").send(Message(body="kept", durable=True))
        backup = tmp_path / "backup.jsonl"
        backup.write_text("")
        for command in (
            ["data", "compact", "--data-dir", str(data)],
            ["data", "import", "--data-dir", str(data), "--input", str(backup)],
            ["data", "import", "--config", str(first.config_path), "--input", str(backup)],
        ):
            result = subprocess.run(
                [scow_command(), *command], capture_output=True, text=True, timeout=60
            )
            assert result.returncode == 2, (command, result.stdout, result.stderr)
            assert f"pid {first.proc.pid}" in result.stderr, (command, result.stderr)
        assert [m.body for m in consume_all(first.url, "orders")] == ["kept"]
    finally:
        first.stop()
