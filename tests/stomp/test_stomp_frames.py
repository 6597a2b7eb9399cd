"""The STOMP frame parser and encoder, without sockets."""

from __future__ import annotations

import pytest
from scow_stomp.frames import (
    MAX_BODY_SIZE,
    BodyPart,
    Frame,
    FrameError,
    FrameTooLarge,
    Parser,
    encode,
)


def _parse(data: bytes, max_size: int = 1 << 20) -> list[Frame]:
    return list(Parser(max_size).feed(data))


def test_frames_split_anywhere_parse_the_same():
    data = (
        encode("SEND", {"destination": "q", "a": "b"}, b"body")
        + b"\n\n"
        + encode("ACK", {"id": "7"})
    )
    parser = Parser(1 << 20)
    frames = [frame for byte in data for frame in parser.feed(bytes([byte]))]
    assert [(f.command, f.headers.get("a"), f.body) for f in frames] == [
        ("SEND", "b", b"body"),
        ("ACK", None, b""),
    ]
    assert parser.heartbeats == 2


def test_content_length_lets_a_body_hold_nul_bytes():
    (frame,) = _parse(b"SEND\ndestination:q\ncontent-length:3\n\na\x00b\x00")
    assert frame.body == b"a\x00b"


def test_header_values_are_unescaped_and_the_first_repeat_wins():
    (frame,) = _parse(b"SEND\nkey\\cx:line\\none\\\\two\\r\nkey\\cx:later\n\n\x00")
    assert frame.headers == {"key:x": "line\none\\two\r"}


def test_encode_escapes_what_parse_unescapes():
    headers = {"weird:key": "a\nb:c\\d\re"}
    (frame,) = _parse(encode("SEND", headers, b"x"))
    assert frame.headers["weird:key"] == headers["weird:key"]


def test_connect_headers_are_not_unescaped():
    (frame,) = _parse(b"CONNECT\npasscode:a\\cb\n\n\x00")
    assert frame.headers["passcode"] == "a\\cb"


def test_crlf_line_endings_are_accepted():
    (frame,) = _parse(b"SEND\r\ndestination:q\r\n\r\nhi\x00")
    assert frame.headers == {"destination": "q"} and frame.body == b"hi"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"HELLO\n\n\x00", "unknown command 'HELLO'"),
        (b"SEND\nno colon\n\n\x00", "has no ':'"),
        (b"SEND\nk:\\x\n\n\x00", "undefined escape"),
        (b"SEND\ncontent-length:x\n\n\x00", "content-length 'x' is not a number"),
        (b"SEND\ncontent-length:1\n\nab\x00", "no NUL after the 1 bytes"),
        (b"SEND\n\n" + b"x" * 200, r"exceeds \[stomp\] max-frame-size 100"),
        (b"SEND\n" + b"h:v\n" * 50, r"headers exceed \[stomp\] max-frame-size 100"),
    ],
)
def test_malformed_input_is_refused_saying_what_was_wrong(data, says):
    with pytest.raises(FrameError, match=says):
        _parse(data, max_size=100)


def _events(parser: Parser, data: bytes, piece: int) -> list[Frame | BodyPart]:
    """Feed `data` in pieces of `piece` bytes; parts are copied (their views are reused)."""
    events: list[Frame | BodyPart] = []
    for start in range(0, len(data), piece):
        for event in parser.feed(data[start : start + piece]):
            if isinstance(event, BodyPart):
                event = BodyPart(memoryview(bytes(event.data)), event.last)
            events.append(event)
    return events


@pytest.mark.parametrize("piece", [1, 7, 1000, 1 << 20])
def test_a_send_over_stream_from_comes_out_as_its_head_then_its_body_in_parts(piece):
    body = bytes(range(256)) * 40  # NUL bytes inside, read by content-length
    data = encode("SEND", {"destination": "q"}, body) + b"\n" + encode("ACK", {"id": "1"})
    parser = Parser(1 << 20, stream_from=len(body))
    events = _events(parser, data, piece)
    head, *parts, ack = events
    assert isinstance(head, Frame) and head.streamed and head.body == b""
    assert head.headers["content-length"] == str(len(body))
    assert all(isinstance(p, BodyPart) for p in parts)
    assert b"".join(bytes(p.data) for p in parts) == body  # type: ignore[union-attr]
    assert [p.last for p in parts] == [False] * (len(parts) - 1) + [True]  # type: ignore[union-attr]
    assert isinstance(ack, Frame) and ack.command == "ACK"
    assert parser.heartbeats == 1


def test_frames_below_stream_from_and_frames_other_than_send_come_whole():
    data = (
        encode("SEND", {"destination": "q"}, b"x" * 99)
        + b"SEND\ndestination:q\n\n" + b"y" * 99 + b"\x00"
        + b"ACK\nid:1\n\n" + b"z" * 500 + b"\x00"
    )  # fmt: skip
    frames = _parse_with(Parser(1 << 20, stream_from=100), data)
    assert [(f.streamed, len(f.body)) for f in frames] == [(False, 99), (False, 99), (False, 500)]


def test_a_streamed_body_not_ended_by_nul_is_refused():
    parser = Parser(1 << 20, stream_from=4)
    with pytest.raises(FrameError, match="no NUL after"):
        _events(parser, b"SEND\ndestination:q\ncontent-length:4\n\nabcdX", 100)


def test_a_streamed_body_is_bounded_by_max_message_size_not_max_frame_size():
    parser = Parser(1024, stream_from=4, max_message_size=10_000)
    events = _events(parser, encode("SEND", {"destination": "q"}, b"y" * 10_000), 4096)
    assert b"".join(bytes(e.data) for e in events if isinstance(e, BodyPart)) == b"y" * 10_000
    with pytest.raises(FrameTooLarge, match=r"10001 bytes .* exceeds \[stomp\] max-message-size"):
        list(parser.feed(b"SEND\ndestination:q\ncontent-length:10001\n\n"))


def test_headers_and_bodies_held_in_memory_stay_bounded_by_max_frame_size():
    parser = Parser(1024, stream_from=4096)
    with pytest.raises(FrameTooLarge, match=r"SEND frame of 2\d\d\d bytes or more exceeds"):
        list(parser.feed(encode("SEND", {"destination": "q"}, b"y" * 2000)))
    with pytest.raises(FrameTooLarge, match=r"SEND headers of \d+ bytes or more exceeds"):
        list(Parser(1024, stream_from=4).feed(b"SEND\nh:" + b"v" * 2000 + b"\n\n"))


@pytest.mark.parametrize("piece", [1, 7, 1000, 1 << 20])
def test_a_send_without_content_length_streams_once_it_passes_stream_from(piece):
    body = bytes(range(1, 256)) * 40  # no NUL: it ends the body
    data = b"SEND\ndestination:q\n\n" + body + b"\x00\n" + encode("ACK", {"id": "1"})
    parser = Parser(1024, stream_from=1000)
    head, *parts, ack = _events(parser, data, piece)
    assert isinstance(head, Frame) and head.streamed and "content-length" not in head.headers
    assert b"".join(bytes(p.data) for p in parts) == body  # type: ignore[union-attr]
    assert [p.last for p in parts] == [False] * (len(parts) - 1) + [True]  # type: ignore[union-attr]
    assert isinstance(ack, Frame) and ack.command == "ACK" and parser.heartbeats == 1


def test_a_send_without_content_length_over_max_message_size_is_refused_as_it_arrives():
    parser = Parser(1024, stream_from=100, max_message_size=5000)
    events = list(parser.feed(b"SEND\ndestination:q\n\n" + b"z" * 4000))
    assert events[0].streamed  # type: ignore[union-attr]
    with pytest.raises(FrameTooLarge, match=r"more than 5000 bytes .* max-message-size 5000"):
        list(parser.feed(b"z" * 1001))


def test_a_body_without_content_length_is_searched_for_its_nul_once():
    """Fed a byte at a time, a body's NUL search does not start again at its beginning:
    quadratic rescans would take minutes here."""
    parser = Parser(1 << 30)
    data = b"SEND\ndestination:q\n\n" + b"x" * 200_000
    for start in range(0, len(data), 16):
        assert list(parser.feed(data[start : start + 16])) == []
    (frame,) = list(parser.feed(b"\x00"))
    assert len(frame.body) == 200_000


def _parse_with(parser: Parser, data: bytes) -> list[Frame]:
    return [event for event in parser.feed(data) if isinstance(event, Frame)]


@pytest.mark.parametrize("max_message_size", [0, 8 << 30])
def test_a_streamed_body_over_4_gib_is_refused_whatever_max_message_size_says(max_message_size):
    # an AMQP data or string section's length is 32 bits: the stored message could not say it
    parser = Parser(1024, stream_from=4, max_message_size=max_message_size)
    head = b"SEND\ndestination:q\ncontent-length:%d\n\n"
    (frame,) = parser.feed(head % MAX_BODY_SIZE)  # the largest that fits: taken
    assert frame.streamed  # type: ignore[union-attr]
    over = Parser(1024, stream_from=4, max_message_size=max_message_size)
    with pytest.raises(FrameTooLarge, match=r"4294967296 bytes .* exceeds the 4 GiB") as refused:
        list(over.feed(head % (MAX_BODY_SIZE + 1)))
    assert f"max-message-size ({max_message_size})" in str(refused.value)


@pytest.mark.parametrize("max_message_size", [0, 8 << 30])
def test_a_body_without_content_length_over_4_gib_is_refused_at_its_first_byte_past(
    max_message_size,
):
    """4 GiB less a byte of a body without content-length is taken, the next byte is
    refused, whatever max-message-size says (fed 1 MiB at a time: about a second).
    tests/stomp/test_stomp_large_messages.py sends it through a socket (slow)."""
    parser = Parser(1024, stream_from=4, max_message_size=max_message_size)
    piece = b"x" * (1 << 20)
    frame, first = parser.feed(b"SEND\ndestination:q\n\n" + piece)
    assert isinstance(frame, Frame) and frame.streamed and isinstance(first, BodyPart)
    taken = len(first.data)
    feeds = [piece] * ((MAX_BODY_SIZE >> 20) - 1) + [piece[: MAX_BODY_SIZE % len(piece)]]
    for data in feeds:  # each part counted and dropped: 4 GiB are never held
        taken += sum(len(part.data) for part in parser.feed(data))  # type: ignore[union-attr]
    assert taken == MAX_BODY_SIZE
    with pytest.raises(FrameTooLarge) as refused:
        list(parser.feed(b"x"))
    assert str(refused.value) == (
        "SEND body of more than 4294967295 bytes (it has no content-length) exceeds the "
        "4 GiB (4294967295 bytes) an AMQP body section can hold, the limit whatever "
        f"[stomp] max-message-size ({max_message_size}) says"
    )
