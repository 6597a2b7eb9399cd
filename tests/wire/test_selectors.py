"""JMS selectors on consumer links (`apache.org:selector-filter:string`)."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message
from proton.reactor import Selector
from proton.utils import LinkDetached

from scow.core.testing import DEFAULT_PLUGINS

from .helpers import bodies, connected, drain, pump, receive, send

#: Five messages with application properties covering strings, numbers, NULLs and escapes.
CATALOG: list[dict[str, Any]] = [
    {"name": "apple", "color": "red", "size": 1, "price": 1.5, "code": "A_1", "stock": 10},
    {"name": "banana", "color": "yellow", "size": 2, "price": 0.5, "code": "B%2", "stock": 0},
    {"name": "cherry", "color": "red", "size": 3, "price": 4.0, "code": "C_3"},
    {"name": "date", "color": "brown", "size": 4, "price": 6.25, "code": "D4", "stock": 3},
    {"name": "elder", "color": "black", "size": 5, "price": 2.0, "code": "E%5", "stock": 7},
]
NAMES = [item["name"] for item in CATALOG]


def select(broker, selector: str, messages: list[Message] | None = None) -> tuple[list, list]:
    """Send `messages` (the catalog by default), consume through `selector`.

    Returns (bodies the selector consumer got, bodies left on the queue for a plain
    consumer), both in queue order. Together they must be every message exactly once.
    """
    if messages is None:
        messages = [Message(body=item["name"], properties=item) for item in CATALOG]
    queue = "fruit"
    with connected(broker.url) as conn:
        send(conn, queue, *messages)
        total = len(messages)
        chooser = conn.create_receiver(queue, credit=0, name="chooser", options=Selector(selector))
        matched = drain(conn, chooser, total)  # every match the queue holds, and no more
        for _ in matched:
            chooser.accept()
        pump(
            [conn],
            lambda: broker.queue_stats(queue)["message-count"] == total - len(matched),
            what="the acks",
        )
        chooser.close()
        rest = total - len(matched)
        plain = conn.create_receiver(queue, credit=max(rest, 1), name="plain")
        left = receive(plain, rest)
    return bodies(matched), bodies(left)


def expect(broker, selector: str, matching: list[str]) -> None:
    matched, left = select(broker, selector)
    assert matched == matching, selector
    assert left == [n for n in NAMES if n not in matching], selector


def test_selector_equals(scow_broker):
    broker = scow_broker()
    expect(broker, "color = 'red'", ["apple", "cherry"])


def test_selector_not_equal_excludes_missing_properties(scow_broker):
    broker = scow_broker()
    # `stock` is NULL for cherry: NULL <> 0 is UNKNOWN, so cherry does not match
    expect(broker, "stock <> 0", ["apple", "date", "elder"])


def test_selector_less_and_greater_than(scow_broker):
    broker = scow_broker()
    expect(broker, "size < 3 OR price > 5", ["apple", "banana", "date"])


def test_selector_less_or_equal_and_greater_or_equal(scow_broker):
    broker = scow_broker()
    expect(broker, "size >= 2 AND price <= 4.0", ["banana", "cherry", "elder"])


def test_selector_like_with_wildcards_and_escape(scow_broker):
    broker = scow_broker()
    # '!%' is a literal percent sign: codes containing '%'
    expect(broker, "code LIKE '%!%%' ESCAPE '!'", ["banana", "elder"])


def test_selector_like_single_character_wildcard(scow_broker):
    broker = scow_broker()
    expect(broker, "name LIKE '_a%' AND code NOT LIKE 'B%'", ["date"])


def test_selector_in_list(scow_broker):
    broker = scow_broker()
    expect(broker, "color IN ('yellow', 'black')", ["banana", "elder"])


def test_selector_not_in_list(scow_broker):
    broker = scow_broker()
    expect(broker, "color NOT IN ('red', 'yellow')", ["date", "elder"])


def test_selector_between_and_not_between(scow_broker):
    broker = scow_broker()
    expect(broker, "size BETWEEN 2 AND 4 AND price NOT BETWEEN 3 AND 5", ["banana", "date"])


def test_selector_is_null(scow_broker):
    broker = scow_broker()
    expect(broker, "stock IS NULL", ["cherry"])


def test_selector_is_not_null(scow_broker):
    broker = scow_broker()
    expect(broker, "stock IS NOT NULL AND stock > 0", ["apple", "date", "elder"])


def test_selector_boolean_logic_with_not_and_parentheses(scow_broker):
    broker = scow_broker()
    expect(broker, "NOT (color = 'red' OR size > 4) AND (size = 2 OR size = 4)", ["banana", "date"])


def test_selector_arithmetic(scow_broker):
    broker = scow_broker()
    # apple 1.5*1+10=11.5, banana 1.0+0=1, date 25+3=28, elder 10+7=17; cherry has no stock
    expect(broker, "price * size + stock > 10 AND size - 1 <> 3 / 1", ["apple", "elder"])


def test_selector_on_header_priority(scow_broker):
    broker = scow_broker()
    messages = [Message(body=f"p{p}", priority=p) for p in (1, 4, 7, 9)]
    matched, left = select(broker, "JMSPriority >= 7", messages)
    assert matched == ["p7", "p9"]
    assert left == ["p1", "p4"]


@pytest.mark.parametrize("identifier", ["JMSType", "properties.subject"])
def test_selector_on_subject(scow_broker, identifier):
    broker = scow_broker()
    messages = [Message(body=s, subject=s) for s in ("order", "invoice", "order-cancelled")]
    matched, left = select(broker, f"{identifier} = 'order'", messages)
    assert matched == ["order"]
    assert left == ["invoice", "order-cancelled"]


def test_selector_consumer_skips_non_matching_messages_at_the_head(scow_broker):
    """Non-matching messages ahead in the queue do not starve a selector consumer."""
    broker = scow_broker()
    with connected(broker.url) as conn:
        blues = [Message(body=f"blue{i}", properties={"color": "blue"}) for i in range(5)]
        send(conn, "paint", *blues, Message(body="red0", properties={"color": "red"}))
        reds = conn.create_receiver("paint", name="reds", options=Selector("color = 'red'"))
        assert bodies(receive(reds, 1)) == ["red0"]
        pump([conn], lambda: broker.queue_stats("paint")["message-count"] == 5, what="the ack")


def test_messages_a_selector_refuses_stay_for_another_consumer(scow_broker):
    """A selector consumer does not take (or hold back) messages it does not match."""
    broker = scow_broker()
    with connected(broker.url) as conn:
        reds = conn.create_receiver(
            "paint", credit=10, name="reds", options=Selector("color = 'red'")
        )
        mixed = [
            Message(body=f"{color}{i}", properties={"color": color})
            for i in range(3)
            for color in ("red", "blue")
        ]
        send(conn, "paint", *mixed)
        assert bodies(receive(reds, 3)) == ["red0", "red1", "red2"]

        blues = conn.create_receiver("paint", credit=10, name="blues")
        assert bodies(receive(blues, 3)) == ["blue0", "blue1", "blue2"]
        pump([conn], lambda: broker.queue_stats("paint")["message-count"] == 0, what="acks")


def test_two_selector_consumers_split_a_queue_by_property(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        reds = conn.create_receiver("paint", credit=10, name="r", options=Selector("color='red'"))
        blues = conn.create_receiver("paint", credit=10, name="b", options=Selector("color='blue'"))
        mixed = [
            Message(body=f"{color}{i}", properties={"color": color})
            for i in range(4)
            for color in ("blue", "red")
        ]
        send(conn, "paint", *mixed)
        assert bodies(receive(reds, 4)) == [f"red{i}" for i in range(4)]
        assert bodies(receive(blues, 4)) == [f"blue{i}" for i in range(4)]


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ("color = ", "expected a value"),
        ("color LIKE 3", "LIKE"),
        ("'a' < 'b'", "'a'"),
    ],
)
def test_bad_selector_refuses_the_link_with_the_parse_error(scow_broker, selector, fragment):
    broker = scow_broker()
    with connected(broker.url) as conn:
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver("paint", options=Selector(selector))
        condition = refused.value.link.remote_condition
        assert condition.name == "amqp:invalid-field"
        assert fragment in condition.description
        # the connection survives a refused link
        send(conn, "paint", Message(body="ok"))
        assert bodies(receive(conn.create_receiver("paint", name="after"), 1)) == ["ok"]


def test_a_selector_whose_echo_exceeds_the_client_s_max_frame_size_is_refused(scow_broker):
    """The broker's attach echoes the source, selector included; one larger than the frame
    the client takes (proton-python's 32 KiB) broke the client's connection with a
    `framing-error` ("malformed frame"). Now the link alone is refused, saying why."""
    broker = scow_broker()
    selector = "color = 'red' OR " + " OR ".join(f"k{i} = 'v{i}'" for i in range(2500))
    assert len(selector) > 40_000  # and below the broker's own max-frame-size (128 KiB)
    with connected(broker.url) as conn:
        send(conn, "paint", Message(body="red", properties={"color": "red"}))
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver("paint", name="long", options=Selector(selector))
        condition = refused.value.link.remote_condition
        assert condition.name == "amqp:frame-size-too-small"
        assert "max-frame-size of 32768 bytes" in condition.description
        red = conn.create_receiver("paint", name="short", options=Selector("color = 'red'"))
        assert bodies(receive(red, 1)) == ["red"]


class _CountingFilter:
    """A consumer's selector, counting the messages it is asked about."""

    def __init__(self, selector: Any) -> None:
        self.selector = selector.selector
        self._inner = selector
        self.calls = 0

    def __call__(self, message: Any) -> bool:
        self.calls += 1
        return bool(self._inner(message))


#: The queue types, by the arguments of a queue "paint" (None: the standard type,
#: auto-created).
QUEUE_TYPES = pytest.mark.parametrize(
    "arguments",
    [None, {"qpid.priorities": 10}, {"last-value-key": "k"}, {"qpid.paging": True}],
    ids=["standard", "priority", "last-value", "qpid-paged"],
)


def paint_broker(scow_broker: Any, arguments: dict[str, Any] | None) -> Any:
    if arguments is None:
        return scow_broker()
    return scow_broker(
        plugins=[*DEFAULT_PLUGINS, "qpid-paged-queues"],
        sections={"queues": {"paint": {"routing-type": "ANYCAST", "arguments": arguments}}},
    )


def blue(i: int) -> Message:
    """A message a red selector refuses: of its own key (last-value) and, on a priority
    queue, level."""
    return Message(body=f"blue{i}", priority=i % 10, properties={"color": "blue", "k": i})


@QUEUE_TYPES
def test_a_selector_is_asked_about_each_waiting_message_once_however_often_credit_comes(
    scow_broker, arguments
):
    """A selector consumer's every flow frame used to scan the whole waiting list again:
    with 115,905 non-matching messages in memory (the packaged config's limit, 1 KiB
    each) the 10 matching ones behind them took 2.5 s to arrive, and 60 s with a LIKE.
    A priority queue (whose levels are each in arrival order), a last-value and a
    qpid-paged queue did so until the notes were kept per level and for every list."""
    broker = paint_broker(scow_broker, arguments)
    waiting = 300
    with connected(broker.url) as conn:
        send(conn, "paint", *(blue(i) for i in range(waiting)))
        reds = conn.create_receiver(
            "paint", credit=0, name="reds", options=Selector("color = 'red'")
        )
        queue = broker.broker.queues["paint"]
        pump([conn], lambda: broker.call(queue.consumers))
        consumer = broker.call(lambda: queue.consumers()[0])
        counting = _CountingFilter(consumer.filter)
        broker.call(lambda: setattr(consumer, "filter", counting))
        for credit in range(1, 6):  # five flow frames, each a dispatch of the queue
            reds.link.flow(1)
            pump([conn], lambda c=credit: broker.call(consumer.credit) == c, what="the flow")
        calls = broker.call(lambda: counting.calls)
        assert calls == waiting, f"{calls} selector calls for {waiting} waiting messages"

        send(conn, "paint", Message(body="red0", properties={"color": "red"}))
        assert bodies(receive(reds, 1)) == ["red0"]
        assert broker.call(lambda: counting.calls) == waiting + 1


@QUEUE_TYPES
def test_a_message_put_back_among_those_a_selector_refused_still_reaches_it(scow_broker, arguments):
    """What a pass notes as refused holds for the messages that waited then: one given
    back later by another consumer (id below the note) is offered to the selector again."""
    broker = paint_broker(scow_broker, arguments)
    with connected(broker.url) as conn:
        send(conn, "paint", Message(body="red0", properties={"color": "red", "k": "red"}))
        plain = conn.create_receiver("paint", credit=1, name="plain")
        (held,) = receive(plain, 1, accept=False)
        assert held.body == "red0"
        send(conn, "paint", *(blue(i) for i in (9, 4, 14)))  # levels 9, 4 (red0's) and 4
        reds = conn.create_receiver(
            "paint", credit=0, name="reds", options=Selector("color = 'red'")
        )
        reds.link.flow(5)  # a pass over the three blue ones: all refused
        pump([conn], lambda: broker.queue_stats("paint")["consumer-count"] == 2, what="attach")
        plain.close()  # red0 comes back, before them
        assert bodies(receive(reds, 1)) == ["red0"]
        pump([conn], lambda: broker.queue_stats("paint")["message-count"] == 3, what="the ack")
