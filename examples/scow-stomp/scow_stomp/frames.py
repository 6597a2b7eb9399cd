"""STOMP 1.2 frames without I/O: bytes in, `Frame`s out, and frames back to bytes.

A frame is a command line, header lines, a blank line and a body ended by NUL; a lone
end-of-line between frames is a heart-beat. Header values escape `\\`, CR, LF and `:`
(STOMP 1.2 section "Value Encoding"), except in CONNECT and CONNECTED frames. A body is
read by `content-length` when the header is there, up to the first NUL otherwise.

A SEND whose body is the parser's `stream_from` bytes or more (a large message) is not
held whole: its frame comes out with `streamed` set and an empty body, then its body as
`BodyPart`s as the bytes arrive, the last one once the NUL after them is seen. With a
`content-length`, that is known from its headers; without one, once `stream_from` bytes
of its body have come without a NUL (searched once each, as they arrive).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
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
#: The largest body a large SEND can have whatever `[stomp] max-message-size` says: the
#: 32-bit length of the AMQP data or string section it is stored as (4 GiB less a byte).
MAX_BODY_SIZE = 0xFFFF_FFFF


class FrameError(ValueError):
    """The bytes are not a STOMP frame; the message says what was wrong."""


class FrameTooLarge(FrameError):
    """A frame (or a streamed body) over its limit; the message names the setting."""


@dataclass
class Frame:
    """One STOMP frame. When a header repeats, its first value counts (as the spec says)."""

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: The body follows as `BodyPart`s (a large SEND), not in `body`.
    streamed: bool = False

    def encode(self) -> bytes:
        return encode(self.command, self.headers, self.body)


@dataclass
class BodyPart:
    """The next bytes of a streamed frame's body (valid until the next part is asked
    for); `last` on the part that ends it, perhaps empty."""

    data: memoryview
    last: bool


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
    return encode_head(command, headers, len(body)) + body + b"\x00"


def encode_head(command: str, headers: Mapping[str, str], length: int) -> bytes:
    """A frame's bytes up to its body, which is `length` bytes (then NUL) long."""
    lines = [command.encode()]
    if command in _UNESCAPED:
        lines += [f"{k}:{v}".encode() for k, v in headers.items()]
    else:
        lines += [_escape(k) + b":" + _escape(str(v)) for k, v in headers.items()]
    if length and "content-length" not in headers:
        lines.append(b"content-length:%d" % length)
    return b"\n".join(lines) + b"\n\n"


class Parser:
    """Cuts a byte stream into frames; `feed` returns the complete ones.

    Heart-beats (end-of-lines between frames) are counted in `heartbeats`, not returned.
    A malformed frame raises FrameError, an oversize one FrameTooLarge; the stream cannot
    be trusted after that, so the connection should answer ERROR and close.

    `max_frame_size` bounds a frame's headers and any body held in memory. A SEND
    whose body reaches `stream_from` bytes comes out streamed (see the module's doc):
    at once when its content-length says so, otherwise once that many bytes have come
    without a NUL. A streamed body is bounded by `max_message_size` instead (0: no
    limit of its own), and always by MAX_BODY_SIZE: by its content-length before it
    arrives, or as it arrives.
    """

    def __init__(
        self, max_frame_size: int, stream_from: int | None = None, max_message_size: int = 0
    ) -> None:
        self.max_frame_size = max_frame_size
        self.stream_from = stream_from
        self.max_message_size = max_message_size
        #: What a streamed body may not exceed, and why (for the error).
        if 0 < max_message_size <= MAX_BODY_SIZE:
            self._body_limit = max_message_size
            self._limit_reason = f"[stomp] max-message-size {max_message_size}"
        else:
            self._body_limit = MAX_BODY_SIZE
            self._limit_reason = (
                f"the 4 GiB ({MAX_BODY_SIZE} bytes) an AMQP body section can hold, the "
                f"limit whatever [stomp] max-message-size ({max_message_size}) says"
            )
        self.heartbeats = 0
        self._buffer = bytearray()
        #: Where the next frame starts: frames are read in place, and what they used is
        #: cut off once per `feed` (cutting per frame would copy the rest each time).
        self._pos = 0
        #: How far past its start the frame being read was searched for its NUL, so that
        #: a body that comes in many reads is searched once, not once per read.
        self._searched = 0
        #: Bytes of a streamed body still to come (then its NUL); None: not streaming.
        self._body_left: int | None = None
        #: A streamed body ends at its NUL (no content-length); bytes of it so far.
        self._to_nul = False
        self._streamed = 0

    def feed(self, data: bytes) -> Iterator[Frame | BodyPart]:
        view = memoryview(data)
        while view:
            if self._to_nul:
                view = yield from self._stream_to_nul(view)
            elif self._body_left is None:
                view = yield from self._frames(view)
            else:
                view = yield from self._stream(view)

    def _frames(self, view: memoryview) -> Generator[Frame, None, memoryview]:
        """The frames the buffer holds once `view` is added; returns the bytes after a
        streamed frame's head (its body, handed on in parts) or nothing."""
        self._buffer += view
        try:
            while (frame := self._next()) is not None:
                yield frame
                if frame.streamed:  # the rest is a copy of at most one read
                    rest = memoryview(bytes(self._buffer[self._pos :]))
                    self._pos = len(self._buffer)
                    return rest
            return memoryview(b"")
        finally:
            del self._buffer[: self._pos]
            self._pos = 0

    def _stream(self, view: memoryview) -> Generator[BodyPart, None, memoryview]:
        """Hand out what `view` holds of a streamed body; returns what follows it."""
        left = self._body_left
        assert left is not None
        part = view[:left]
        left -= len(part)
        rest = view[len(part) :]
        if left or not rest:  # its end (or NUL) is still to come
            self._body_left = left
            if part:
                yield BodyPart(part, last=False)
            return rest
        if rest[0] != 0:
            raise FrameError("SEND: no NUL after the bytes content-length announced")
        self._body_left = None
        yield BodyPart(part, last=True)
        return rest[1:]

    def _stream_to_nul(self, view: memoryview) -> Generator[BodyPart, None, memoryview]:
        """Hand out what `view` holds of a streamed body without content-length, up to
        its NUL; returns what follows it."""
        data = bytes(view)  # memoryview has no find(); one copy of one read
        end = data.find(0)
        part = memoryview(data)[: len(data) if end == -1 else end]
        self._streamed += len(part)
        if self._streamed > self._body_limit:
            raise FrameTooLarge(
                f"SEND body of more than {self._body_limit} bytes (it has no "
                f"content-length) exceeds {self._limit_reason}"
            )
        if end == -1:
            if part:
                yield BodyPart(part, last=False)
            return memoryview(b"")
        self._to_nul = False
        yield BodyPart(part, last=True)
        return memoryview(data)[end + 1 :]

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
                raise FrameTooLarge(
                    f"frame headers exceed [stomp] max-frame-size {self.max_frame_size}"
                )
            return None
        lines = bytes(buf[start:head_end]).replace(b"\r\n", b"\n").split(b"\n")
        frame = self._head(lines)
        self._check_size(frame, body_start - start, "headers")
        stream_from = self.stream_from if frame.command == "SEND" else None
        length = frame.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise FrameError(f"{frame.command}: content-length {length!r} is not a number")
            size = int(length)
            if stream_from is not None and size >= stream_from:
                if size > self._body_limit:
                    raise FrameTooLarge(
                        f"SEND body of {size} bytes (its content-length) exceeds "
                        f"{self._limit_reason}"
                    )
                frame.streamed = True
                self._body_left = size
                self._pos = body_start
                return frame
            self._check_size(frame, body_start + size - start)
            if len(buf) < body_start + size + 1:
                return None
            if buf[body_start + size] != 0:
                raise FrameError(
                    f"{frame.command}: no NUL after the {size} bytes content-length announced"
                )
            body_end = body_start + size
        else:
            body_end = buf.find(b"\x00", max(body_start, start + self._searched))
            size = (len(buf) if body_end == -1 else body_end) - body_start
            if stream_from is not None and size >= stream_from:
                frame.streamed = True
                self._to_nul = True
                self._streamed = 0
                self._searched = 0
                self._pos = body_start
                return frame
            self._check_size(frame, body_start + size - start)
            if body_end == -1:
                self._searched = len(buf) - start
                return None
        self._searched = 0
        frame.body = bytes(buf[body_start:body_end])
        self._pos = body_end + 1
        return frame

    def _check_size(self, frame: Frame, size: int, what: str = "frame") -> None:
        if size > self.max_frame_size:
            raise FrameTooLarge(
                f"{frame.command} {what} of {size} bytes or more exceeds [stomp] "
                f"max-frame-size {self.max_frame_size}"
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
