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


KEEP_QUEUES = {"#": {"auto-delete-queues": False}}  # an emptied queue stays to be counted


def test_send_mode_fills_a_queue_and_receive_mode_empties_it(scow_broker):
    broker = scow_broker(address_settings=KEEP_QUEUES)
    url = f"{broker.url}/filled"
    sent = summary(run_client(url, "--mode", "send", "--count", "500", "--json"))
    assert sent["mode"] == "send"
    assert sent["sent"] == 500 and sent["outcomes"] == {"accepted": 500}
    assert sent["send_rate"] > 0
    assert sent["received"] is None and sent["receive_rate"] is None
    assert sent["unstamped"] is None and sent["latency_ms"] is None
    assert broker.queue_stats("filled")["message-count"] == 500

    got = summary(run_client(url, "--mode", "receive", "--count", "500", "--json"))
    assert got["mode"] == "receive"
    assert got["received"] == 500 and got["unstamped"] == 0
    assert got["receive_rate"] > 0
    assert got["sent"] is None and got["outcomes"] is None and got["send_rate"] is None
    assert got["latency_ms"] is None  # the stamps are from the send run
    stats = broker.queue_stats("filled")
    assert stats["message-count"] == 0 and stats["messages-acknowledged"] == 500


def test_json_keys_are_the_same_in_every_mode(scow_broker):
    broker = scow_broker(address_settings=KEEP_QUEUES)
    url = f"{broker.url}/keys"
    keys = [
        set(summary(run_client(url, "--mode", mode, "--count", "100", "--json")))
        for mode in ("send", "receive", "pairs")
    ]
    assert keys[0] == keys[1] == keys[2]


def test_presettled_send_mode_leaves_every_message_on_the_queue(scow_broker):
    # nothing waits for outcomes: the client must still not close before the broker has
    # read them all (a reset connection dropped hundreds of these)
    broker = scow_broker(address_settings=KEEP_QUEUES)
    done = run_client(
        f"{broker.url}/presettled", "--mode", "send", "--presettled", "--count", "20000",
        "--size", "4096", "--json",
    )  # fmt: skip
    result = summary(done)
    assert result["sent"] == 20000 and result["outcomes"] == {}
    assert broker.queue_stats("presettled")["message-count"] == 20000


def test_receive_mode_takes_count_and_leaves_the_rest(scow_broker):
    broker = scow_broker(address_settings=KEEP_QUEUES)
    url = f"{broker.url}/partly"
    summary(run_client(url, "--mode", "send", "--count", "3000", "--json"))
    got = summary(run_client(url, "--mode", "receive", "--count", "1000", "--json"))
    assert got["received"] == 1000
    assert broker.queue_stats("partly")["message-count"] == 2000
    got = summary(run_client(url, "--mode", "receive", "--count", "2000", "--presettled", "--json"))
    assert got["received"] == 2000
    assert broker.queue_stats("partly")["message-count"] == 0


def test_receive_mode_with_too_few_messages_times_out_with_a_count(scow_broker):
    broker = scow_broker(address_settings=KEEP_QUEUES)
    url = f"{broker.url}/short"
    summary(run_client(url, "--mode", "send", "--count", "10", "--json"))
    done = run_client(url, "--mode", "receive", "--count", "20", timeout=2)
    assert done.returncode == 1
    assert "consumer: timed out after 2.0 s with 10 messages received" in done.stderr


def test_send_mode_fails_when_the_broker_rejects_messages(scow_broker):
    broker = scow_broker(
        address_settings={"full.#": {"max-size-messages": 100, "address-full-policy": "FAIL"}}
    )
    done = run_client(f"{broker.url}/full.q", "--mode", "send", "--count", "300", "--json")
    assert done.returncode == 1  # sent, but not all accepted: the queue is not what was asked
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sent"] == 300
    assert result["outcomes"]["accepted"] == 100 and result["outcomes"]["rejected"] == 200


def test_readable_summary_of_send_and_receive_modes_leaves_out_what_did_not_run(scow_broker):
    broker = scow_broker(address_settings=KEEP_QUEUES)
    url = f"{broker.url}/readable"
    sent = run_client(url, "--mode", "send", "--count", "200")
    assert sent.returncode == 0, sent.stderr
    assert "1 producer(s) only" in sent.stdout and "send rate" in sent.stdout
    for absent in ("received", "receive rate", "latency"):
        assert absent not in sent.stdout
    got = run_client(url, "--mode", "receive", "--count", "200")
    assert got.returncode == 0, got.stderr
    assert "1 consumer(s) only" in got.stdout and "receive rate" in got.stdout
    for absent in ("sent", "send rate", "latency"):
        assert absent not in got.stdout


@pytest.mark.parametrize(
    ("flags", "option"),
    [(("--rate", "1000"), {"rate": 1000.0}), (("--durable",), {"durable": True})],
)
def test_receive_mode_refuses_options_that_shape_sending(flags, option):
    url = f"amqp://127.0.0.1:{_closed_port()}/q"  # refused before connecting: nothing listens
    message = f"{flags[0]} applies to sending; --mode receive sends nothing"
    done = run_client(url, "--mode", "receive", *flags, timeout=10)
    assert done.returncode == 2
    assert message in done.stderr
    with pytest.raises(perf.PerfError, match=message):
        perf.run_client(url, _options(mode="receive", **option))


def test_send_mode_accepts_rate_and_durable(scow_broker):
    broker = scow_broker(address_settings=KEEP_QUEUES)
    done = run_client(
        f"{broker.url}/paced", "--mode", "send", "--count", "300", "--rate", "600", "--durable",
        "--json",
    )  # fmt: skip
    result = summary(done)
    assert result["durable"] and result["rate_target"] == 600
    assert result["send_rate"] < 700  # 300 messages at 600 msg/s take about half a second
    assert broker.queue_stats("paced")["message-count"] == 300


def _options(**changes: object) -> dict[str, object]:
    options: dict[str, object] = {
        "count": 10, "size": 100, "pairs": 1, "durable": False, "presettled": False,
        "rate": 0.0, "warmup": 0, "credit": 100, "max_pending": 0, "timeout": 5.0,
        "mode": "pairs",
    }  # fmt: skip
    return options | changes


def test_duplicate_ids_are_each_message_s_own(scow_broker):
    broker = scow_broker(address_settings=KEEP_QUEUES)
    url = f"{broker.url}/identified"
    extra = ("--mode", "send", "--count", "300", "--pairs", "2", "--duplicate-ids", "--json")
    sent = summary(run_client(url, *extra))
    assert sent["outcomes"] == {"accepted": 600}
    assert broker.queue_stats("identified")["message-count"] == 600  # no id repeated
    ids = broker.call(lambda: broker.broker.address_stats(broker.broker.addresses["identified"]))
    assert ids["duplicate-ids"] == 600
