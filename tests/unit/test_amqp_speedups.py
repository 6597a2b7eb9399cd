"""The C build of `AmqpMessageFormat.inspect` (protocols/amqp/_speedups.c) answers as the
Python one does, for every message: it reads the usual layouts itself and hands any
other to the Python implementation."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Message as ProtonMessage

from scow.protocols.amqp.codec import DecodeError
from scow.protocols.amqp.format import AmqpMessageFormat

speedups = pytest.importorskip("scow.protocols.amqp._speedups")


def test_the_c_build_is_what_the_broker_runs():
    # a failed build (`ext-modules` are optional) leaves the Python: slower, not wrong
    assert isinstance(AmqpMessageFormat().inspect, speedups.Inspector)
    assert not isinstance(AmqpMessageFormat(speedups=False).inspect, speedups.Inspector)


def _encoded(message: ProtonMessage) -> bytes:
    return bytes(message.encode())


def _read_in_c(data: bytes) -> object:
    """What the C build answers on its own; "declined" when it hands `data` over."""
    return speedups.Inspector(lambda _data: "declined")(data)


def test_the_usual_layouts_are_read_in_c():
    plain = ProtonMessage(body=b"x")
    full = ProtonMessage(
        body="x",
        durable=True,
        priority=9,
        ttl=4294967.295,
        delivery_count=3,
        first_acquirer=True,
        annotations={"x-opt-a": 1},
        properties={"a": 1.5, "b": [1, "two"], "_AMQ_DUPL_ID": b"\x00\x01"},
        id="m-1",
        subject="s",
    )
    assert _read_in_c(_encoded(plain)) == (False, 4, 0, None)
    assert _read_in_c(_encoded(full)) == (True, 9, 4294967295, b"\xa0\x02\x00\x01")
    string = ProtonMessage(body="x", properties={"_AMQ_DUPL_ID": "order-1"})
    assert _read_in_c(_encoded(string)) == (False, 4, 0, b"\xa1\x07order-1")
    # what the Python decides: a non-ASCII string id, an id of another type, no bytes
    for declined in (
        ProtonMessage(body="x", properties={"_AMQ_DUPL_ID": "\u00e9"}),
        ProtonMessage(body="x", properties={"_AMQ_DUPL_ID": 7}),
    ):
        assert _read_in_c(_encoded(declined)) == "declined"
    assert _read_in_c(b"\x00") == "declined"
    assert speedups.Inspector(lambda data: ("python", data))(bytearray(b"\x00")) == (
        "python",
        bytearray(b"\x00"),
    )


C = AmqpMessageFormat()
PYTHON = AmqpMessageFormat(speedups=False)


def _answer(fmt: AmqpMessageFormat, data: bytes) -> object:
    try:
        return fmt.inspect(data)
    except DecodeError as exc:
        return ("DecodeError", str(exc))


_ids = st.one_of(st.binary(max_size=300), st.text(max_size=300), st.integers(0, 10), st.none())
_values = st.one_of(
    st.integers(-(2**31), 2**31 - 1), st.text(max_size=20), st.binary(max_size=20), st.booleans()
)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    message = ProtonMessage(body=draw(st.one_of(st.binary(max_size=50), st.text(max_size=50))))
    message.durable = draw(st.booleans())
    message.priority = draw(st.integers(0, 255))
    message.ttl = draw(st.integers(0, 2**32 - 1)) / 1000
    message.first_acquirer = draw(st.booleans())
    message.delivery_count = draw(st.integers(0, 2**32 - 1))
    properties = draw(st.dictionaries(st.text(max_size=12), _values, max_size=4))
    duplicate_id = draw(_ids)
    if duplicate_id is not None:
        properties["_AMQ_DUPL_ID"] = duplicate_id
    message.properties = properties or None
    message.annotations = draw(
        st.none() | st.dictionaries(st.sampled_from(["x-a", "x-b"]), _values, max_size=2)
    )
    message.subject = draw(st.none() | st.text(max_size=10))
    data = _encoded(message)
    # and as a peer may send it: cut short, or a byte changed
    cut = draw(st.integers(0, len(data)))
    at, value = draw(st.integers(0, len(data) - 1)), draw(st.integers(0, 255))
    return draw(st.sampled_from([data, data[:cut], data[:at] + bytes((value,)) + data[at + 1 :]]))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_the_c_build_answers_as_the_python_one(data):
    assert _answer(C, data) == _answer(PYTHON, data)
