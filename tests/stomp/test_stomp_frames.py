"""The STOMP frame parser and encoder, without sockets."""

from __future__ import annotations

import pytest
from scow_stomp.frames import Frame, FrameError, Parser, encode


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
