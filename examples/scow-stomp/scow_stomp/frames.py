"""STOMP 1.2 frames without I/O: bytes in, `Frame`s out, and frames back to bytes.

A frame is a command line, header lines, a blank line and a body ended by NUL; a lone
end-of-line between frames is a heart-beat. Header values escape `\\`, CR, LF and `:`
(STOMP 1.2 section "Value Encoding"), except in CONNECT and CONNECTED frames. A body is
read by `content-length` when the header is there, up to the first NUL otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

CLIENT_COMMANDS = frozenset(
    {
        "CONNECT",
        "STOMP",
        "SEND",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "ACK",
        "NACK",
        "BEGIN",
        "COMMIT",
        "ABORT",
        "DISCONNECT",
    }
)
#: Frames whose headers are not escaped (so that 1.0 clients can read CONNECTED).
_UNESCAPED = frozenset({"CONNECT", "CONNECTED"})
_ESCAPES = {b"\\\\": b"\\", b"\\n": b"\n", b"\\r": b"\r", b"\\c": b":"}
MAX_HEADERS = 1000


class FrameError(ValueError):
    """The bytes are not a STOMP frame; the message says what was wrong."""


@dataclass
class Frame:
    """One STOMP frame. When a header repeats, its first value counts (as the spec says)."""

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def encode(self) -> bytes:
        return encode(self.command, self.headers, self.body)


def _escape(value: str) -> bytes:
    return (
        value.replace("\\", "\\\\")
        .replace("\r", "\\r")
        .replace("\n", "\\n")
        .replace(":", "\\c")
        .encode()
    )


def _unescape(raw: bytes, where: str) -> str:
    if b"\\" not in raw:
        return raw.decode()
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i : i + 1] == b"\\":
            pair = raw[i : i + 2]
            if pair not in _ESCAPES:
                raise FrameError(
                    f"{where}: undefined escape {pair.decode(errors='replace')!r} "
                    "(accepted: \\\\ \\n \\r \\c)"
                )
            out += _ESCAPES[pair]
            i += 2
        else:
            out.append(raw[i])
            i += 1
    return out.decode()


def encode(command: str, headers: Mapping[str, str], body: bytes = b"") -> bytes:
    """A frame's bytes; `content-length` is always set for a non-empty body."""
    lines = [command.encode()]
    if command in _UNESCAPED:
        lines += [f"{k}:{v}".encode() for k, v in headers.items()]
    else:
        lines += [_escape(k) + b":" + _escape(str(v)) for k, v in headers.items()]
    if body and "content-length" not in headers:
        lines.append(b"content-length:%d" % len(body))
    return b"\n".join(lines) + b"\n\n" + body + b"\x00"


class Parser:
    """Cuts a byte stream into frames; `feed` returns the complete ones.

    Heart-beats (end-of-lines between frames) are counted in `heartbeats`, not returned.
    A frame over `max_frame_size` or malformed raises FrameError; the stream cannot be
    trusted after that, so the connection should answer ERROR and close.
    """

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self.heartbeats = 0
        self._buffer = bytearray()
        #: Where the next frame starts: frames are read in place, and what they used is
        #: cut off once per `feed` (cutting per frame would copy the rest each time).
        self._pos = 0

    def feed(self, data: bytes) -> Iterator[Frame]:
        self._buffer += data
        try:
            while True:
                frame = self._next()
                if frame is None:
                    return
                yield frame
        finally:
            del self._buffer[: self._pos]
            self._pos = 0

    def _next(self) -> Frame | None:
        buf = self._buffer
        start = self._pos
        while start < len(buf) and buf[start] in b"\r\n":
            if buf[start] == 0x0A:
                self.heartbeats += 1
            start += 1
        self._pos = start
        if start == len(buf):
            return None
        end = buf.find(b"\n\n", start)
        # a CRLF frame's blank line is "\r\n\r\n": look for it only before the LF one
        crlf = buf.find(b"\r\n\r\n", start, len(buf) if end == -1 else end)
        if crlf != -1:
            head_end, body_start = crlf, crlf + 4
        elif end != -1:
            head_end, body_start = end, end + 2
        else:
            if len(buf) - start > self.max_frame_size:
                raise FrameError(f"frame headers exceed max-frame-size {self.max_frame_size}")
            return None
        lines = bytes(buf[start:head_end]).replace(b"\r\n", b"\n").split(b"\n")
        frame = self._head(lines)
        length = frame.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise FrameError(f"{frame.command}: content-length {length!r} is not a number")
            size = int(length)
            self._check_size(frame, body_start + size - start)
            if len(buf) < body_start + size + 1:
                return None
            if buf[body_start + size] != 0:
                raise FrameError(
                    f"{frame.command}: no NUL after the {size} bytes content-length announced"
                )
            body_end = body_start + size
        else:
            body_end = buf.find(b"\x00", body_start)
            self._check_size(frame, (len(buf) if body_end == -1 else body_end) - start)
            if body_end == -1:
                return None
        frame.body = bytes(buf[body_start:body_end])
        self._pos = body_end + 1
        return frame

    def _check_size(self, frame: Frame, size: int) -> None:
        if size > self.max_frame_size:
            raise FrameError(
                f"{frame.command} frame of {size} bytes or more exceeds max-frame-size "
                f"{self.max_frame_size}"
            )

    def _head(self, lines: list[bytes]) -> Frame:
        try:
            command = lines[0].decode("ascii")
        except UnicodeDecodeError:
            raise FrameError(f"command {lines[0][:40]!r} is not ASCII") from None
        if command not in CLIENT_COMMANDS:
            raise FrameError(
                f"unknown command {command[:40]!r} (accepted: {', '.join(sorted(CLIENT_COMMANDS))})"
            )
        if len(lines) > MAX_HEADERS:
            raise FrameError(f"{command}: more than {MAX_HEADERS} headers")
        headers: dict[str, str] = {}
        escaped = command not in _UNESCAPED
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise FrameError(f"{command}: header line {line[:60]!r} has no ':'")
            try:
                if escaped:
                    key = _unescape(name, command)
                    text = _unescape(value, command)
                else:
                    key, text = name.decode(), value.decode()
            except UnicodeDecodeError:
                raise FrameError(f"{command}: header {name[:40]!r} is not UTF-8") from None
            headers.setdefault(key, text)
        return Frame(command, headers)
