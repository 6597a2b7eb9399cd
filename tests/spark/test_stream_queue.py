"""Stream queues on the wire: sequence numbers, positioned reads, cursors, retention,
staging, restarts and crashes (no Spark needed)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from proton import Described, Message, Timeout, symbol, timestamp, ulong
from proton.reactor import Filter

from scow.core import cli
from scow.core.testing import broker_processes, wait_for
from scow.plugins.spark.client import ClientError
from tests.spark.conftest import (
    PLUGINS,
    Producer,
    client,
    management,
    publish,
    stream,
    wait_stream,
)
from tests.wire.helpers import connected

OFFSET = symbol("scow:stream-offset")


def receive_bodies(url: str, queue: str, filters: dict, count: int, **kwargs) -> list[Message]:
    with connected(url) as conn:
        receiver = conn.create_receiver(
            queue, name=f"r{time.monotonic_ns()}", options=Filter(filters), **kwargs
        )
        got = [receiver.receive(timeout=5) for _ in range(count)]
        receiver.accept()
        with pytest.raises(Timeout):  # and nothing more
            receiver.receive(timeout=0.3)
        return got


def test_messages_get_sequence_numbers_and_times_and_stay_after_reading(streams):
    broker = streams.start({"s": stream()})
    before = int(time.time() * 1000)
    publish(broker.url, "s", [f"m{i}" for i in range(10)])
    wait_stream(broker, "s", 10)
    first = receive_bodies(broker.url, "s", {symbol("scow:stream-offset"): "first"}, 10)
    again = receive_bodies(broker.url, "s", {symbol("scow:stream-offset"): "first"}, 10)
    assert [m.id for m in first] == [m.id for m in again] == [f"m{i}" for i in range(10)]
    assert [m.annotations["x-opt-sequence-number"] for m in first] == list(range(10))
    times = [m.annotations["x-opt-enqueued-time"] for m in first]
    assert before <= times[0] <= times[-1] <= int(time.time() * 1000)
    assert broker.queue_stats("s")["message-count"] == 10  # settling removed nothing


def test_positioned_reads_start_and_end(streams):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", [f"m{i}" for i in range(6)])
    wait_stream(broker, "s", 6)
    offset, end = symbol("scow:stream-offset"), symbol("scow:stream-end")
    ids = lambda got: [m.id for m in got]  # noqa: E731
    assert ids(receive_bodies(broker.url, "s", {offset: 3}, 3)) == ["m3", "m4", "m5"]
    assert ids(receive_bodies(broker.url, "s", {offset: 1, end: 3}, 2)) == ["m1", "m2"]
    assert ids(receive_bodies(broker.url, "s", {offset: "last"}, 1)) == ["m5"]
    middle = management(broker.url, "stream", "s", "READ")
    stamp = timestamp(int(time.time() * 1000) + 1)
    time.sleep(0.01)
    publish(broker.url, "s", ["late"])
    assert ids(receive_bodies(broker.url, "s", {offset: stamp}, 1)) == ["late"]
    assert middle["next-sequence"] == 6
    with connected(broker.url) as conn:  # next: only what comes after attaching
        receiver = conn.create_receiver("s", name="n", options=Filter({offset: "next"}))
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.3)
        publish(broker.url, "s", ["new"])
        assert receiver.receive(timeout=5).id == "new"


def test_a_seek_by_time_reads_the_store_off_the_event_loop(streams):
    """SEEK (what a Spark query's startingTimestamp asks) reads segments, and the first
    read of an old one reads all of it: on the event loop, it stalled every connection."""
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", ["early"])
    stamp = int(time.time() * 1000) + 1
    time.sleep(0.01)
    publish(broker.url, "s", ["late"])
    store = broker.call(lambda: broker.broker.queues["s"].store)
    seek, threads = store.seek, []

    def watched(when: int) -> int | None:
        threads.append(threading.current_thread())
        return seek(when)

    store.seek = watched
    assert management(broker.url, "stream", "s", "SEEK", timestamp=stamp) == {"sequence": 1}
    (thread,) = threads
    assert thread is not broker._thread and thread.name.startswith("scow-stream-reader")
    with pytest.raises(ClientError, match="404"):
        management(broker.url, "stream", "nowhere", "SEEK", timestamp=stamp)


def test_a_write_that_rolls_several_segments_leaves_every_record_readable(streams):
    pytest.importorskip("pyarrow")
    from scow.plugins.spark.schema import to_batch

    # 7 records a segment: one publish is written in batches that roll two or more
    broker = streams.start({"s": stream(**{"segment-bytes": 2000})})
    publish(broker.url, "s", [f"m{i:04d}" + "x" * 100 for i in range(100)])
    wait_stream(broker, "s", 100)
    for start in range(0, 100, 3):
        c = client(broker.url)
        read = [m for batch in c.read("s", start, 100, address="s") for m in batch]
        c.close()
        sequences = to_batch("s", read).column("sequence").to_pylist()
        assert sequences == list(range(start, 100)), f"read from {start}"


def test_selectors_apply_and_leave_gaps(streams):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", [f"m{i}" for i in range(6)], app=lambda b: {"odd": int(b[1:]) % 2})
    wait_stream(broker, "s", 6)
    filters = {
        symbol("scow:stream-offset"): "first",
        symbol("selector"): _selector("odd = 1"),
    }
    got = receive_bodies(broker.url, "s", filters, 3)
    assert [m.annotations["x-opt-sequence-number"] for m in got] == [1, 3, 5]


def _selector(text: str) -> Described:
    return Described(symbol("apache.org:selector-filter:string"), text)


def _records_of_pack(got: Message) -> list[Message]:
    """The records a pack delivery carries (length-prefixed in its one data section)."""
    body, records, at = got.body, [], 0
    while at < len(body):
        size = int.from_bytes(body[at : at + 4], "big")
        record = Message()
        record.decode(body[at + 4 : at + 4 + size])
        records.append(record)
        at += 4 + size
    return records


def test_a_reader_asking_for_packs_gets_its_records_several_to_a_delivery(streams):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", [f"m{i}" for i in range(10)], app=lambda b: {"odd": int(b[1:]) % 2})
    wait_stream(broker, "s", 10)
    pack = symbol("scow:stream-pack")
    got = receive_bodies(broker.url, "s", {OFFSET: "first", pack: ulong(4)}, 3)
    assert [m.annotations["x-opt-scow-records"] for m in got] == [4, 4, 2]
    records = [r for m in got for r in _records_of_pack(m)]
    assert [r.id for r in records] == [f"m{i}" for i in range(10)]
    assert [r.annotations["x-opt-sequence-number"] for r in records] == list(range(10))
    assert broker.queue_stats("s")["messages-delivered"] == 10  # records, not deliveries
    # a selector picks records before they are packed
    filters = {OFFSET: "first", pack: ulong(8), symbol("selector"): _selector("odd = 1")}
    (odd,) = receive_bodies(broker.url, "s", filters, 1)
    assert [r.id for r in _records_of_pack(odd)] == ["m1", "m3", "m5", "m7", "m9"]


def test_bad_pack_size_refuses_the_link_and_names_what_is_accepted(streams):
    broker = streams.start({"s": stream()})
    with (
        connected(broker.url) as conn,
        pytest.raises(
            Exception, match=r"scow:stream-pack = 0: expected records per delivery, 1 to"
        ),
    ):
        conn.create_receiver(
            "s", name="bad", options=Filter({OFFSET: "first", symbol("scow:stream-pack"): 0})
        )


def test_bad_start_position_refuses_the_link_and_names_it(streams):
    broker = streams.start({"s": stream()})
    with connected(broker.url) as conn, pytest.raises(Exception, match=r"stream-offset.*soon"):
        conn.create_receiver(
            "s", name="bad", options=Filter({symbol("scow:stream-offset"): "soon"})
        )
    c = client(broker.url)  # the broker goes on serving
    assert c.call("stream", "s", "READ")["next-sequence"] == 0
    c.close()


def test_bad_stream_argument_is_refused_naming_it(streams):
    broker = streams.start({"s": stream()})
    c = client(broker.url)
    with pytest.raises(ClientError, match="retention-bytes = -5"):
        c.call(
            "queue",
            "t",
            "CREATE",
            body={"arguments": {"x-queue-type": "stream", "retention-bytes": -5}},
        )
    with pytest.raises(ClientError, match="unknown argument 'retention-byte'; did you mean"):
        c.call(
            "queue",
            "t",
            "CREATE",
            body={"arguments": {"x-queue-type": "stream", "retention-byte": 1}},
        )
    c.close()


def test_cursors_move_forward_only_and_are_deleted(streams):
    broker = streams.start({"s": stream()})
    c = client(broker.url)
    assert c.call("stream", "s", "CURSOR-MOVE", {"cursor": "q1", "sequence": 10})["sequence"] == 10
    assert c.call("stream", "s", "CURSOR-MOVE", {"cursor": "q1", "sequence": 4})["sequence"] == 10
    assert c.call("stream", "s", "CURSOR-MOVE", {"cursor": "q1", "sequence": 10})["sequence"] == 10
    assert c.call("stream", "s", "CURSOR-READ", {"cursor": "q1"})["sequence"] == 10
    assert c.request("stream", "s", "CURSOR-READ", {"cursor": "nope"})[0] == 404
    status, text, _ = c.request("stream", "s", "CURSOR-MOVE", {"cursor": "q1", "sequence": -1})
    assert status == 400 and "sequence = -1" in text
    c.call("stream", "s", "CURSOR-DELETE", {"cursor": "q1"})
    assert c.request("stream", "s", "CURSOR-READ", {"cursor": "q1"})[0] == 404
    assert c.request("stream", "nope", "READ")[0] == 404
    c.close()


def test_unused_cursor_is_dropped_after_its_ttl(streams):
    broker = streams.start({"s": stream(**{"cursor-ttl": 300})})
    c = client(broker.url)
    c.call("stream", "s", "CURSOR-MOVE", {"cursor": "gone", "sequence": 1})
    c.close()
    # reading a cursor counts as using it: watch the count instead
    wait_for(
        lambda: broker.queue_stats("s")["cursors"] == 0, timeout=5, what="the cursor to expire"
    )
    assert management(broker.url, "stream", "s", "READ")["cursor-positions"] == {}


def test_retention_bytes_deletes_whole_oldest_segments(streams):
    broker = streams.start({"s": stream(**{"segment-bytes": 2000, "retention-bytes": 5000})})
    publish(broker.url, "s", [f"m{i:03d}" + "x" * 100 for i in range(200)])
    wait_stream(broker, "s", 200)
    state = management(broker.url, "stream", "s", "READ")
    assert state["first-sequence"] > 0 and state["stored-bytes"] <= 5000 + 2200
    assert state["segments-deleted"] > 0
    got = receive_bodies(
        broker.url, "s", {symbol("scow:stream-offset"): 0}, 200 - state["first-sequence"]
    )
    assert got[0].annotations["x-opt-sequence-number"] == state["first-sequence"]


def test_retention_cursors_keeps_what_a_cursor_has_not_passed(streams):
    broker = streams.start({"s": stream(**{"segment-bytes": 2000, "retention-cursors": True})})
    publish(broker.url, "s", [f"m{i:03d}" + "x" * 100 for i in range(100)])
    wait_stream(broker, "s", 100)
    c = client(broker.url)
    c.call("stream", "s", "CURSOR-MOVE", {"cursor": "b", "sequence": 30})
    c.call("stream", "s", "CURSOR-MOVE", {"cursor": "a", "sequence": 80})
    first = c.call("stream", "s", "READ")["first-sequence"]
    assert 0 < first <= 30
    c.call("stream", "s", "CURSOR-DELETE", {"cursor": "b"})
    c.call("stream", "s", "CURSOR-MOVE", {"cursor": "a", "sequence": 80})
    assert 30 < c.call("stream", "s", "READ")["first-sequence"] <= 80
    c.close()


def test_retention_time_deletes_old_segments(streams):
    broker = streams.start({"s": stream(**{"segment-bytes": 500, "retention-time": 300})})
    publish(broker.url, "s", [f"m{i}" + "x" * 100 for i in range(20)])
    time.sleep(0.4)
    publish(broker.url, "s", ["fresh" + "x" * 100] * 5)
    wait_for(
        lambda: broker.queue_stats("s")["first-sequence"] >= 20, timeout=5, what="time retention"
    )


def test_stream_survives_restart_and_never_reuses_sequence_numbers(streams):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", ["a", "b", "c"])
    wait_stream(broker, "s", 3)
    c = client(broker.url)
    c.call("stream", "s", "CURSOR-MOVE", {"cursor": "q", "sequence": 2})
    c.close()
    broker.stop()
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", ["d"])
    got = receive_bodies(broker.url, "s", {symbol("scow:stream-offset"): "first"}, 4)
    assert [(m.id, m.annotations["x-opt-sequence-number"]) for m in got] == [
        ("a", 0),
        ("b", 1),
        ("c", 2),
        ("d", 3),
    ]
    assert management(broker.url, "stream", "s", "CURSOR-READ", cursor="q")["sequence"] == 2


def test_sigkill_mid_traffic_keeps_every_accepted_message_once(tmp_path: Path):
    config_queues = {"queues": {"s": stream()}}
    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS, sections=config_queues)
        publish(broker.url, "s", [f"m{i}" for i in range(3000)])  # each one accepted
        broker.kill()  # at once: segment writes and journal acks may be in flight
        broker = start(plugins=PLUGINS, sections=config_queues, port=broker.port)
        c = client(broker.url)
        wait_for(lambda: c.call("stream", "s", "READ")["next-sequence"] >= 3000, timeout=10)
        got = [m for batch in c.read("s", 0, 10**9) for m in batch]
        c.close()
    from scow.protocols.amqp.codec import MessageInfo

    ids = [MessageInfo(m).message_id for m in got]
    assert sorted(ids) == sorted(f"m{i}" for i in range(3000))  # all there, none twice


def test_sigkill_mid_traffic_keeps_every_acknowledged_message_once_written_only_to_the_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    config_queues = {"queues": {"s": stream()}}
    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS, sections=config_queues)
        producer = Producer(broker.url, "s", lanes=4)
        wait_for(lambda: len(producer.acknowledged) >= 400, 30, what="400 acknowledged sends")
        broker.kill()  # mid-traffic: sends in flight, segment writes unsynced
        acked = producer.stop()
        # written once: the journal holds none of them, the stream's segments all
        data = ["--data-dir", str(tmp_path / "data")]
        assert cli.main(["data", "export", *data, "--output", str(tmp_path / "e.jsonl")]) == 0
        assert "'messages': 0," in capsys.readouterr().out
        broker = start(plugins=PLUGINS, sections=config_queues, port=broker.port)
        c = client(broker.url)
        got = [m for batch in c.read("s", 0, 10**9) for m in batch]
        c.close()
    from scow.protocols.amqp.codec import MessageInfo

    ids = [MessageInfo(m).message_id for m in got]
    assert len(ids) == len(set(ids)), "a message was stored twice"
    missing = set(acked) - set(ids)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:3]}"


# --------------------------------------------------------------------------- staging


def test_staged_messages_are_invisible_until_commit_and_a_replayed_commit_is_ignored(streams):
    broker = streams.start({"out": stream()})
    c = client(broker.url)
    staged = c.call(
        "stream-sink", "sink1", "STAGE", {"batch": 7, "partition": 0, "attempt": 0, "to": "out"}
    )
    c.send(staged["address"], [m for m in _encoded(["x", "y"])])
    with connected(broker.url) as conn, pytest.raises(Exception, match="staging area"):
        conn.create_receiver(staged["address"], name="peek")
    assert c.call("stream", "out", "READ")["next-sequence"] == 0
    orphan = c.call("stream-sink", "sink1", "STAGE", {"batch": 7, "partition": 1, "attempt": 0})
    c.send(orphan["address"], _encoded(["lost"]))
    assert c.request("stream-sink", "sink1", "COMMIT", {"batch": 7}, [[0, 0]])[0] == 202
    wait_for(lambda: c.call("stream-sink", "sink1", "READ")["committed-batch"] == 7)
    wait_stream(broker, "out", 2)
    assert not [n for n in broker.call(lambda: list(broker.broker.queues)) if "staging" in n]
    again = c.request("stream-sink", "sink1", "COMMIT", {"batch": 7}, [[0, 0]])
    assert again[0] == 200 and again[2]["replayed"]
    assert c.request("stream-sink", "sink1", "COMMIT", {"batch": 5}, [[0, 0]])[2]["replayed"]
    c.close()
    broker.stop()
    broker = streams.start({"out": stream()})  # the committed batch is remembered
    assert management(broker.url, "stream-sink", "sink1", "READ")["committed-batch"] == 7
    assert broker.queue_stats("out")["next-sequence"] == 2


def test_a_batch_another_query_committed_past_is_refused_also_after_a_restart(streams):
    broker = streams.start({"out": stream()})
    c = client(broker.url)
    old = {"batch": 4, "partition": 0, "to": "out", "query": "q-old"}
    c.send(c.call("stream-sink", "job", "STAGE", old)["address"], _encoded(["x"]))
    c.call("stream-sink", "job", "COMMIT", {"batch": 4, "query": "q-old"}, [[0, 0]])
    wait_for(lambda: c.call("stream-sink", "job", "READ")["committed-batch"] == 4)
    c.close()
    broker.stop()
    broker = streams.start({"out": stream()})  # the marker keeps the query
    c = client(broker.url)
    assert c.call("stream-sink", "job", "READ")["query"] == "q-old"
    new = {"batch": 0, "partition": 0, "to": "out", "query": "q-new"}
    status, text, _ = c.request("stream-sink", "job", "STAGE", new)
    assert status >= 400
    assert "sink 'job' has committed batch 4 (query q-old); query q-new writes batch 0" in text
    status, text, _ = c.request("stream-sink", "job", "COMMIT", new, [[0, 0]])
    assert status >= 400 and "committed batch 4" in text
    replay = c.request("stream-sink", "job", "COMMIT", {"batch": 3, "query": "q-old"}, [])
    assert replay[0] == 200 and replay[2]["replayed"]  # its own query's replay: ignored
    later = {"batch": 5, "partition": 0, "to": "out", "query": "q-new"}
    c.send(c.call("stream-sink", "job", "STAGE", later)["address"], _encoded(["y"]))
    c.call("stream-sink", "job", "COMMIT", {"batch": 5, "query": "q-new"}, [[0, 0]])
    wait_for(lambda: c.call("stream-sink", "job", "READ")["query"] == "q-new")
    c.close()
    wait_stream(broker, "out", 2)


def test_abort_discards_what_was_staged(streams):
    broker = streams.start({"out": stream()})
    c = client(broker.url)
    staged = c.call("stream-sink", "s2", "STAGE", {"batch": 0, "partition": 0, "to": "out"})
    c.send(staged["address"], _encoded(["x"]))
    assert c.call("stream-sink", "s2", "ABORT", {"batch": 0})["discarded"] == 1
    status, text, _ = c.request("stream-sink", "s2", "COMMIT", {"batch": 0}, [[0, 0]])
    assert status == 404 and "nothing staged" in text
    c.close()


def test_orphaned_staging_is_dropped_after_the_staging_ttl(streams):
    broker = streams.start({"out": stream()}, spark={"staging-ttl": 300, "housekeeping-period": 50})
    c = client(broker.url)
    staged = c.call("stream-sink", "s3", "STAGE", {"batch": 0, "partition": 0, "to": "out"})
    c.send(staged["address"], _encoded(["x"]))
    c.close()
    queues = lambda: broker.call(lambda: list(broker.broker.queues))  # noqa: E731
    assert staged["address"] in queues()
    wait_for(lambda: staged["address"] not in queues(), timeout=5, what="the staging TTL")
    assert broker.queue_stats("out")["next-sequence"] == 0


def test_a_staged_batch_that_paged_is_refused_at_commit_not_half_committed(streams):
    paging = {"$scow.staging.#": {"max-size-bytes": 2000, "address-full-policy": "PAGE"}}
    broker = streams.start({"out": stream()}, address_settings=paging)
    c = client(broker.url)
    staged = c.call("stream-sink", "big", "STAGE", {"batch": 0, "partition": 0, "to": "out"})
    c.send(staged["address"], _encoded([f"m{i:03d}" + "x" * 100 for i in range(50)]))
    status, text, _ = c.request("stream-sink", "big", "COMMIT", {"batch": 0}, [[0, 0]])
    assert status == 400 and "went to its address's pages" in text
    assert c.call("stream-sink", "big", "READ")["committed-batch"] == -1
    c.close()
    assert broker.queue_stats("out")["next-sequence"] == 0


def _encoded(bodies: list[str]) -> list[bytes]:
    from scow.protocols.amqp.codec import encode_message

    return [encode_message(b, durable=True, properties={"message_id": b}) for b in bodies]
