"""The commands that print end quietly when their reader goes away (`scow data print |
head`), as a program killed by SIGPIPE would, while `scow run` ignores SIGPIPE: a broker
whose log reader goes away (`scow run 2>&1 | tee broker.log`, and tee ends; a closed
terminal) drops its log lines and keeps serving."""

from __future__ import annotations

import signal
import subprocess

from proton import Message
from proton.utils import BlockingConnection

from scow.core.testing import (
    broker_config,
    broker_processes,
    free_port,
    scow_command,
    wait_for,
    write_config,
)
from tests.system.broker import listening

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]


def test_data_print_into_a_closed_pipe_ends_quietly(tmp_path):
    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS)
        sent = subprocess.run(
            [
                scow_command(),
                "perf",
                "client",
                "--url",
                f"{broker.url}/filler",
                "--mode",
                "send",
                "--count",
                "3000",
                "--durable",
                "--warmup",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert broker.stop() == 0
    # `head -n 1` reads one line and exits: every later write meets a closed pipe
    pipeline = subprocess.run(
        f"set -o pipefail; '{scow_command()}' data print --data-dir '{tmp_path / 'data'}' "
        "| head -n 1",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pipeline.stdout.count("\n") == 1, pipeline.stdout
    assert pipeline.stderr == "", pipeline.stderr  # no traceback, no "Exception ignored"
    assert pipeline.returncode == 141  # 128 + SIGPIPE, what shells expect of such a reader


def test_run_keeps_serving_when_its_log_reader_goes_away(tmp_path):
    port = free_port()
    config = write_config(
        tmp_path / "scow.toml", broker_config(tmp_path / "data", plugins=PLUGINS, port=port)
    )
    broker = subprocess.Popen(
        [scow_command(), "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert broker.stderr is not None
        assert broker.stderr.readline()  # its first log line, then the reader goes away
        broker.stderr.close()
        wait_for(lambda: broker.poll() is not None or listening(port), 30, what="the listener")
        assert broker.poll() is None, f"scow run exited with {broker.returncode}"
        url = f"amqp://127.0.0.1:{port}"
        conn = BlockingConnection(url, timeout=10)  # each login is a log line nobody reads
        conn.create_sender("q").send(Message(body="after", durable=True))
        conn.close()
        conn = BlockingConnection(url, timeout=10)
        receiver = conn.create_receiver("q")
        assert receiver.receive(timeout=10).body == "after"
        receiver.accept()
        conn.close()
        assert broker.poll() is None, f"scow run exited with {broker.returncode}"
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(30) == 0
    finally:
        broker.kill()
