"""STOMP 1.2 through the stomp plugin, with stomp.py over real sockets."""

from __future__ import annotations

import time

import pytest
import stomp
from proton import Message
from stomp.exception import ConnectFailedException
from stomp_helpers import PLUGINS, Recorder, client, raw, read_until_closed, start

from scow.core.testing import BrokerThread, wait_for
from tests.security.helpers import users_file
from tests.system.poison import payloads
from tests.wire.helpers import connected


def _count(broker, queue: str) -> int:
    stats = broker.queue_stats(queue)
    return stats["message-count"] if stats else 0


def test_sent_message_reaches_a_subscriber_with_its_headers(scow_broker):
    broker = start(scow_broker)
    with client(broker) as (conn, seen):
        conn.subscribe("/queue/orders", id="1")
        conn.send("/queue/orders", b"one", headers={"colour": "red"}, receipt="r")
        seen.wait_receipt("r")
        (message,) = seen.wait_messages(1)
    assert message.body == b"one"
    assert message.headers["colour"] == "red"
    assert message.headers["destination"] == "/queue/orders"
    assert message.headers["subscription"] == "1"
    assert _count(broker, "orders") == 0  # ack auto: taken as it was sent


def _users(tmp_path, **settings):
    path = users_file(tmp_path / "users", {"ann": ("s3cret", ["app"])})
    return {"security": {"users-file": str(path), "login-failure-delay": 0, **settings}}


def test_login_is_checked_against_the_broker_users(scow_broker, tmp_path):
    broker = start(scow_broker, sections=_users(tmp_path, **{"allow-anonymous": False}))
    with client(broker, connect=False) as (conn, _seen), pytest.raises(ConnectFailedException):
        conn.connect(wait=True)  # anonymous: refused
    with client(broker, connect=False) as (conn, _seen), pytest.raises(ConnectFailedException):
        conn.connect("ann", "wrong", wait=True)
    with client(broker, username="ann", passcode="s3cret") as (conn, seen):
        conn.send("/queue/in", b"x", receipt="r")
        seen.wait_receipt("r")
    assert _count(broker, "in") == 1


def test_wrong_login_gets_an_error_frame_naming_the_user(scow_broker, tmp_path):
    broker = start(scow_broker, sections=_users(tmp_path))
    sock = raw(broker)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:ann\npasscode:no\n\n\x00")
    answer = read_until_closed(sock)
    assert answer.startswith(b"ERROR\n")
    assert b"login failed for user 'ann'" in answer


def test_permissions_are_checked_per_destination(scow_broker, tmp_path):
    everything = ["send", "consume", "createAddress", "createNonDurableQueue"]
    sections = _users(tmp_path)
    sections["security-settings"] = {
        "open.#": {permission: ["app"] for permission in everything},
        "closed.#": {"consume": ["app"]},
    }
    broker = start(scow_broker, sections=sections)
    with client(broker, username="ann", passcode="s3cret") as (conn, seen):
        conn.send("/queue/open.orders", b"fine", receipt="r")
        seen.wait_receipt("r")
        conn.send("/queue/closed.orders", b"refused", receipt="no")
        error = seen.wait_error()
        assert error.headers["receipt-id"] == "no"
        assert "lacks permission 'send' on address 'closed.orders'" in error.headers["message"]
        assert seen.disconnected.wait(10)
    assert _count(broker, "open.orders") == 1
    assert _count(broker, "closed.orders") == 0


def test_connection_limits_count_stomp_connections(scow_broker, tmp_path):
    broker = start(scow_broker, sections=_users(tmp_path, **{"max-connections": 1}))
    with client(broker):
        sock = raw(broker)
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
        assert b"max-connections (1)" in read_until_closed(sock)
    with client(broker) as (conn, seen):  # the first one's slot was given back
        conn.send("/queue/q", b"x", receipt="r")
        seen.wait_receipt("r")


def test_a_stomp_socket_past_what_the_open_file_limit_leaves_is_closed_at_once(scow_broker):
    broker = start(scow_broker)
    broker.broker.security.max_sockets = 1
    with client(broker):
        assert read_until_closed(raw(broker)) == b""  # closed, nothing said
    wait_for(lambda: broker.call(lambda: broker.broker.security.sockets) == 0, 10)
    with client(broker) as (conn, seen):  # the first one's socket was given back
        conn.send("/queue/q", b"x", receipt="r")
        seen.wait_receipt("r")


def test_a_stopping_broker_tells_its_stomp_clients_why(scow_broker):
    broker = start(scow_broker)
    sock = raw(broker)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
    assert sock.recv(65536).startswith(b"CONNECTED")
    broker.stop()
    heard = read_until_closed(sock)
    assert heard.startswith(b"ERROR") and b"the broker is shutting down" in heard


def test_client_ack_acknowledges_every_earlier_message(scow_broker):
    broker = start(scow_broker)
    with client(broker) as (conn, seen):
        for i in range(4):
            conn.send("/queue/cumulative", str(i).encode())
        conn.subscribe("/queue/cumulative", id="s", ack="client")
        messages = seen.wait_messages(4)
        conn.ack(messages[2].headers["ack"], receipt="acked")
        seen.wait_receipt("acked")
        assert _count(broker, "cumulative") == 1  # the 4th is still unacknowledged
    # disconnecting gives back what was not acknowledged
    wait_for(lambda: broker.queue_stats("cumulative")["delivering-count"] == 0)
    assert _count(broker, "cumulative") == 1


def test_client_individual_ack_settles_only_that_message(scow_broker):
    broker = start(scow_broker)
    with client(broker) as (conn, seen):
        for i in range(3):
            conn.send("/queue/single", str(i).encode())
        conn.subscribe("/queue/single", id="s", ack="client-individual")
        messages = seen.wait_messages(3)
        conn.ack(messages[2].headers["ack"], receipt="acked")
        seen.wait_receipt("acked")
        assert _count(broker, "single") == 2


def test_a_full_window_opens_again_once_acknowledged(scow_broker):
    broker = start(scow_broker, sections={"stomp": {"subscription-window": 2}})
    with client(broker) as (conn, seen):
        for i in range(5):
            conn.send("/queue/window", str(i).encode())
        conn.subscribe("/queue/window", id="s", ack="client-individual")
        first = seen.wait_messages(2)
        conn.send("/queue/other", b"x", receipt="r")  # a round trip: no third came meanwhile
        seen.wait_receipt("r")
        assert len(seen.messages) == 2
        for message in first:
            conn.ack(message.headers["ack"])
        for message in seen.wait_messages(4)[2:]:
            conn.ack(message.headers["ack"])
        last = seen.wait_messages(5)[4]
        conn.ack(last.headers["ack"], receipt="done")
        seen.wait_receipt("done")
    assert [m.body for m in seen.messages] == [b"0", b"1", b"2", b"3", b"4"]
    assert _count(broker, "window") == 0


def test_nack_redelivers_and_dead_letters_after_max_attempts(scow_broker):
    broker = start(scow_broker, address_settings={"poison": {"max-delivery-attempts": 2}})
    with client(broker) as (conn, seen):
        conn.send("/queue/poison", b"bad")
        conn.subscribe("/queue/poison", id="s", ack="client-individual")
        first = seen.wait_messages(1)[0]
        assert "redelivered" not in first.headers
        conn.nack(first.headers["ack"])
        second = seen.wait_messages(2)[1]
        assert second.headers["redelivered"] == "true"
        conn.nack(second.headers["ack"], receipt="n")
        seen.wait_receipt("n")
    wait_for(lambda: _count(broker, "DLA") == 1, what="the message in the dead-letter queue")
    assert _count(broker, "poison") == 0


def test_transaction_sends_appear_at_commit_and_abort_discards(scow_broker):
    broker = start(scow_broker)
    with client(broker) as (conn, seen):
        conn.begin("t1")
        conn.send("/queue/tx", b"a", transaction="t1")
        conn.send("/queue/tx", b"b", transaction="t1", receipt="sent")
        seen.wait_receipt("sent")
        assert _count(broker, "tx") == 0
        conn.commit("t1", receipt="committed")
        seen.wait_receipt("committed")
        assert _count(broker, "tx") == 2
        conn.begin("t2")
        conn.send("/queue/tx", b"c", transaction="t2")
        conn.abort("t2", receipt="aborted")
        seen.wait_receipt("aborted")
        assert _count(broker, "tx") == 2


def test_acks_in_an_aborted_transaction_are_undone(scow_broker):
    broker = start(scow_broker)
    with client(broker) as (conn, seen):
        conn.send("/queue/txack", b"a")
        conn.subscribe("/queue/txack", id="s", ack="client-individual")
        message = seen.wait_messages(1)[0]
        conn.begin("t")
        conn.ack(message.headers["ack"], transaction="t")
        conn.abort("t")
        again = seen.wait_messages(2)[1]  # rolled back: delivered again
        assert again.body == b"a" and again.headers["redelivered"] == "true"
        conn.begin("t2")
        conn.ack(again.headers["ack"], transaction="t2")
        conn.commit("t2", receipt="c")
        seen.wait_receipt("c")
    assert _count(broker, "txack") == 0


def test_selector_header_filters_what_a_subscription_gets(scow_broker):
    broker = start(scow_broker)
    with client(broker) as (conn, seen):
        conn.subscribe("/topic/prices", id="red", headers={"selector": "colour = 'red'"})
        for colour in ("blue", "red", "green", "red"):
            conn.send("/topic/prices", colour.encode(), headers={"colour": colour})
        conn.send("/topic/prices", b"end", headers={"colour": "red"}, receipt="r")
        seen.wait_receipt("r")
        wait_for(lambda: len(seen.messages) == 3, what="the red messages")
        assert [m.body for m in seen.messages] == [b"red", b"red", b"end"]


def test_prefixes_choose_anycast_and_multicast_as_artemis_does(scow_broker):
    broker = start(scow_broker)
    with client(broker) as (one, seen_one), client(broker) as (two, seen_two):
        one.subscribe("/topic/news", id="a")
        two.subscribe("/topic/news", id="b")
        one.subscribe("/queue/work", id="w1")
        two.subscribe("/queue/work", id="w2")
        one.send("/topic/news", b"everyone", receipt="n")
        for i in range(4):
            one.send("/queue/work", str(i).encode())
        seen_one.wait_receipt("n")
        assert seen_one.wait_messages(1)[0].body == b"everyone"
        assert seen_two.wait_messages(1)[0].body == b"everyone"
        wait_for(lambda: len(seen_one.messages) + len(seen_two.messages) == 6)
        # anycast: each work item went to one subscriber only
        work = [m.body for m in seen_one.messages + seen_two.messages if m.body != b"everyone"]
        assert sorted(work) == [b"0", b"1", b"2", b"3"]
        address = broker.call(lambda: broker.broker.get_address("work"))
        assert {r.value for r in address.routing_types} == {"ANYCAST"}


def test_stomp_message_reaches_amqp_with_headers_as_application_properties(scow_broker):
    broker = start(scow_broker)
    with client(broker) as (conn, seen):
        conn.send(
            "/queue/interop",
            b"from stomp",
            headers={"kind": "order", "correlation-id": "c-1", "persistent": "true"},
            receipt="r",
        )
        seen.wait_receipt("r")
    with connected(broker.url) as amqp:
        receiver = amqp.create_receiver("interop")
        message = receiver.receive(timeout=10)
        receiver.accept()
    assert message.body == b"from stomp"
    assert message.properties == {"kind": "order"}
    assert message.correlation_id == "c-1"
    assert message.durable


def test_amqp_message_reaches_stomp_with_application_properties_as_headers(scow_broker):
    broker = start(scow_broker)
    with connected(broker.url) as amqp:
        sender = amqp.create_sender("back")
        sender.send(Message(body="from amqp", properties={"kind": "reply", "n": 3}, priority=7))
    with client(broker) as (conn, seen):
        conn.subscribe("/queue/back", id="s")
        (message,) = seen.wait_messages(1)
    assert message.body == b"from amqp"
    assert message.headers["kind"] == "reply"
    assert message.headers["n"] == "3"
    assert message.headers["priority"] == "7"


def test_blocked_address_gets_an_error_and_close_and_keeps_what_was_accepted(scow_broker):
    broker = start(
        scow_broker,
        address_settings={"full.#": {"max-size-bytes": 6500, "address-full-policy": "BLOCK"}},
    )
    accepted = 0
    with client(broker) as (conn, seen):
        for i in range(20):
            receipt = f"r{i}"
            conn.send("/queue/full.block", b"x" * 1000, receipt=receipt)
            wait_for(lambda r=receipt: r in seen.receipts or seen.errors, what="an answer")
            if seen.errors:
                break
            accepted += 1
        error = seen.wait_error()
        assert "is full and blocks producers" in error.headers["message"]
        assert seen.disconnected.wait(10)
    assert 4 <= accepted < 20
    assert _count(broker, "full.block") == accepted
    # other clients carry on
    with client(broker) as (conn, seen):
        conn.send("/queue/other", b"fine", receipt="ok")
        seen.wait_receipt("ok")


def test_disk_full_closes_a_stomp_producer_with_an_error(scow_broker):
    broker = start(scow_broker)
    limits = broker.broker.limits

    with client(broker) as (conn, seen):
        conn.send("/queue/disk", b"before", receipt="r")
        seen.wait_receipt("r")
        broker.call(lambda: limits.block("disk"))
        conn.send("/queue/disk", b"refused")
        assert "blocked by: disk" in seen.wait_error().headers["message"]
        assert seen.disconnected.wait(10)
    broker.call(lambda: limits.unblock("disk"))
    assert _count(broker, "disk") == 1


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"SNED\ndestination:q\n\nx\x00", b"unknown command 'SNED'"),
        (b"SEND\ndestination:q\nbad header\n\nx\x00", b"has no ':'"),
        (b"SEND\ndestination:q\\t\n\nx\x00", b"undefined escape"),
        (b"SEND\ndestination:q\ncontent-length:1\n\nxyz\x00", b"no NUL after the 1 bytes"),
        (b"SEND\n\nx\x00", b"required 'destination' header"),
        (b"ACK\nid:nope\n\n\x00", b"'nope' is not an unacknowledged message"),
    ],
)
def test_malformed_frame_gets_an_error_and_others_keep_working(scow_broker, frame, says):
    broker = start(scow_broker)
    with client(broker) as (other, seen):
        sock = raw(broker)
        sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00" + frame)
        answer = read_until_closed(sock)
        assert answer.startswith(b"CONNECTED\n")
        assert b"\nERROR\n" in answer.replace(b"\x00", b"\n")
        assert says in answer
        other.send("/queue/alive", b"still", receipt="r")
        seen.wait_receipt("r")
    assert _count(broker, "alive") == 1


def test_frame_over_max_frame_size_is_refused(scow_broker):
    broker = start(scow_broker, sections={"stomp": {"max-frame-size": 4096}})
    sock = raw(broker)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
    sock.sendall(b"SEND\ndestination:q\n\n" + b"x" * 8000 + b"\x00")
    answer = read_until_closed(sock)
    assert b"exceeds [stomp] max-frame-size 4096" in answer


def test_a_frame_before_connect_and_an_old_version_are_refused(scow_broker):
    broker = start(scow_broker)
    sock = raw(broker)
    sock.sendall(b"SEND\ndestination:q\n\nx\x00")
    assert b"first frame must be CONNECT" in read_until_closed(sock)
    sock = raw(broker)
    sock.sendall(b"CONNECT\naccept-version:1.0\nhost:x\n\n\x00")
    answer = read_until_closed(sock)
    assert answer.startswith(b"ERROR\n") and b"version:1.1,1.2" in answer


def test_broker_sends_heart_beats_and_drops_a_silent_client(scow_broker):
    broker = start(
        scow_broker, sections={"stomp": {"heart-beat-send": 100, "heart-beat-receive": 100}}
    )
    with client(broker, heartbeats=(0, 100)) as (_conn, seen):
        wait_for(lambda: seen.heartbeats >= 3, what="three heart-beats from the broker")
    sock = raw(broker)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:100,0\n\n\x00")
    started = time.monotonic()
    answer = read_until_closed(sock)  # we never beat: the broker gives up on us
    assert b"heart-beat:100,100" in answer
    assert b"no frame or heart-beat from the client" in answer
    assert time.monotonic() - started < 5


def test_receipt_of_a_persistent_send_means_it_survives_a_restart(scow_broker):
    plugins = [p if p != "memory-journal" else "file-journal" for p in PLUGINS]
    broker = start(scow_broker, plugins=plugins)
    with client(broker) as (conn, seen):
        for i in range(5):
            conn.send("/queue/kept", str(i).encode(), headers={"persistent": "true"})
        conn.disconnect(receipt="bye")  # its receipt covers every frame before it
        assert "bye" in seen.receipts
    config = broker.config_path
    broker.stop()
    again = BrokerThread(config).start()
    try:
        assert _count(again, "kept") == 5
    finally:
        again.stop()


def test_durable_subscription_keeps_messages_while_the_subscriber_is_away(scow_broker):
    broker = start(scow_broker)
    headers = {"durable-subscription-name": "audit"}
    with client(broker, headers={"client-id": "c1"}) as (conn, _seen):
        conn.subscribe("/topic/events", id="d", headers=headers)
    with client(broker) as (conn, seen):
        conn.send("/topic/events", b"while away", receipt="r")
        seen.wait_receipt("r")
    with client(broker, headers={"client-id": "c1"}) as (conn, seen):
        conn.subscribe("/topic/events", id="d", headers=headers)
        assert seen.wait_messages(1)[0].body == b"while away"


def test_stomp_py_default_connection_speaks_1_1(scow_broker):
    broker = start(scow_broker)
    conn = stomp.Connection11([("127.0.0.1", broker.port_of("stomp"))], auto_decode=False)
    seen = Recorder()
    conn.set_listener("r", seen)
    conn.connect(wait=True)
    try:
        conn.subscribe("/queue/v11", id="s", ack="client")
        conn.send("/queue/v11", b"old")
        message = seen.wait_messages(1)[0]
        conn.ack(message.headers["message-id"], "s", receipt="a")
        seen.wait_receipt("a")
    finally:
        conn.disconnect()
    assert _count(broker, "v11") == 0


def test_a_malformed_amqp_message_is_dead_lettered_not_delivered_to_a_stomp_subscriber(
    scow_broker,
):
    """A message an AMQP client sent with nonsense sections (accepted as bytes) cannot be
    made a STOMP frame: it failed the subscriber's connection, once per subscriber."""
    broker = start(scow_broker, address_settings={"orders": {"dead-letter-address": "DLQ"}})
    poison = payloads(30, 3)  # every tenth well-formed, with body "good <n>"
    with connected(broker.url) as conn:
        sender = conn.create_sender("orders")
        for data in poison:
            sender.link.delivery(sender.link.delivery_tag())
            sender.link.send(data)
            sender.link.advance()
        conn.create_sender("flush")  # a round trip: every transfer is in
    wait_for(lambda: _count(broker, "orders") + _count(broker, "DLQ") >= 3)
    stored = _count(broker, "orders")
    with client(broker) as (conn, seen):
        conn.subscribe("/queue/orders", id="1")
        wait_for(lambda: _count(broker, "orders") == 0, what="the queue to be drained")
        conn.send("/queue/orders", b"after", receipt="r")  # the connection still serves
        seen.wait_receipt("r")
        wait_for(lambda: any(m.body == b"after" for m in seen.messages), what="'after'")
    bodies = [m.body for m in seen.messages]
    good = [b for b in bodies if b.startswith(b"good ") or b == b"after"]
    assert good == [b"good 0", b"good 10", b"good 20", b"after"], bodies
    assert not seen.errors
    dead = _count(broker, "DLQ")
    assert dead >= 1 and len(bodies) + dead == stored + 1  # the STOMP converter is lenient
