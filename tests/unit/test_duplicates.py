"""The duplicate-id cache: what it keeps, what it pushes out, how ids are keyed."""

from __future__ import annotations

import pytest

from scow.core.duplicates import DuplicateIdCache, describe_id, id_key
from scow.core.model import InvalidField


def test_ids_are_forgotten_oldest_first_with_their_records():
    cache = DuplicateIdCache(2)
    assert cache.add(b"a", 10) == [] and cache.add(b"b", 11) == []
    assert cache.pushed_out(1) == [10]  # what adding one more would push out
    assert cache.add(b"c", 12) == [10]
    assert b"a" not in cache and b"b" in cache and len(cache) == 2
    assert cache.add(b"b", 13) == [11]  # an id admitted again replaces its old record
    assert cache.clear() == [12, 13] and len(cache) == 0


def test_ids_admitted_together_keep_the_newest_that_fit():
    cache = DuplicateIdCache(3)
    assert cache.kept([b"a", b"b"]) == [b"a", b"b"]
    assert cache.kept([b"a", b"b", b"c", b"d"]) == [b"b", b"c", b"d"]
    assert DuplicateIdCache(0).kept([b"a"]) == []
    for key, record in ((b"x", 1), (b"y", 0), (b"z", 3)):
        cache.add(key, record)
    assert cache.pushed_out(2) == [1]  # y was never journaled: no record to delete


def test_strings_and_binaries_are_distinct_keys_and_other_types_are_refused():
    assert id_key("a", "q") != id_key(b"a", "q")
    assert describe_id(id_key("order-1", "q")) == "'order-1'"
    assert describe_id(id_key(b"\x00\xff", "q")) == "binary 00ff"
    with pytest.raises(InvalidField, match=r"address 'q'.*_AMQ_DUPL_ID = 7 .*string or binary"):
        id_key(7, "q")


def _encoded(message: object) -> bytes:
    return bytes(message.encode())  # type: ignore[attr-defined]


def test_inspect_reads_the_header_and_the_duplicate_id_of_every_message_shape():
    from proton import Message as ProtonMessage

    from scow.protocols.amqp.codec import DecodeError
    from scow.protocols.amqp.format import AMQP_FORMAT

    # only a body (the perf client's messages): defaults, no id, nothing else read
    assert AMQP_FORMAT.inspect(b"\x00\x53\x75\xa0\x03abc") == (False, 4, 0, None)
    assert AMQP_FORMAT.inspect(b"\x00\x53\x77\xa1\x03abc") == (False, 4, 0, None)
    durable = ProtonMessage(body="x", durable=True, priority=7, ttl=5)
    assert AMQP_FORMAT.inspect(_encoded(durable)) == (True, 7, 5000, None)
    with_id = ProtonMessage(body="x", properties={"_AMQ_DUPL_ID": "order-1"})
    assert AMQP_FORMAT.inspect(_encoded(with_id)) == (False, 4, 0, "order-1")
    both = ProtonMessage(body=b"x", durable=True, properties={"_AMQ_DUPL_ID": b"\x01"})
    assert AMQP_FORMAT.inspect(_encoded(both)) == (True, 4, 0, b"\x01")
    # a body that merely contains the name is no id
    assert AMQP_FORMAT.inspect(_encoded(ProtonMessage(body="_AMQ_DUPL_ID")))[3] is None
    with pytest.raises(DecodeError):
        AMQP_FORMAT.inspect(b"\x00")
