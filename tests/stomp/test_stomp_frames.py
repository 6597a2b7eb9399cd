"""The STOMP frame parser and encoder, without sockets."""

from __future__ import annotations

import pytest
from scow_stomp.frames import BodyPart, Frame, FrameError, Parser, encode


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
        (b"SEND\n\n" + b"x" * 200, "exceeds max-frame-size 100"),
        (b"SEND\n" + b"h:v\n" * 50, "headers exceed max-frame-size 100"),
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


def test_frames_below_stream_from_or_without_content_length_come_whole():
    data = encode("SEND", {"destination": "q"}, b"x" * 99) + b"SEND\ndestination:q\n\n" + b"y" * 500
    frames = _parse_with(Parser(1 << 20, stream_from=100), data + b"\x00")
    assert [(f.streamed, len(f.body)) for f in frames] == [(False, 99), (False, 500)]


def test_a_streamed_body_not_ended_by_nul_is_refused():
    parser = Parser(1 << 20, stream_from=4)
    with pytest.raises(FrameError, match="no NUL after"):
        _events(parser, b"SEND\ndestination:q\ncontent-length:4\n\nabcdX", 100)


def test_a_streamed_send_over_max_frame_size_is_refused_before_its_body():
    parser = Parser(1024, stream_from=4)
    with pytest.raises(FrameError, match="exceeds max-frame-size 1024"):
        list(parser.feed(b"SEND\ndestination:q\ncontent-length:5000\n\n"))


def _parse_with(parser: Parser, data: bytes) -> list[Frame]:
    return [event for event in parser.feed(data) if isinstance(event, Frame)]
