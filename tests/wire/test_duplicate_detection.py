"""Duplicate detection over the wire: `_AMQ_DUPL_ID` resends are accepted and dropped,
inside a transaction they fail the commit, and each address keeps its last
id-cache-size ids (restarts and crashes: tests/durability/test_duplicate_ids.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from proton import Delivery, Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container
from proton.utils import SendException

from scow.core.model import RouteStatus
from scow.core.testing import wait_for
from scow.protocols.amqp.codec import encode_message
from scow.protocols.amqp.format import AMQP_FORMAT

from .helpers import Capabilities, bulk_send, connected, consume_all

DUPL = "_AMQ_DUPL_ID"


def dupl(body: str, key: Any, **kw: Any) -> Message:
    return Message(body=body, durable=True, properties={DUPL: key}, **kw)


def send_outcomes(url: str, address: str, *messages: Message) -> list[int]:
    """Send each message and return the outcome the broker settled it with."""
    with connected(url) as conn:
        sender = conn.create_sender(address)
        return [sender.send(m).remote_state for m in messages]


def count(broker: Any, queue: str) -> int:
    stats = broker.queue_stats(queue)
    return stats["message-count"] if stats is not None else 0


def address_stats(broker: Any, name: str) -> dict[str, Any]:
    return broker.call(lambda: broker.broker.address_stats(broker.broker.addresses[name]))


@pytest.mark.parametrize("level", ["debug", "info"])
def test_a_dropped_resend_is_logged_at_debug_only(scow_broker, capsys, level):
    """Above debug the line is not even built (`debug_enabled`): structlog's filtered
    call alone cost a resend about 2 us."""
    broker = scow_broker(sections={"broker": {"log-level": level}})
    send_outcomes(broker.url, "logged", dupl("first", "l-1"), dupl("resent", "l-1"))
    lines = [line for line in capsys.readouterr().err.splitlines() if "duplicate" in line]
    if level == "debug":
        (line,) = lines
        assert "duplicate message dropped" in line and "'l-1'" in line
    else:
        assert lines == []


def test_a_resent_id_is_accepted_and_not_routed(scow_broker):
    broker = scow_broker()
    outcomes = send_outcomes(
        broker.url, "orders", dupl("first", "order-1"), dupl("resent", "order-1")
    )
    assert outcomes == [Delivery.ACCEPTED, Delivery.ACCEPTED]
    assert count(broker, "orders") == 1
    stats = broker.call(broker.broker.stats)
    assert stats["messages-duplicate"] == 1
    assert stats["address-stats"]["orders"]["duplicate-ids"] == 1
    # messages without an id are never deduplicated
    send_outcomes(broker.url, "orders", Message(body="plain"), Message(body="plain"))
    assert [m.body for m in consume_all(broker.url, "orders")] == ["first", "plain", "plain"]


def test_binary_and_string_ids_are_both_detected_and_never_equal(scow_broker):
    broker = scow_broker()
    send_outcomes(
        broker.url,
        "bin",
        dupl("b1", b"\x00\x01\xff"),
        dupl("b1 again", b"\x00\x01\xff"),
        dupl("s1", "x"),
        dupl("s1 again", "x"),
        dupl("binary x", b"x"),  # another type: another id
    )
    assert [m.body for m in consume_all(broker.url, "bin")] == ["b1", "s1", "binary x"]


def test_non_durable_messages_are_deduplicated_too(scow_broker):
    broker = scow_broker()
    once = Message(body="n", durable=False, properties={DUPL: "nd-1"})
    send_outcomes(broker.url, "transient", once, once, Message(body="other", properties={}))
    assert [m.body for m in consume_all(broker.url, "transient")] == ["n", "other"]


def test_each_address_has_its_own_cache(scow_broker):
    broker = scow_broker()
    send_outcomes(broker.url, "left", dupl("l", "same"))
    send_outcomes(broker.url, "right", dupl("r", "same"), dupl("r again", "same"))
    assert count(broker, "left") == 1 and count(broker, "right") == 1


def test_an_id_is_caught_for_id_cache_size_admissions_then_forgotten_with_its_generation(
    scow_broker,
):
    broker = scow_broker(address_settings={"small": {"id-cache-size": 3}})
    send_outcomes(broker.url, "small", *(dupl(f"m{i}", f"id{i}") for i in range(1, 4)))
    send_outcomes(broker.url, "small", dupl("dup", "id1"))  # still cached
    assert count(broker, "small") == 3
    send_outcomes(broker.url, "small", *(dupl(f"m{i}", f"id{i}") for i in range(4, 7)))
    # id3 is exactly id-cache-size admissions old: caught; the cache holds up to 2 x 3
    send_outcomes(broker.url, "small", dupl("dup", "id3"))
    assert address_stats(broker, "small")["duplicate-ids"] == 6
    send_outcomes(broker.url, "small", dupl("m7", "id7"))  # id1-id3 go, their generation
    assert address_stats(broker, "small")["duplicate-ids"] == 4
    send_outcomes(broker.url, "small", dupl("m1 again", "id1"), dupl("dup", "id4"))
    assert [m.body for m in consume_all(broker.url, "small")] == [
        *(f"m{i}" for i in range(1, 8)),
        "m1 again",
    ]


def test_an_id_cache_size_of_0_set_at_run_time_turns_detection_off_then_on_afresh(
    scow_broker,
):
    """The address keeps a reference to its cache (looked up once, not per message): a
    cache the settings drop must not stay in use through it."""
    broker = scow_broker()
    send_outcomes(broker.url, "live", dupl("a", "a"), dupl("dup", "a"))
    broker.call(lambda: broker.broker.set_address_settings("live", {"id-cache-size": 0}))
    send_outcomes(broker.url, "live", dupl("a again", "a"), dupl("a thrice", "a"))
    broker.call(lambda: broker.broker.set_address_settings("live", {"id-cache-size": 10}))
    send_outcomes(broker.url, "live", dupl("a, cached afresh", "a"), dupl("dup", "a"))
    assert [m.body for m in consume_all(broker.url, "live")] == [
        "a",
        "a again",
        "a thrice",
        "a, cached afresh",
    ]


def test_the_broker_wide_id_cache_size_applies_where_addresses_do_not_say(scow_broker):
    broker = scow_broker(sections={"broker": {"id-cache-size": 1}})
    send_outcomes(
        broker.url,
        "one",
        dupl("a", "a"),
        dupl("dup", "a"),
        dupl("b", "b"),
        dupl("dup", "a"),  # one admission old: still caught
        dupl("c", "c"),
        dupl("a again", "a"),
    )
    assert [m.body for m in consume_all(broker.url, "one")] == ["a", "b", "c", "a again"]


def test_id_cache_size_zero_turns_detection_off(scow_broker):
    broker = scow_broker(address_settings={"off": {"id-cache-size": 0}})
    send_outcomes(broker.url, "off", dupl("a", "a"), dupl("a again", "a"), dupl("n", 3))
    send_outcomes(broker.url, "on", dupl("a", "a"), dupl("a again", "a"))
    assert count(broker, "off") == 3 and count(broker, "on") == 1


def test_an_id_neither_string_nor_binary_is_refused_naming_the_property(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        sender = conn.create_sender("typed")
        try:
            sender.send(dupl("n", 17))
        except SendException as exc:
            assert exc.state == Delivery.REJECTED
        else:
            raise AssertionError("a numeric _AMQ_DUPL_ID was accepted")
        assert sender.send(dupl("s", "17")).remote_state == Delivery.ACCEPTED
    assert [m.body for m in consume_all(broker.url, "typed")] == ["s"]


@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "durable"])
def test_a_refused_send_s_id_is_not_kept_so_its_resend_goes_through(scow_broker, durable):
    """A message held in memory only has its id admitted as it is checked (one call):
    a send refused after that (its address full, FAIL) must take its id back."""
    broker = scow_broker(
        address_settings={"capped": {"max-size-messages": 1, "address-full-policy": "FAIL"}}
    )
    first, second = (
        Message(body=body, durable=durable, properties={DUPL: body}) for body in ("r-1", "r-2")
    )
    with connected(broker.url) as conn:
        sender = conn.create_sender("capped")
        assert sender.send(first).remote_state == Delivery.ACCEPTED
        with pytest.raises(SendException) as refused:
            sender.send(second)
        assert refused.value.state == Delivery.REJECTED
    assert [m.body for m in consume_all(broker.url, "capped")] == ["r-1"]
    assert send_outcomes(broker.url, "capped", second, first) == [Delivery.ACCEPTED] * 2
    assert [m.body for m in consume_all(broker.url, "capped")] == ["r-2"]  # r-1: a resend
    assert broker.call(broker.broker.stats)["messages-duplicate"] == 1


def test_ids_outlive_an_auto_deleted_address(scow_broker):
    broker = scow_broker()
    send_outcomes(broker.url, "passing", dupl("once", "p-1"))
    assert [m.body for m in consume_all(broker.url, "passing")] == ["once"]
    wait_for(lambda: broker.call(lambda: "passing" not in broker.broker.addresses))
    send_outcomes(broker.url, "passing", dupl("resent", "p-1"))
    assert consume_all(broker.url, "passing", quiet=0.5) == []


def test_a_multicast_message_is_admitted_once_for_all_its_subscriptions(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        a = conn.create_receiver("news", name="a", options=Capabilities("topic"))
        b = conn.create_receiver("news", name="b", options=Capabilities("topic"))
        send_outcomes(broker.url, "news", dupl("n1", "n-1"), dupl("n1 again", "n-1"))
        assert a.receive(timeout=10).body == "n1" and b.receive(timeout=10).body == "n1"
        a.accept()
        b.accept()
        wait_for(lambda: broker.call(lambda: broker.broker.stats()["messages-duplicate"]) == 1)


# --------------------------------------------------------------------------- paging


def test_a_paged_message_s_id_is_cached(scow_broker):
    broker = scow_broker(
        address_settings={"paged": {"max-size-bytes": 10_000, "page-size-bytes": 8_000}}
    )
    bulk_send(broker.url, "paged", 50, lambda i: Message(body=f"{i}:" + "x" * 500))
    assert address_stats(broker, "paged")["paging"]
    send_outcomes(broker.url, "paged", dupl("p", "paged-1"), dupl("p again", "paged-1"))
    assert broker.queue_stats("paged")["messages-paged"] > 0
    got = consume_all(broker.url, "paged")
    assert len(got) == 51 and got[-1].body == "p"


# --------------------------------------------------------------------------- transactions


class IdTx(MessagingHandler, TransactionHandler):
    """Sends `messages` in one transaction and commits; `outcome` and `condition` say
    what the broker answered."""

    def __init__(self, url: str, address: str, messages: list[Message]) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.messages = url, address, messages
        self.outcome: str | None = None
        self.condition: Any = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, self.address)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        for message in self.messages:
            event.transaction.send(self.sender, message)
        event.transaction.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self._finish("committed")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.condition = event.delivery.remote.condition
        self._finish("failed")

    def _finish(self, outcome: str) -> None:
        self.outcome = outcome
        self.conn.close()


def commit(url: str, address: str, *messages: Message) -> IdTx:
    client = IdTx(url, address, list(messages))
    Container(client).run()
    return client


def test_a_duplicate_in_a_transaction_fails_the_commit_and_nothing_of_it_is_routed(
    scow_broker,
):
    broker = scow_broker()
    send_outcomes(broker.url, "txd", dupl("before", "t-1"))
    failed = commit(broker.url, "txd", dupl("new", "t-2"), Message(body="plain"), dupl("x", "t-1"))
    assert failed.outcome == "failed"
    assert failed.condition.name == "amqp:transaction:rollback"
    assert "'t-1'" in failed.condition.description and "'txd'" in failed.condition.description
    assert count(broker, "txd") == 1
    # the failed transaction admitted nothing: its new id is still new
    send_outcomes(broker.url, "txd", dupl("new", "t-2"))
    assert [m.body for m in consume_all(broker.url, "txd")] == ["before", "new"]


def test_a_committed_transaction_s_ids_are_cached(scow_broker):
    broker = scow_broker()
    done = commit(broker.url, "txc", dupl("a", "c-1"), dupl("b", "c-2"))
    assert done.outcome == "committed"
    send_outcomes(broker.url, "txc", dupl("a again", "c-1"), dupl("b again", "c-2"))
    assert commit(broker.url, "txc", dupl("b in a tx", "c-2")).outcome == "failed"
    assert [m.body for m in consume_all(broker.url, "txc")] == ["a", "b"]


def test_two_messages_of_one_transaction_with_one_id_fail_its_commit(scow_broker):
    broker = scow_broker()
    failed = commit(broker.url, "txt", dupl("a", "same"), dupl("b", "same"))
    assert failed.outcome == "failed" and "'same'" in failed.condition.description
    assert count(broker, "txt") == 0


# --------------------------------------------------------------------------- confirmation


@pytest.mark.parametrize("persist", [True, False], ids=["persist-id-cache", "ids-in-memory"])
def test_a_resend_is_confirmed_only_once_what_it_repeats_is_durable(scow_broker, persist):
    # its journal confirms on the loop's next turn, as a disk would a little later
    broker = scow_broker(sections={"broker": {"persist-id-cache": persist}})
    data = encode_message(b"x", durable=True, application_properties={DUPL: "late"})
    confirmed: list[str] = []

    def send_twice() -> tuple[RouteStatus, RouteStatus, list[str]]:
        first = broker.broker.send(data, "late", AMQP_FORMAT, None, lambda: confirmed.append("1"))
        again = broker.broker.send(data, "late", AMQP_FORMAT, None, lambda: confirmed.append("2"))
        return first, again, list(confirmed)

    first, again, at_once = broker.call(send_twice)
    assert (first, again, at_once) == (RouteStatus.PENDING, RouteStatus.PENDING, [])
    wait_for(lambda: confirmed == ["1", "2"])
    # once durable, a resend is confirmed at once
    resent = broker.call(lambda: broker.broker.send(data, "late", AMQP_FORMAT, None, lambda: None))
    assert resent is RouteStatus.DUPLICATE
    assert count(broker, "late") == 1


def test_a_transaction_s_ids_that_do_not_fit_age_the_young_generation_first(scow_broker):
    broker = scow_broker(address_settings={"txs": {"id-cache-size": 3}})
    assert commit(broker.url, "txs", dupl("a", "a"), dupl("b", "b")).outcome == "committed"
    assert commit(broker.url, "txs", dupl("a", "a")).outcome == "failed"
    assert commit(broker.url, "txs", dupl("b", "b")).outcome == "failed"
    five = [dupl(f"m{i}", f"m{i}") for i in range(5)]
    # keeps m2, m3, m4, which do not fit beside a and b: a and b are the old generation
    assert commit(broker.url, "txs", *five).outcome == "committed"
    assert address_stats(broker, "txs")["duplicate-ids"] == 5
    send_outcomes(broker.url, "txs", dupl("a again", "a"), dupl("m4 again", "m4"))
    send_outcomes(broker.url, "txs", dupl("m1 again", "m1"))  # ages m2-m4: a and b go
    assert address_stats(broker, "txs")["duplicate-ids"] == 4
    assert [m.body for m in consume_all(broker.url, "txs")] == [
        "a",
        "b",
        *(f"m{i}" for i in range(5)),
        "m1 again",
    ]


# --------------------------------------------------------------------------- id blocks


def _id_block_records(data_dir: Any) -> list[tuple[str, int]]:
    """(kind, record id) of each DUPLICATE_KEYS record written to a stopped broker's file
    journal and of each deletion of one, in order (`scow data print`)."""
    out = subprocess.run(
        [sys.executable, "-m", "scow.core.cli", "data", "print", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    blocks: set[int] = set()
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4 or not fields[2].startswith("id="):
            continue
        kind, record_id = fields[1], int(fields[2][3:])
        if fields[3] == "type=DUPLICATE_KEYS":
            blocks.add(record_id)
        if record_id in blocks:
            found.append((kind, record_id))
    return found


def test_the_ids_of_one_loop_pass_are_one_record_deleted_with_their_generation(
    scow_broker, tmp_path
):
    plugins = ["amqp", "file-journal", "standard-queues", "full-policies"]
    broker = scow_broker(plugins=plugins, address_settings={"pass": {"id-cache-size": 3}})
    messages = [
        encode_message(b"x", durable=False, application_properties={DUPL: f"p-{i}"})
        for i in range(10)
    ]

    def send_all(batch: list[bytes]) -> list[RouteStatus]:  # one call: one loop pass
        return [broker.broker.send(data, "pass", AMQP_FORMAT) for data in batch]

    assert broker.call(lambda: send_all(messages[:3])) == [RouteStatus.ROUTED] * 3  # block a
    # p-3 ages p-0..p-2 (block a): block b holds p-3 and p-4, block c p-5
    assert broker.call(lambda: send_all(messages[3:5])) == [RouteStatus.ROUTED] * 2
    assert broker.call(lambda: send_all(messages[5:6])) == [RouteStatus.ROUTED]
    # p-6 ages p-3..p-5, dropping block a; p-9 ages p-6..p-8 (block d, cut from the
    # pass's), dropping blocks b and c; block e holds p-9
    assert broker.call(lambda: send_all(messages[6:10])) == [RouteStatus.ROUTED] * 4
    assert address_stats(broker, "pass")["duplicate-ids"] == 4
    resent = broker.call(lambda: send_all([messages[3], messages[6], messages[9]]))
    # p-3 is new again (block f); p-6, 3 admissions old, is not
    assert resent == [RouteStatus.ROUTED, RouteStatus.DUPLICATE, RouteStatus.DUPLICATE]
    broker.stop()
    records = _id_block_records(tmp_path / "data-0")
    a, b, c, d, e, f = sorted({record_id for _kind, record_id in records})
    assert records == [
        ("ADD", a),
        ("ADD", b),
        ("ADD", c),
        ("DELETE", a),
        ("DELETE", b),
        ("DELETE", c),
        ("ADD", d),
        ("ADD", e),
        ("ADD", f),
    ]
