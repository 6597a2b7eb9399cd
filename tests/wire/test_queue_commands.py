"""`scow queue|address|connection` against a running broker, through its `$management` node."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from proton import Message
from proton.utils import ConnectionClosed, LinkDetached

from scow.core.testing import DEFAULT_PLUGINS, free_port, wait_for

from .helpers import bodies, connected, receive, send


def scow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scow.core.cli", *args], capture_output=True, text=True, timeout=60
    )


def scow_queue(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return scow("queue", *args, "--url", url)


def test_create_a_typed_queue_list_it_and_use_it(scow_broker):
    broker = scow_broker()
    made = scow_queue(
        broker.url, "create", "jobs", "--routing-type", "anycast",
        "--argument", "qpid.priorities=10", "--argument", "qpid.fairshare=0",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "queue 'jobs' created: priority on jobs (ANYCAST)" in made.stdout
    with connected(broker.url) as conn:
        send(conn, "jobs", *(Message(body=f"p{p}", priority=p) for p in (3, 9, 6)))
    listed = scow_queue(broker.url, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (jobs,) = [q for q in json.loads(listed.stdout) if q["name"] == "jobs"]
    assert jobs["queue-type"] == "priority" and jobs["message-count"] == 3
    assert jobs["arguments"] == {"qpid.priorities": 10, "qpid.fairshare": 0}
    assert all(not q["temporary"] for q in json.loads(listed.stdout))  # not the CLI's own
    table = scow_queue(broker.url, "list").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "ADDRESS", "TYPE"]
    assert table[1].split()[:4] == ["jobs", "jobs", "priority", "ANYCAST"]
    with connected(broker.url) as conn:
        assert bodies(receive(conn.create_receiver("jobs"), 3)) == ["p9", "p6", "p3"]


def test_list_shows_queues_of_types_with_their_own_figures(scow_broker):
    broker = scow_broker(plugins=[*DEFAULT_PLUGINS, "qpid-paged-queues"])
    for name, argument in (("plain", "x-queue-type=standard"), ("paged", "qpid.paging=true")):
        made = scow_queue(broker.url, "create", name, "--argument", argument)
        assert made.returncode == 0, made.stderr
    listed = scow_queue(broker.url, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    queues = {q["name"]: q for q in json.loads(listed.stdout)}
    assert queues["paged"]["queue-type"] == "qpid-paged" and queues["paged"]["pages"] >= 0
    assert queues["plain"]["queue-type"] == "standard" and queues["plain"]["pages"] is None


def test_refusals_name_the_reason_and_exit_non_zero(scow_broker):
    broker = scow_broker()
    both = scow_queue(
        broker.url, "create", "q", "--argument", "qpid.priorities=10",
        "--argument", "last-value-key=k",
    )  # fmt: skip
    assert both.returncode == 1
    assert "create refused (400)" in both.stderr and "for the same queue" in both.stderr
    typo = scow_queue(broker.url, "create", "q", "--argument", "qpid.priorites=10")
    assert "did you mean 'qpid.priorities'?" in typo.stderr
    assert scow_queue(broker.url, "create", "q").returncode == 0
    again = scow_queue(broker.url, "create", "q")
    assert again.returncode == 1 and "(409)" in again.stderr and "already exists" in again.stderr
    missing = scow_queue(broker.url, "delete", "nope")
    assert missing.returncode == 1 and "queue 'nope' does not exist" in missing.stderr
    assert broker.queue_stats("q") is not None  # what was refused changed nothing


def test_delete_refuses_a_queue_with_consumers_unless_forced(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        send(conn, "work", Message(body="w0"), Message(body="w1"))
        receiver = conn.create_receiver("work")
        assert bodies(receive(receiver, 1, accept=False)) == ["w0"]  # held unsettled
        refused = scow_queue(broker.url, "delete", "work")
        assert refused.returncode == 1 and "1 consumer(s)" in refused.stderr
        forced = scow_queue(broker.url, "delete", "work", "--force")
        assert forced.returncode == 0, forced.stderr
        assert broker.queue_stats("work") is None
        with pytest.raises(LinkDetached, match="amqp:resource-deleted"):
            conn.wait(lambda: False, timeout=5, msg="the broker to detach the consumer")
    assert broker.call(lambda: broker.broker.limits.messages) == 0  # both messages went


def test_unknown_operation_is_answered_501(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        replies = conn.create_receiver(None, dynamic=True)
        conn.create_sender("$management").send(
            Message(
                id="r1",
                reply_to=replies.link.remote_source.address,
                properties={"operation": "FROB", "type": "queue", "name": "x"},
            )
        )
        reply = replies.receive(timeout=10)
    assert reply.correlation_id == "r1"
    assert reply.properties["statusCode"] == 501
    assert "accepted: CREATE, READ, DELETE, QUERY" in reply.properties["statusDescription"]


def test_no_broker_is_exit_status_2(tmp_path):
    result = scow_queue(f"amqp://127.0.0.1:{free_port()}", "list")
    assert result.returncode == 2 and "cannot connect" in result.stderr


def test_stat_purge_and_the_address_and_connection_commands(scow_broker):
    broker = scow_broker()
    with connected(broker.url, container_id="watched") as conn:
        send(conn, "work", *(Message(body=f"w{i}") for i in range(4)))
        stat = scow_queue(broker.url, "stat").stdout.splitlines()
        assert stat[0].split()[:4] == ["NAME", "ADDRESS", "CONSUMER_COUNT", "MESSAGE_COUNT"]
        assert stat[1].split()[:5] == ["work", "work", "0", "4", "4"]
        purged = scow_queue(broker.url, "purge", "work")
        assert purged.returncode == 0 and "4 message(s) purged" in purged.stdout
        assert broker.queue_stats("work")["message-count"] == 0

        addresses = scow("address", "list", "--url", broker.url, "--json")
        assert addresses.returncode == 0, addresses.stderr
        (work,) = [a for a in json.loads(addresses.stdout) if a["name"] == "work"]
        assert work["routing-types"] == "ANYCAST" and work["queues"] == "work"

        listed = json.loads(scow("connection", "list", "--url", broker.url, "--json").stdout)
        (watched,) = [c for c in listed if c["container-id"] == "watched"]
        closed = scow("connection", "close", str(watched["id"]), "--url", broker.url)
        assert closed.returncode == 0, closed.stderr
        with pytest.raises(ConnectionClosed, match="amqp:connection:forced"):
            conn.wait(lambda: False, timeout=5, msg="the broker to close the connection")
    missing = scow("connection", "close", "424242", "--url", broker.url)
    assert missing.returncode == 1 and "connection 424242 is not open" in missing.stderr
    # each command's reply address went with its connection

    def reply_addresses() -> list[str]:
        return broker.call(lambda: [a for a in broker.broker.addresses if a.startswith("temp.")])

    wait_for(lambda: reply_addresses() == [], what="the reply addresses to go")


def test_move_and_retry_answer_once_every_message_is_moved(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        send(conn, "inbox", *(Message(body=f"m{i}", properties={"k": i % 2}) for i in range(1200)))
        receiver = conn.create_receiver("inbox")
        receive(receiver, 1, accept=False)
        receiver.reject()  # m0 goes to the dead-letter address DLA
        receiver.close()
    moved = scow_queue(broker.url, "move", "inbox", "--to", "odd", "--filter", "k = 1")
    assert moved.returncode == 0, moved.stderr
    assert "600 message(s) moved to 'odd'" in moved.stdout  # more than one batch
    refused = scow_queue(broker.url, "move", "inbox", "--to", "odd", "--filter", "k = = 1")
    assert refused.returncode == 1 and "move refused (400)" in refused.stderr, refused.stderr
    retried = scow_queue(broker.url, "retry", "DLA")
    assert retried.returncode == 0 and "1 message(s)" in retried.stdout, retried.stdout
    assert [broker.queue_stats(q)["message-count"] for q in ("inbox", "odd", "DLA")] == [
        600,
        600,
        0,
    ]
