"""STOMP headers and bodies to AMQP 1.0 and back, checked against proton's codec."""

from __future__ import annotations

import uuid

import pytest
from proton import Array, Data, Message, symbol
from scow_stomp import amqp_codec
from scow_stomp.convert import from_amqp, to_amqp


def _proton(data: bytes) -> Message:
    message = Message()
    message.decode(data)
    return message


def test_proton_reads_what_a_send_frame_becomes():
    headers = {
        "persistent": "true",
        "priority": "7",
        "correlation-id": "c-1",
        "reply-to": "replies",
        "content-type": "application/json",
        "colour": "red",
        "content-length": "3",
        "receipt": "r-1",
    }
    message = _proton(to_amqp(headers, b"{}\x00", "orders"))
    assert (message.durable, message.priority, message.address) == (True, 7, "orders")
    assert (message.correlation_id, message.reply_to) == ("c-1", "replies")
    assert message.content_type == "application/json"
    assert message.properties == {"colour": "red"}  # receipt and content-length are the frame's
    assert bytes(message.body) == b"{}\x00"


def test_a_body_without_content_length_is_text():
    message = _proton(to_amqp({}, "grüße".encode(), "q"))
    assert message.body == "grüße" and not message.durable


def test_large_values_take_the_32_bit_encodings():
    message = _proton(to_amqp({"big": "v" * 300, "content-length": "70000"}, b"x" * 70000, "q"))
    assert message.properties["big"] == "v" * 300 and len(message.body) == 70000


@pytest.mark.parametrize(
    "message",
    [
        Message(body="text", properties={"n": 3, "ok": True, "f": 1.5, "s": "x"}, priority=9),
        Message(body=b"\x00\x01", id=uuid.UUID(int=7), durable=True, subject="s"),
        Message(body={"a": 1}, id=42, correlation_id="c"),
        Message(body=None, properties={"long": 2**40, "neg": -5}),
        # an array property is beyond the narrow codec: proton's decoder takes over
        Message(body="a", properties={"list": Array(Data.NULL, Data.INT, 1, 2)}),
    ],
)
def test_any_amqp_message_reads_as_proton_reads_it(message):
    data = bytes(message.encode())
    headers, body = from_amqp(data)
    for key, value in (_proton(data).properties or {}).items():
        expected = str(value).lower() if isinstance(value, bool) else str(value)
        assert headers[key] == expected
    if message.id is not None:
        assert headers["amqp-message-id"] == str(message.id)
    assert headers.get("priority", "4") == str(message.priority)
    assert ("persistent" in headers) is bool(message.durable)
    if isinstance(message.body, str):
        assert body == message.body.encode()
    elif message.body is None:
        assert body == b""
    elif isinstance(message.body, bytes):
        assert body == message.body


def test_unsupported_encodings_are_named():
    data = bytes(Message(body="a", properties={"x": symbol("s")}).encode())
    assert amqp_codec.decode(data).application_properties == {"x": "s"}
    array = bytes(Message(body="a", properties={"x": Array(Data.NULL, Data.INT, 1)}).encode())
    with pytest.raises(amqp_codec.Unsupported, match=r"0xe0|0xf0"):
        amqp_codec.decode(array)
