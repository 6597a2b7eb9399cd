"""The commands that print end quietly when their reader goes away (`scow data print |
head`), as a program killed by SIGPIPE would, while `scow run` ignores SIGPIPE: a broker
whose log reader goes away (`scow run 2>&1 | tee broker.log`, and tee ends; a closed
terminal) drops its log lines and keeps serving.

A log reader that stalls (`scow run 2>&1 | less`, paused; a log shipper that fell behind)
must not stall the broker either. Before, once the pipe's 64 KiB were full the broker's
next log line blocked its event loop, and every client with it: about 500 connections'
log lines in, no client could connect. Now lines are written by a thread of their own;
while the reader does not take them, those past 1 MiB waiting are dropped, and a line
says how many once it reads again.

A service manager or a shell may start `scow run` with its standard streams closed
(`scow run <&- >&- 2>&-`, a supervisor that closes what it does not pass on). The
broker's first files and sockets then took descriptors 0 to 2: with stderr closed it
exited with status 1 before its first log line, and with stdin or stdout closed the
event loop's own descriptor became 0 or 1 and the clean stop ended in SIGABRT (libuv
refuses to close a standard descriptor). Now each closed one is opened on /dev/null at
start, as sshd and systemd do."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import pytest
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
from scow.protocols.amqp.codec import UInt
from tests.security import frames
from tests.system.broker import listening
from tests.wire.helpers import AMQP_HEADER, exchange

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


@pytest.mark.parametrize("closed", [(0,), (1,), (2,), (0, 1, 2)], ids=lambda c: f"closed{c}")
def test_run_with_standard_streams_closed_serves_and_stops_cleanly(tmp_path, closed):
    port = free_port()
    config = write_config(
        tmp_path / "scow.toml", broker_config(tmp_path / "data", plugins=PLUGINS, port=port)
    )

    def run() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [scow_command(), "run", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: [os.close(fd) for fd in closed],
        )

    broker = run()
    try:
        wait_for(lambda: broker.poll() is not None or listening(port), 30, what="the listener")
        assert broker.poll() is None, f"scow run exited with {broker.returncode}"
        conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10)
        conn.create_sender("q").send(Message(body="kept", durable=True))
        conn.close()
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(30) == 0
        broker = run()
        wait_for(lambda: broker.poll() is not None or listening(port), 30, what="the listener")
        conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10)
        receiver = conn.create_receiver("q")
        assert receiver.receive(timeout=10).body == "kept"
        receiver.accept()
        conn.close()
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(30) == 0
    finally:
        broker.kill()


def test_run_keeps_serving_while_its_log_reader_stalls(tmp_path):
    port = free_port()
    config = write_config(
        tmp_path / "scow.toml", broker_config(tmp_path / "data", plugins=PLUGINS, port=port)
    )
    unread, log = os.pipe()  # a reader that takes nothing until the end
    broker = subprocess.Popen(
        [scow_command(), "run", "--config", str(config)], stdout=log, stderr=log
    )
    os.close(log)
    try:
        wait_for(lambda: broker.poll() is not None or listening(port), 30, what="the listener")
        # each refused open is a log line: 8,000 of them, 1.7 MB, 26 full pipes
        greedy = AMQP_HEADER + frames.performative(frames.OPEN, ["x", None, None, None, UInt(1)])
        for _ in range(8_000):
            exchange(port, greedy, timeout=10)
        conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10)  # still served
        conn.create_sender("q").send(Message(body="served", durable=True))
        conn.close()
        assert broker.poll() is None, f"scow run exited with {broker.returncode}"
        read: list[bytes] = []
        reader = threading.Thread(target=lambda: read.extend(iter(os.fdopen(unread, "rb"))))
        reader.start()  # the reader takes lines again: the broker says what it dropped
        notice = "log lines dropped: the log's reader did not keep up"
        wait_for(lambda: notice.encode() in b"".join(read), 30, what="the dropped lines' count")
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(30) == 0
        reader.join(30)
    finally:
        broker.kill()
    text = b"".join(read).decode()
    assert "shutting down" in text[text.index(notice) :]  # lines after it are written
