"""A sink's large commit, done a slice per pass of the broker's loop, as a crash meets it:
`scow run` killed with SIGKILL while the commit is part way through, or just after it is
durable, then restarted. Either every row of the batch is in the stream or none is (and
the driver's retry of the commit then writes each once); the broker answers READ while
it commits. A slice that fails is reported by READ once the batch is back in staging;
the rollback that puts it back lets other connections be answered while it runs, and a
COMMIT retried meanwhile changes nothing.
"""

from __future__ import annotations

import math
import threading

import pytest

from scow.core.broker import COMMIT_SLICE
from scow.core.testing import BrokerProcess, free_port, wait_for
from scow.plugins.spark.client import ClientError
from tests.spark.conftest import client, stream

#: Rows of the batch: a commit of many slices.
ROWS = 25 * COMMIT_SLICE


def stream_length(url: str) -> int:
    reader = client(url)
    try:
        return int(reader.call("stream", "out", "READ")["next-sequence"])
    finally:
        reader.close()


def distinct_rows(url: str) -> tuple[int, int]:
    """(rows, distinct bodies) in stream `out`."""
    from scow.plugins.spark.schema import to_batch

    reader = client(url)
    try:
        found: list[bytes] = []
        for messages in reader.read("out", 0, ROWS * 2 + 1):
            found += to_batch("out", messages).column(0).to_pylist()
        return len(found), len(set(found))
    finally:
        reader.close()


@pytest.mark.parametrize("kill", ["part-way", "durable"])
def test_broker_killed_during_a_large_commit_keeps_all_of_it_or_none(streams, tmp_path, kill):
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from scow.plugins.spark.source import Options, commit, stage

    port = free_port()
    config = streams.config({"out": stream()}, port=port)
    broker = BrokerProcess(config, port, tmp_path / "broker.log").start()
    try:
        options = Options.parse({"url": broker.url, "address": "out", "timeout": "60"})
        bodies = [f"r{i:06d}".encode() for i in range(ROWS)]
        batch = pa.RecordBatch.from_arrays([pa.array(bodies)], ["body"])
        staged = stage(options, "crash", 0, iter([batch]))
        driver = client(broker.url)
        answer = driver.call("stream-sink", "crash", "COMMIT", {"batch": 0}, [[0, 0]])
        assert answer == {"batch": 0}  # 202: committing
        if kill == "part-way":
            # answered between slices: the batch is still being committed
            state = driver.call("stream-sink", "crash", "READ")
            assert state["committing"] == [0] and state["committed-batch"] == -1, state
        else:
            wait_for(
                lambda: driver.call("stream-sink", "crash", "READ")["committed-batch"] == 0,
                60,
                0.01,
                "the batch to be committed",
            )
        broker.kill()
        driver.close()
        broker.start()

        after = client(broker.url)
        committed = after.call("stream-sink", "crash", "READ")["committed-batch"]
        after.close()
        if committed == 0:  # all of it: the stream has every row (its writer catches up)
            wait_for(lambda: stream_length(broker.url) >= ROWS, 60, 0.1, "every row")
        else:
            assert kill == "part-way", "a durable commit was lost"
            assert committed == -1
            assert stream_length(broker.url) == 0, "part of an undone commit is visible"
        # the driver, not knowing, commits again: a replay, or the whole batch from staging
        commit(options, "crash", 0, [staged])
        wait_for(lambda: stream_length(broker.url) >= ROWS, 60, 0.1, "every row")
        assert distinct_rows(broker.url) == (ROWS, ROWS)
    finally:
        broker.stop()


def test_a_large_commit_failing_in_a_later_slice_is_reported_and_changes_nothing(streams):
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from scow.plugins.spark.source import Options, commit, stage

    broker = streams.start(
        {"out": stream()}, address_settings={"nowhere": {"auto-create-addresses": False}}
    )
    options = Options.parse({"url": broker.url, "address": "out"})
    # the last row names an address that cannot be created: the last slice fails
    to = [None] * (ROWS - 1) + ["nowhere"]
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"x"] * ROWS), pa.array(to, pa.string())], ["body", "to"]
    )
    staged = stage(options, "bad", 0, iter([batch]))
    staging = "$scow.staging.bad.0.0.0"
    held = broker.queue_stats(staging)["message-count"]
    with pytest.raises(ClientError, match=r"batch 0 not committed .*address 'nowhere'"):
        commit(options, "bad", 0, [staged])
    driver = client(broker.url)
    state = driver.call("stream-sink", "bad", "READ")
    driver.close()
    assert state["committed-batch"] == -1 and state["committing"] == []
    assert "nowhere" in state["failed"]["0"]
    assert stream_length(broker.url) == 0
    # what the failed commit took goes back to staging (once the journal has its new
    # delivery counts), all of it
    wait_for(
        lambda: broker.queue_stats(staging)["message-count"] == held,
        what=f"{held} staged messages back in {staging}",
    )


def stage_failing_batch(broker, sink: str, messages: int) -> str:
    """Stage `messages` single rows (no packs: the most messages a rollback can be given
    for its rows) for `out`, the last one to address `nowhere`, which cannot be created:
    a commit of them fails in its last slice. Returns the staging queue's name."""
    pa = pytest.importorskip("pyarrow")
    from scow.plugins.spark.schema import messages_of

    driver = client(broker.url)
    try:
        staging = driver.call(
            "stream-sink", sink, "STAGE", {"batch": 0, "partition": 0, "attempt": 0, "to": "out"}
        )["address"]
        to = [None] * (messages - 1) + ["nowhere"]
        rows = pa.RecordBatch.from_arrays(
            [pa.array([b"r%06d" % n for n in range(messages)]), pa.array(to, pa.string())],
            ["body", "to"],
        )
        assert driver.send(staging, messages_of(rows)) == messages
    finally:
        driver.close()
    return str(staging)


class _Gate:
    """A hook the test installs on the broker's loop: it runs once per pass of the loop
    until a rollback with slices left is under way, then holds the loop (between two of
    its slices) until `release`, noting how many slices had run."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.held = threading.Event()
        self.released = threading.Event()
        self.slices_before = broker.call(lambda: broker.broker.rollback_slices)
        self.slices_at_hold = -1
        broker.loop.call_soon_threadsafe(self._pass)

    def _pass(self) -> None:
        b = self.broker.broker
        if not b.rollbacks:
            self.broker.loop.call_soon(self._pass)
            return
        self.slices_at_hold = b.rollback_slices - self.slices_before
        self.held.set()
        self.released.wait(30)

    def release(self) -> None:
        self.released.set()


class _NotingSocket:
    """A client's socket that notes each send: a request is then in the broker's socket."""

    def __init__(self, sock) -> None:
        self.sock = sock
        self.sent = threading.Event()

    def sendall(self, data) -> None:
        self.sock.sendall(data)
        self.sent.set()

    def __getattr__(self, name: str):
        return getattr(self.sock, name)


def test_another_connection_is_answered_between_two_slices_of_a_large_rollback(streams):
    """A commit of 10 slices' messages fails in its last slice and is rolled back, a slice
    per pass of the loop: the broker counts ceil(n / COMMIT_SLICE) slices, and a request
    another connection sent while slices were left (the loop held by the test's hook
    meanwhile, so it is waiting in the socket) is answered while the batch is still
    rolling back. (How long the loop is held per slice: benchmarks/commit_stall.py.)"""
    pytest.importorskip("pyspark")
    messages = 10 * COMMIT_SLICE
    broker = streams.start(
        {"out": stream()}, address_settings={"nowhere": {"auto-create-addresses": False}}
    )
    staging = stage_failing_batch(broker, "undo", messages)
    driver, other = client(broker.url), client(broker.url)
    answers: list[dict] = []
    try:
        other.call("stream-sink", "undo", "READ")  # its management links are open
        noting = other.sock = _NotingSocket(other.sock)
        gate = _Gate(broker)
        driver.call("stream-sink", "undo", "COMMIT", {"batch": 0}, [[0, 0]])
        assert gate.held.wait(60), "no rollback began"
        noting.sent.clear()
        asking = threading.Thread(
            target=lambda: answers.append(other.call("stream-sink", "undo", "READ"))
        )
        asking.start()
        try:
            assert noting.sent.wait(10), "the request was not sent"
        finally:
            gate.release()
        asking.join(30)
        wait_for(
            lambda: broker.queue_stats(staging)["message-count"] == messages,
            60,
            what=f"{messages} messages back in {staging}",
        )
        state = driver.call("stream-sink", "undo", "READ")
    finally:
        other.close()
        driver.close()
    slices = broker.call(lambda: broker.broker.rollback_slices) - gate.slices_before
    assert slices == math.ceil(messages / COMMIT_SLICE)
    # held with slices left: the request is read at the next pass, before the last slice
    assert 0 < gate.slices_at_hold <= slices - 2, gate.slices_at_hold
    assert answers and answers[0]["rolling-back"] == [0], answers
    assert "0" not in answers[0]["failed"]  # reported once all is back, not before
    assert "nowhere" in state["failed"]["0"] and state["rolling-back"] == []
    assert broker.queue_stats("out")["message-count"] == 0


def test_a_commit_retried_while_its_failed_attempt_rolls_back_commits_every_row(streams):
    """The retry of a failed commit, sent while the failed attempt's rollback is still
    putting messages back, is told the batch failed (it changes nothing) instead of
    committing the part already back; the next retry commits every row once."""
    pytest.importorskip("pyspark")
    from scow.core.model import RoutingType
    from scow.plugins.spark.source import Options, ScowCommit, commit

    messages = 10 * COMMIT_SLICE
    broker = streams.start(
        {"out": stream()}, address_settings={"nowhere": {"auto-create-addresses": False}}
    )
    staging = stage_failing_batch(broker, "retry", messages)
    options = Options.parse({"url": broker.url, "address": "out", "timeout": "60"})
    staged = ScowCommit(0, 0, "retry", brokers=(0,))
    driver = client(broker.url)
    try:
        driver.call("stream-sink", "retry", "COMMIT", {"batch": 0}, [[0, 0]])
        wait_for(
            lambda: (
                (s := driver.call("stream-sink", "retry", "READ"))["rolling-back"] or s["failed"]
            ),
            60,
            0,
            "the commit to fail",
        )
    finally:
        driver.close()

    def nowhere_exists() -> None:  # what failed the commit is mended: a retry can succeed
        broker.broker.create_address("nowhere", {RoutingType.ANYCAST})
        broker.broker.declare_queue("nowhere", routing_type="ANYCAST")

    broker.call(nowhere_exists)
    retries = 0
    while True:
        try:
            commit(options, "retry", 0, [staged])
            break
        except ClientError:  # the failure of the attempt its rollback was undoing
            retries += 1
            assert retries < 100
    wait_for(lambda: stream_length(broker.url) >= messages - 1, 60, 0.1, "every row")
    assert broker.queue_stats("out")["message-count"] == messages - 1
    assert broker.queue_stats("nowhere")["message-count"] == 1
    assert broker.queue_stats(staging) is None  # committed: staging discarded
