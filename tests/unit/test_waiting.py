"""The standard queue's waiting list (`Fifo`): messages held compactly, in order."""

from __future__ import annotations

from scow.core.message import Message, MessageRef, SharedMessage
from scow.plugins.queues.waiting import ByPriority, Fifo, LastValue
from scow.protocols.amqp.format import AMQP_FORMAT


def message(message_id: int, *, address: str = "a", priority: int = 4, **kw: object) -> Message:
    data = b"body %d" % message_id
    return Message(message_id, data, address, AMQP_FORMAT, priority=priority, **kw)  # type: ignore[arg-type]


def ids(entries: object) -> list[int]:
    return [entry.message.id for entry in entries]  # type: ignore[attr-defined]


def test_plain_messages_come_back_with_their_id_body_and_kind() -> None:
    fifo = Fifo()
    sent = [message(n) for n in range(1, 2001)]  # past the id array's cut-off
    for m in sent:
        assert fifo.append(m) is None
    assert len(fifo) == 2000
    for m in sent:
        out = fifo.popleft()
        assert (out.message.id, out.message.data, out.message.kind) == (m.id, m.data, m.kind)
        assert out.message.expiration == 0
    assert not fifo


def test_entries_that_are_not_plain_are_kept_as_objects_in_order() -> None:
    fifo = Fifo()
    expiring = message(2, expiration=123)
    shared = message(3).shared(2, 0)
    other_kind = message(4, priority=9)
    ref = MessageRef(message(5), object(), delivery_count=1)
    entries = [message(1), expiring, shared, other_kind, ref, message(6)]
    for entry in entries:
        fifo.append(entry)
    assert ids(fifo) == [1, 2, 3, 4, 5, 6]
    out = [fifo.popleft() for _ in entries]
    assert out[1] is expiring and out[1].expiration == 123
    assert out[2] is shared and isinstance(shared, SharedMessage)
    assert out[3] is other_kind and out[3].priority == 9
    assert out[4] is ref and ref.delivery_count == 1
    assert out[5].data == b"body 6" and out[5].priority == 4


def test_the_plain_kind_changes_once_no_plain_message_waits() -> None:
    fifo = Fifo()
    fifo.append(message(1, address="a"))
    fifo.popleft()
    fifo.append(message(2, address="b"))
    assert fifo.popleft().address == "b"


def test_put_back_returns_a_ref_before_the_first_later_entry() -> None:
    fifo = Fifo()
    for n in (2, 3, 5):
        fifo.append(message(n))
    fifo.put_back(MessageRef(message(4), object()))
    fifo.put_back(MessageRef(message(1), object()))
    fifo.put_back(MessageRef(message(7), object()))
    assert ids(fifo) == [1, 2, 3, 4, 5, 7]
    assert ids(fifo.popleft() for _ in range(6)) == [1, 2, 3, 4, 5, 7]


def test_newer_than_and_remove_if_keep_the_rest_in_order() -> None:
    fifo = Fifo()
    for n in range(1, 9):
        fifo.append(message(n))
    fifo.put_back(MessageRef(message(0), object()))
    assert ids(fifo.newer_than(5)) == [6, 7, 8]
    assert ids(fifo.newer_than(8)) == []
    taken = fifo.remove_if(lambda e: e.message.id % 2 == 0)
    assert ids(taken) == [0, 2, 4, 6, 8]
    assert ids(fifo) == [1, 3, 5, 7]
    seen: list[int] = []
    stopped = fifo.remove_if(
        lambda e: seen.append(e.message.id) or True, stop=lambda: len(seen) >= 2
    )
    assert ids(stopped) == [1, 3] and ids(fifo) == [5, 7]
    fifo.clear()
    assert not fifo and list(fifo) == []


def test_held_entries_are_the_objects_kept_so_changes_stay() -> None:
    fifo = Fifo()
    for n in range(1, 4):
        fifo.append(message(n))
    assert next(iter(fifo)) is not next(iter(fifo))  # compact: read as new objects
    for entry in fifo.held():
        entry.message.data = b"moved"  # as flow to disk does
    assert [e.message.data for e in fifo] == [b"moved"] * 3
    first = fifo.popleft()
    assert first.data == b"moved"
    fifo.append(message(9))  # held compactly again once new ones arrive
    assert ids(fifo) == [2, 3, 9]


def test_priority_levels_hold_their_messages_compactly_too() -> None:
    waiting = ByPriority()
    for n, priority in ((1, 4), (2, 9), (3, 4), (4, 9)):
        waiting.append(message(n, priority=priority))
    waiting.put_back(MessageRef(message(0, priority=9), object()))
    assert ids(waiting) == [0, 2, 4, 1, 3]
    assert [e.message.id for e in waiting.held()] == [0, 2, 4, 1, 3]
    assert ids(waiting.popleft() for _ in range(5)) == [0, 2, 4, 1, 3]


def test_put_back_all_merges_refs_into_their_places_among_waiting_entries() -> None:
    fifo = Fifo()
    for n in (2, 4, 5, 9):  # plain messages waiting
        fifo.append(message(n))
    fifo.put_back(MessageRef(message(7), object(), delivery_count=1))  # came back before
    back = [MessageRef(message(n), object(), delivery_count=1) for n in (1, 3, 6, 8, 10, 11)]
    assert fifo.put_back_all(back) == []
    assert ids(fifo) == list(range(1, 12))
    assert [fifo.popleft().message.id for _ in range(11)] == list(range(1, 12))


def test_put_back_all_of_refs_after_every_waiting_entry_keeps_their_order() -> None:
    fifo = Fifo()
    fifo.append(message(1))
    back = [MessageRef(message(n), object()) for n in range(2, 50_002)]
    fifo.put_back_all(back)
    fifo.put_back(MessageRef(message(60_000), object()))  # after all: appended
    fifo.put_back(MessageRef(message(0), object()))  # before all: walked to its place
    assert ids(fifo) == [0, *range(1, 50_002), 60_000]


def test_put_back_all_on_priorities_puts_each_ref_back_in_its_level() -> None:
    queue = ByPriority()
    for n, priority in ((2, 4), (4, 9), (6, 4)):
        queue.append(message(n, priority=priority))
    back = [
        MessageRef(message(n, priority=p), object()) for n, p in ((1, 4), (3, 9), (5, 4), (7, 9))
    ]
    queue.put_back_all(back)
    assert len(queue) == 7
    assert ids(queue) == [3, 4, 7, 1, 2, 5, 6]  # priority 9 first, each level in id order


def test_remove_expired_takes_the_expired_entries_and_keeps_plain_messages_in_place() -> None:
    fifo = Fifo()
    for n in range(1, 1501):
        fifo.append(message(n))
    for _ in range(1200):  # past the id array's cut-off: its head moved
        fifo.popleft()
    assert fifo.remove_expired(10**15) == []  # only plain messages: none can expire
    expired = message(1501, expiration=100)
    later = message(1503, expiration=10**6)
    ref = MessageRef(message(1504, expiration=50), object(), delivery_count=1)
    for entry in (expired, message(1502), later, ref, message(1505).shared(2, 0)):
        fifo.append(entry)
    fifo.append(message(1506))
    taken = fifo.remove_expired(100)
    assert taken == [expired, ref]
    left = [*range(1201, 1501), 1502, 1503, 1505, 1506]
    assert ids(fifo) == left
    out = [fifo.popleft() for _ in range(len(fifo))]
    assert [(e.message.id, e.message.data) for e in out] == [(n, b"body %d" % n) for n in left]
    assert out[301] is later


def test_remove_expired_on_priorities_and_last_values_keeps_the_rest() -> None:
    levels = ByPriority()
    for entry in (
        message(1, priority=1, expiration=10),
        message(2, priority=9),
        message(3, priority=9, expiration=10),
        message(4, priority=1),
    ):
        levels.append(entry)
    assert ids(levels.remove_expired(10)) == [3, 1]  # delivery order: highest first
    assert len(levels) == 2 and ids(levels) == [2, 4]
    assert levels.remove_expired(10) == []

    values = LastValue(lambda entry: entry.message.address)
    for entry in (message(5, address="x", expiration=10), message(6, address="y")):
        values.append(entry)
    assert ids(values.remove_expired(9)) == []
    assert ids(values.remove_expired(10)) == [5]
    assert ids(values) == [6]


def test_remove_if_in_asks_only_about_entries_newer_than_after() -> None:
    values = LastValue(lambda entry: entry.message.address)
    for n, key in enumerate("abcde", 1):
        values.append(message(n, address=key))
    values.append(message(6, address="b"))  # replaces 2: a newer value is the last entry
    asked: list[int] = []

    def ask(entry: object) -> bool:
        asked.append(entry.message.id)  # type: ignore[attr-defined]
        return entry.message.id % 2 == 0  # type: ignore[attr-defined]

    assert ids(values.remove_if_in(0, ask, None, 3)) == [4, 6]
    assert asked == [4, 5, 6]
    assert ids(values) == [1, 3, 5]

    levels = ByPriority()
    for n, priority in ((1, 9), (2, 1), (3, 9), (4, 1)):
        levels.append(message(n, priority=priority))
    assert levels.parts == 10
    asked.clear()
    assert ids(levels.remove_if_in(0, ask, None, 1)) == []  # the highest level: 3 is odd
    assert ids(levels.remove_if_in(8, ask, None, 0)) == [2, 4]  # priority 1's level
    assert asked == [3, 2, 4] and len(levels) == 2
