"""`scow perf client` against `scow perf sink` and against the broker, over real sockets."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from scow.protocols.amqp import perf

SCOW = [sys.executable, "-m", "scow.core.cli"]


def run_client(url: str, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SCOW, "perf", "client", "--url", url, "--timeout", str(timeout), *extra],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        check=False,
    )


def summary(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def running_sink(*extra: str) -> Iterator[str]:
    """`scow perf sink` on a free port, one process per connection; yields its URL."""
    proc = subprocess.Popen(
        [*SCOW, "perf", "sink", "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"listening on ([\d.]+):(\d+)", line)
        assert found, f"unexpected sink output {line!r}"
        yield f"amqp://{found[1]}:{found[2]}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def sink() -> Iterator[str]:
    with running_sink() as url:
        yield url


def test_client_against_sink_counts_every_message(sink):
    result = summary(run_client(f"{sink}/q", "--count", "2000", "--json"))
    assert result["sent"] == 2000
    assert result["outcomes"] == {"accepted": 2000}
    assert result["received"] == 2000
    assert result["unstamped"] == 0
    assert 0 <= result["latency_ms"]["p50"] <= result["latency_ms"]["p99"]
    assert result["latency_ms"]["p99"] <= result["latency_ms"]["max"]
    assert result["send_rate"] > 0 and result["receive_rate"] > 0


def test_client_against_sink_presettled_with_pairs_and_warmup(sink):
    done = run_client(
        f"{sink}/q", "--count", "1000", "--pairs", "2", "--warmup", "200", "--presettled", "--json"
    )
    result = summary(done)
    assert result["count"] == 2000
    assert result["warmup"] == 400
    assert result["sent"] == 2400
    assert result["outcomes"] == {}
    assert result["received"] == 2400


def test_single_process_sink_serves_every_connection():
    with running_sink("--single-process") as url:
        result = summary(run_client(f"{url}/q", "--count", "500", "--pairs", "3", "--json"))
    assert result["outcomes"] == {"accepted": 1500}
    assert result["received"] == 1500


def test_rate_paces_the_producers(sink):
    result = summary(run_client(f"{sink}/q", "--count", "1500", "--rate", "3000", "--json"))
    assert result["sent"] == 1500
    # 1500 messages at 3000 msg/s take half a second; unpaced they take a few ms
    assert result["send_rate"] < 3300


def test_readable_summary_names_rates_and_percentiles(sink):
    done = run_client(f"{sink}/q", "--count", "500", "--size", "1000", "--durable")
    assert done.returncode == 0, done.stderr
    for word in ("send rate", "receive rate", "p50", "p99.9", "max", "at-least-once, durable"):
        assert word in done.stdout


def test_client_through_the_broker_receives_what_it_sent(scow_broker_process):
    broker = scow_broker_process()
    result = summary(run_client(f"{broker.url}/perf.test", "--count", "2000", "--json"))
    assert result["sent"] == 2000
    assert result["outcomes"] == {"accepted": 2000}
    assert result["received"] == 2000
    assert result["unstamped"] == 0


def test_consumer_that_gets_nothing_times_out_with_a_count():
    with running_sink("--no-generate") as url:
        done = run_client(f"{url}/q", "--count", "100", timeout=2)
    assert done.returncode == 1
    assert "consumer: timed out after 2.0 s with 0 messages received" in done.stderr


def test_client_reports_a_refused_connection():
    port = _closed_port()
    done = run_client(f"amqp://127.0.0.1:{port}/q", "--count", "10", timeout=10)
    assert done.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}" in done.stderr


def test_url_must_name_an_address():
    with pytest.raises(perf.PerfError, match="no address"):
        perf.parse_url("amqp://127.0.0.1:5672")
    assert perf.parse_url("amqp://h:1234/a/b") == ("h", 1234, "a/b")
    assert perf.parse_url("amqp://h/q") == ("h", 5672, "q")


def test_stamp_offset_finds_the_body_in_small_and_large_messages():
    for size in (8, 100, 300):
        data, offset = perf.make_message(size, durable=size > 100)
        assert data[offset : offset + 8] == bytes(range(1, 9))
        assert perf.stamp_offset(data) == offset


def test_percentiles_use_the_nearest_rank():
    import array

    values = array.array("q", [i * 1_000_000 for i in range(1, 1001)])  # 1..1000 ms
    got = perf.percentiles(values)
    assert got == {"p50": 500.0, "p90": 900.0, "p99": 990.0, "p99.9": 999.0, "max": 1000.0}


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_send_mode_fills_a_queue_and_receive_mode_empties_it(scow_broker):
    broker = scow_broker()
    url = f"{broker.url}/filled"
    sent = summary(run_client(url, "--mode", "send", "--count", "500", "--json"))
    assert sent["mode"] == "send" and sent["sent"] == 500 and sent["receive_rate"] is None
    assert broker.queue_stats("filled")["message-count"] == 500
    got = summary(run_client(url, "--mode", "receive", "--count", "500", "--json"))
    assert got["received"] == 500 and got["latency_ms"] is None
    assert broker.queue_stats("filled") is None  # emptied, then auto-deleted with its consumer
