"""Queue types chosen by arguments (priority, last-value), exclusive and non-destructive
queues, and the address settings that make them the default; over real sockets."""

from __future__ import annotations

import subprocess
import sys

import pytest
from proton import Message
from proton.utils import LinkDetached

from scow.core.testing import DEFAULT_PLUGINS, wait_for

from .helpers import NodeProperties, bodies, connected, receive, send
from .test_config_errors import PLUGINS, run_rejected

TYPED = '"standard-queues", "priority-queues", "last-value-queues"'


def queues(**tables):
    return {"queues": {name: {"routing-type": "ANYCAST", **t} for name, t in tables.items()}}


def stock(name: str, price: int) -> Message:
    return Message(body=f"{name}={price}", properties={"stock": name}, durable=True)


def test_priority_queue_delivers_the_highest_priority_first(scow_broker):
    broker = scow_broker(sections=queues(jobs={"arguments": {"qpid.priorities": 10}}))
    assert broker.queue_stats("jobs") is not None  # created at startup from the config
    with connected(broker.url) as conn:
        send(conn, "jobs", *(Message(body=f"p{p}", priority=p) for p in (1, 4, 9, 7, 4)))
        assert bodies(receive(conn.create_receiver("jobs"), 5)) == ["p9", "p7", "p4", "p4", "p1"]


def test_priority_levels_group_the_low_priorities_as_qpid_does(scow_broker):
    # 2 levels: priorities 9 and up-to-8 (qpidd maps 0..10-k to the lowest level)
    broker = scow_broker(sections=queues(jobs={"arguments": {"x-qpid-priorities": 2}}))
    with connected(broker.url) as conn:
        send(conn, "jobs", *(Message(body=f"p{p}", priority=p) for p in (8, 1, 9, 5)))
        assert bodies(receive(conn.create_receiver("jobs"), 4)) == ["p9", "p8", "p1", "p5"]


def test_fairshare_lets_lower_priorities_through(scow_broker):
    broker = scow_broker(
        sections=queues(jobs={"arguments": {"qpid.priorities": 10, "qpid.fairshare": 2}})
    )
    with connected(broker.url) as conn:
        send(conn, "jobs", *(Message(body=f"hi{i}", priority=9) for i in range(4)))
        send(conn, "jobs", *(Message(body=f"lo{i}", priority=1) for i in range(2)))
        got = bodies(receive(conn.create_receiver("jobs"), 6))
    assert got == ["hi0", "hi1", "lo0", "hi2", "hi3", "lo1"]


def test_last_value_queue_keeps_the_newest_message_per_key(scow_broker):
    broker = scow_broker(sections=queues(prices={"arguments": {"last-value-key": "stock"}}))
    with connected(broker.url) as conn:
        send(conn, "prices", stock("A", 1), stock("B", 1), stock("A", 2), Message(body="no key"))
        assert broker.queue_stats("prices")["message-count"] == 3
        got = bodies(receive(conn.create_receiver("prices"), 3))
    assert got == ["B=1", "A=2", "no key"]
    assert broker.queue_stats("prices")["message-count"] == 0


def test_qpid_last_value_key_and_a_message_replacing_one_being_delivered(scow_broker):
    broker = scow_broker(
        sections=queues(prices={"arguments": {"qpid.last_value_queue_key": "stock"}})
    )
    with connected(broker.url) as conn:
        send(conn, "prices", stock("A", 1))
        receiver = conn.create_receiver("prices")
        assert bodies(receive(receiver, 1, accept=False)) == ["A=1"]
        send(conn, "prices", stock("A", 2))  # a newer value while A=1 is delivered
        receiver.release()  # A=1 comes back, but A=2 supersedes it
        receiver.close()
        assert bodies(receive(conn.create_receiver("prices"), 1)) == ["A=2"]
    assert broker.queue_stats("prices")["message-count"] == 0


def test_two_values_of_a_key_released_together_leave_only_the_newer(scow_broker):
    """Found by the chaos schedules (seed 30): a consumer holding two values of one key
    unsettled vanished; the newer, put back second, overwrote the older without
    acknowledging it, so the older one's record (or page) was never freed."""
    broker = scow_broker(sections=queues(prices={"arguments": {"last-value-key": "stock"}}))
    with connected(broker.url) as conn:
        send(conn, "prices", stock("A", 1))
        receiver = conn.create_receiver("prices", credit=10)
        assert bodies(receive(receiver, 1, accept=False)) == ["A=1"]
        send(conn, "prices", stock("A", 2))  # nothing waits with key A: delivered too
        assert bodies(receive(receiver, 1, accept=False)) == ["A=2"]
        receiver.close()  # both released, A=1 first
        stats = broker.queue_stats("prices")
        assert (stats["message-count"], stats["messages-acknowledged"]) == (1, 1)
        assert bodies(receive(conn.create_receiver("prices"), 1)) == ["A=2"]
    stats = broker.queue_stats("prices")
    assert (stats["message-count"], stats["memory-bytes"]) == (0, 0)


def test_default_last_value_key_makes_auto_created_queues_last_value(scow_broker):
    broker = scow_broker(address_settings={"ticks.#": {"default-last-value-key": "stock"}})
    with connected(broker.url) as conn:
        send(conn, "ticks.eu", stock("A", 1), stock("A", 2), stock("A", 3))
        assert bodies(receive(conn.create_receiver("ticks.eu"), 1)) == ["A=3"]
        send(conn, "plain", stock("A", 1), stock("A", 2))  # other addresses: standard
        assert bodies(receive(conn.create_receiver("plain"), 2)) == ["A=1", "A=2"]


def test_exclusive_queue_delivers_to_one_consumer_until_it_leaves(scow_broker):
    broker = scow_broker(sections=queues(work={"exclusive": True}))
    with connected(broker.url) as conn:
        first = conn.create_receiver("work", name="first")
        second = conn.create_receiver("work", name="second")
        send(conn, "work", *(Message(body=f"m{i}") for i in range(4)))
        assert bodies(receive(first, 4)) == ["m0", "m1", "m2", "m3"]
        first.close()
        send(conn, "work", Message(body="m4"))
        assert bodies(receive(second, 1)) == ["m4"]


def test_non_destructive_queue_shows_every_consumer_every_message(scow_broker):
    broker = scow_broker(address_settings={"news": {"default-non-destructive": True}})
    with connected(broker.url) as conn:
        send(conn, "news", Message(body="n0"), Message(body="n1"))
        one = conn.create_receiver("news", name="one")
        two = conn.create_receiver("news", name="two")
        # delivered settled, like to a browser: nothing for the client to acknowledge
        assert bodies(receive(one, 2, accept=False)) == ["n0", "n1"]
        assert bodies(receive(two, 2, accept=False)) == ["n0", "n1"]
    assert broker.queue_stats("news")["message-count"] == 2  # nothing was taken


def test_arguments_of_two_types_are_refused_at_startup(tmp_path):
    stderr = run_rejected(
        tmp_path,
        PLUGINS.replace('"standard-queues"', TYPED)
        + '[queues."q"]\narguments = { "qpid.priorities" = 10, "last-value-key" = "k" }\n',
    )
    assert "cannot specify" in stderr and "qpid.priorities" in stderr
    assert "last-value-key" in stderr and "for the same queue" in stderr


def test_an_unknown_argument_is_refused_with_the_accepted_ones(tmp_path):
    stderr = run_rejected(tmp_path, PLUGINS + '[queues."q"]\narguments = { "qpid.pagng" = true }\n')
    assert "unknown argument 'qpid.pagng'" in stderr
    assert "(a standard queue accepts: x-queue-type)" in stderr


def test_a_bad_argument_value_names_what_is_accepted(tmp_path):
    stderr = run_rejected(
        tmp_path,
        PLUGINS.replace('"standard-queues"', TYPED)
        + '[queues."q"]\narguments = { "qpid.priorities" = 42 }\n',
    )
    assert "qpid.priorities = 42: expected an integer from 1 to 10" in stderr


def test_durable_queues_of_each_type_come_back_with_their_arguments(scow_broker_process):
    plugins = ["amqp", "file-journal", "standard-queues", "priority-queues", "last-value-queues"]
    plugins.append("full-policies")
    declared = queues(
        jobs={"arguments": {"qpid.priorities": 10}},
        prices={"arguments": {"last-value-key": "stock"}},
    )
    broker = scow_broker_process(plugins=plugins, sections=declared)
    with connected(broker.url) as conn:
        send(conn, "jobs", *(Message(body=f"p{p}", priority=p, durable=True) for p in (1, 9, 5)))
        send(conn, "prices", *(stock("A", n) for n in (1, 2)))  # durable: see stock()
    broker.kill()
    # restarted without [queues]: type and arguments come from the bindings journal
    restarted = scow_broker_process(plugins=plugins, port=broker.port)
    with connected(restarted.url) as conn:
        assert bodies(receive(conn.create_receiver("jobs"), 3)) == ["p9", "p5", "p1"]
        send(conn, "prices", stock("A", 3))
        assert bodies(receive(conn.create_receiver("prices"), 1)) == ["A=3"]


def test_a_client_creates_a_typed_queue_at_attach_with_node_properties(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        created = NodeProperties({"durable": True, "qpid.priorities": 10})
        receiver = conn.create_receiver("orders", options=[created])
        stats = broker.queue_stats("orders")
        assert stats["routing-type"] == "ANYCAST" and stats["durable"]
        send(conn, "orders", *(Message(body=f"p{p}", priority=p) for p in (2, 8, 5)))
        assert bodies(receive(receiver, 3)) == ["p8", "p5", "p2"]
        # a sender's target works the same; an existing queue keeps what it is
        lvq = NodeProperties({"last-value-key": "stock"})
        conn.create_sender("prices", name="declaring", options=[lvq])
        send(conn, "prices", stock("A", 1), stock("A", 2))
        assert bodies(receive(conn.create_receiver("prices", name="r"), 1)) == ["A=2"]


def test_node_properties_of_two_queue_types_refuse_the_link(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        both = NodeProperties({"qpid.priorities": 10, "last-value-key": "k"})
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver("mixed", options=[both])
        assert "amqp:invalid-field" in str(refused.value)
        assert "cannot specify" in str(refused.value)
        send(conn, "other", Message(body="still served"))
        assert bodies(receive(conn.create_receiver("other"), 1)) == ["still served"]
    assert broker.queue_stats("mixed") is None


def test_export_and_import_carry_queue_types_and_arguments(scow_broker_process, tmp_path):
    plugins = ["amqp", "file-journal", "standard-queues", "priority-queues", "full-policies"]
    broker = scow_broker_process(
        plugins=plugins, sections=queues(jobs={"arguments": {"qpid.priorities": 10}})
    )
    with connected(broker.url) as conn:
        send(conn, "jobs", *(Message(body=f"p{p}", priority=p, durable=True) for p in (2, 7)))
    assert broker.stop() == 0
    data, export, fresh = tmp_path / "data", tmp_path / "export.jsonl", tmp_path / "fresh"
    scow = [sys.executable, "-m", "scow.core.cli", "data"]
    for args in (
        ["export", "--data-dir", str(data), "--output", str(export)],
        ["import", "--data-dir", str(fresh), "--input", str(export)],
    ):
        done = subprocess.run([*scow, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert '"queue-type":"priority"' in export.read_text()
    data.rename(tmp_path / "old")
    fresh.rename(data)
    restarted = scow_broker_process(plugins=plugins, port=broker.port)  # no [queues] now
    with connected(restarted.url) as conn:
        send(conn, "jobs", Message(body="p9", priority=9, durable=True))
        assert bodies(receive(conn.create_receiver("jobs"), 3)) == ["p9", "p7", "p2"]


@pytest.mark.parametrize(
    "arguments",
    [{}, {"qpid.priorities": 10}, {"last-value-key": "k"}, {"qpid.paging": True}],
    ids=["standard", "priority", "last-value", "qpid-paged"],
)
def test_the_expiry_scan_finds_expired_messages_among_plain_ones_in_every_queue_type(
    scow_broker, arguments
):
    """A standard queue keeps plain messages (no expiry) compactly and the scan reads
    only the others: a message that expires waiting, and one delivered, put back and
    expiring then, both go; none of the rest does."""
    broker = scow_broker(
        plugins=[*DEFAULT_PLUGINS, "qpid-paged-queues"],
        sections=queues(q={"arguments": arguments}),
    )
    plain = [Message(body=f"plain{n}", properties={"k": f"p{n}"}) for n in range(30)]
    with connected(broker.url) as conn:
        send(conn, "q", Message(body="put back", ttl=0.5, properties={"k": "b"}))
        receiver = conn.create_receiver("q", credit=1)
        assert receiver.receive(timeout=10).body == "put back"
        receiver.close()  # unsettled: it goes back to wait, and expires there
        send(conn, "q", *plain[:20], Message(body="stale", ttl=0.5, properties={"k": "s"}))
        send(conn, "q", *plain[20:])
        wait_for(
            lambda: (broker.queue_stats("ExpiryQueue") or {}).get("message-count") == 2,
            what="the expiry scan to move both",
        )
        assert broker.queue_stats("q")["messages-expired"] == 2
        assert bodies(receive(conn.create_receiver("q"), 30)) == [f"plain{n}" for n in range(30)]
        assert sorted(bodies(receive(conn.create_receiver("ExpiryQueue"), 2))) == [
            "put back",
            "stale",
        ]
