"""A sink's staging area as a restarted query meets it: its batch runs again with the same
partition and attempt numbers, so a STAGE of a part staged before starts it afresh; and
rows with duplicate ids go through staging and commit as any others (no Spark needed)."""

from __future__ import annotations

from scow.core.duplicates import DUPLICATE_ID_PROPERTY
from scow.core.testing import wait_for
from scow.protocols.amqp.codec import encode_message
from tests.spark.conftest import client, stream, wait_stream


def rows(bodies: list[str], batch: int) -> list[bytes]:
    return [
        encode_message(
            body,
            durable=True,
            application_properties={DUPLICATE_ID_PROPERTY: f"job:{batch}:0:{row}"},
        )
        for row, body in enumerate(bodies)
    ]


def test_a_part_staged_again_keeps_only_the_new_rows(streams):
    broker = streams.start({"out": stream()})
    c = client(broker.url)
    part = {"batch": 3, "partition": 0, "attempt": 0, "to": "out", "query": "q"}
    # the first driver's task staged two of its rows, then the driver died
    c.send(c.call("stream-sink", "job", "STAGE", part)["address"], rows(["a", "b"], 3))
    # the query restarted: the same batch, partition and attempt, all its rows
    again = c.call("stream-sink", "job", "STAGE", part)
    assert c.send(again["address"], rows(["a", "b", "c"], 3)) == 3
    c.call("stream-sink", "job", "COMMIT", {"batch": 3, "query": "q"}, [[0, 0]])
    wait_for(lambda: c.call("stream-sink", "job", "READ")["committed-batch"] == 3)
    wait_stream(broker, "out", 3)
    assert broker.queue_stats("out")["next-sequence"] == 3
    # the staging address kept no ids of its own; the address the rows went to did
    assert broker.call(lambda: sorted(broker.broker.duplicate_ids)) == ["out"]
    assert broker.call(lambda: len(broker.broker.duplicate_ids["out"])) == 3
    c.close()
