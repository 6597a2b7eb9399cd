"""One broker per data dir: a second `scow run` on it is refused, naming the directory and
the holder; a SIGKILLed holder's lock is free at once. A data dir or a port the broker
cannot have stops its start with a message naming it."""

from __future__ import annotations

import errno
import os
import socket
import subprocess

import pytest
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


def _start_refused(config_path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [scow_command(), "run", "--config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("place", ["under-a-file", "read-only-volume"])
def test_a_data_dir_that_cannot_be_written_stops_the_start_naming_it(tmp_path, place):
    """It said `cannot listen: [Errno 30] Read-only file system`: a port was not the problem."""
    if place == "under-a-file":
        (tmp_path / "volume").write_text("a file where a directory should be")
    else:
        if os.geteuid() != 0:
            pytest.skip("mounting a read-only volume takes root")
        (tmp_path / "volume").mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(tmp_path / "volume")],
            check=True,
        )
    try:
        data = tmp_path / "volume" / "data"
        result = _start_refused(_broker(tmp_path, "broker", data).config_path)
    finally:
        if place == "read-only-volume":
            subprocess.run(["umount", str(tmp_path / "volume")], check=True)
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("scow:")]
    assert f"data dir {data} cannot be used" in line, line
    assert ("Not a directory" if place == "under-a-file" else "Read-only file system") in line
    assert "must be a directory this user can write" in line


def test_a_port_in_use_stops_the_start_naming_the_address(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "broker.toml", broker_config(tmp_path / "data", plugins=PLUGINS, port=port)
        )
        result = _start_refused(config)
    assert result.returncode == 1, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("scow:")]
    assert f"cannot start: [Errno {errno.EADDRINUSE}]" in line and str(port) in line, line
    assert "address already in use" in line
