"""Large messages over STOMP: bodies go through in pieces, not whole.

In: a SEND whose body is `[stomp] min-large-message-size` or more (the parser hands it
out in parts, see `scow_stomp.frames`) becomes an `IncomingSend`, which writes the
message's AMQP head, then its body section's bytes as they arrive, to the message's
store: a data section when a content-length gave its size, otherwise a string value
(STOMP's text body) whose size is written over its placeholder once the NUL has come.

Out: a large message goes out as a `StreamedFrame`: its sections' heads read from its
store, the MESSAGE frame's head, then its body's bytes (data sections, or a binary or
string value) read as the socket takes them. The one exception is a body STOMP cannot
carry as it is (a list, a map, amqp-sequence sections): its frame carries its text,
whose length is only known once the whole value is decoded, so it is read whole first.
"""

from __future__ import annotations

import codecs
import struct
from collections.abc import Callable, Generator
from typing import Any, NoReturn

from scow.core import LargeHead, MessageRef
from scow_stomp import amqp_codec, convert, frames

_U32 = struct.Struct(">I")
#: The encodings of a body whose bytes STOMP sends as they are: binary and string.
_BYTES = frozenset({0xA0, 0xB0})
_BYTES_OR_TEXT = _BYTES | {0xA1, 0xB1}


class IncomingSend:
    """A large SEND arriving: its head kept, everything written to its message's file."""

    __slots__ = ("address", "arrival", "head", "receipt", "routing", "sync", "text", "tx")

    def __init__(
        self,
        store: Any,
        file_id: int,
        head: bytes,
        size: int | None,
        *,
        sync: bool,
        address: str,
        routing: Any,
        tx: Any,
        receipt: str | None,
    ) -> None:
        """`store` is the broker's large message store, `head` the message's sections
        before its body of `size` bytes (None: a text body that ends at its NUL);
        `address`, `routing` and `tx` say where it goes once whole, `receipt` what to
        answer then. Raises OSError when its file cannot be written."""
        self.head = head
        self.sync = sync
        self.address = address
        self.routing = routing
        self.tx = tx
        self.receipt = receipt
        #: Checks a text body is UTF-8 as it arrives (an AMQP string must be).
        self.text = None if size is not None else codecs.getincrementaldecoder("utf-8")()
        self.arrival = store.begin(file_id)
        try:
            if size is None:
                self.arrival.write(head + amqp_codec.text_section_head(0))
            else:
                self.arrival.write(head + amqp_codec.data_section_head(size))
        except OSError:
            self.arrival.abandon()
            raise

    def write(self, data: memoryview) -> None:
        """The body's next bytes. Raises OSError when they cannot be stored, ValueError
        when a text body is not UTF-8 (leaving the caller to `abandon`)."""
        if self.text is not None:
            self._check_text(data)
        self.arrival.write(data)

    def _check_text(self, data: memoryview, final: bool = False) -> None:
        assert self.text is not None
        try:
            self.text.decode(data, final)  # the text itself is not kept
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"a body without content-length is text and must be UTF-8 ({exc.reason}); "
                "send a binary body with a content-length"
            ) from None

    def complete(self) -> LargeHead:
        """The body has arrived whole: the message, its body in its file (raises
        OSError or ValueError as `write`)."""
        if self.text is not None:
            self._check_text(memoryview(b""), final=True)
            section = amqp_codec.text_section_head(0)
            size = self.arrival.written - len(self.head) - len(section)
            self.arrival.overwrite(len(self.head), amqp_codec.text_section_head(size))
        return LargeHead(self.head, self.arrival.complete(len(self.head), sync=self.sync))

    def abandon(self) -> None:
        """The message will not be kept (the connection went, the file system failed)."""
        self.arrival.abandon()

    def refused(self, reason: object) -> str:
        """What the client is told when its store refused the message."""
        where = self.arrival.store.describe(self.arrival.file_id)
        return f"SEND to {self.address!r}: large message ({where}) not stored: {reason}"


class StreamedFrame:
    """A MESSAGE frame of a large message, written as its store hands out its body.

    Its `chunks` are the frame's bytes, read as they are asked for: `b""` while the
    store is still reading (it calls `wake` on the event loop once more is ready), so no
    read of a store that must not block the loop (the database's) runs on it. Where the
    body's bytes lie is read first (its sections' heads), then the frame's head goes
    out, then the body from its store. A body STOMP cannot carry as it is (a list, a
    map: converted to its text) is read whole the same way, then converted.
    """

    __slots__ = ("chunks", "ref")

    def __init__(
        self,
        headers: dict[str, str],
        delivered: bytes,
        data: LargeHead,
        wake: Callable[[], None],
    ) -> None:
        """`headers` are the MESSAGE frame's but its content-length, `delivered` the
        message's head as delivered, `data` the stored message."""
        self.chunks: Generator[bytes, None, None] = _frame(headers, delivered, data, wake)
        #: Acknowledged once the frame is written whole (auto mode), released if it is
        #: not; None when the client acknowledges.
        self.ref: MessageRef | None = None


class _Reader:
    """One read of a body from `at` on: its next piece, waiting while the store reads."""

    __slots__ = ("at", "body", "chunks", "piece")

    def __init__(self, data: LargeHead, at: int, wake: Callable[[], None]) -> None:
        self.body = data.body
        self.chunks = data.body.chunks(at, wake)
        #: Where `piece` starts in the message, and what was read and not handed out.
        self.at = at
        self.piece = b""

    def fill(self, size: int) -> Generator[bytes, None, None]:
        """Read until `piece` holds `size` bytes (a few: it is joined) or the body's
        end; `b""` while waiting."""
        while len(self.piece) < size and self.at + len(self.piece) < self.body.length:
            more = next(self.chunks, None)
            if more is None:
                self._short()
            if more:
                self.piece += more
            else:
                yield b""

    def _short(self) -> NoReturn:
        raise OSError(
            f"large message {self.body.store.describe(self.body.file_id)}: ends at "
            f"{self.at + len(self.piece)} of {self.body.length} bytes"
        )

    def between(self, start: int, end: int) -> Generator[bytes, None, None]:
        """The message's bytes from `start` (not before `at`) to `end`; then closes."""
        try:
            while self.at < end:
                yield from self.fill(1)
                if not self.piece:  # a section that says it goes past the body's end
                    self._short()
                piece, self.piece = self.piece, b""
                lo, hi = max(start - self.at, 0), min(end - self.at, len(piece))
                self.at += len(piece)
                if lo < hi:
                    yield piece[lo:hi]
        finally:
            self.chunks.close()


def _frame(
    headers: dict[str, str], delivered: bytes, data: LargeHead, wake: Callable[[], None]
) -> Generator[bytes, None, None]:
    body = data.body
    spans: list[tuple[int, int]] = []
    #: The read that found the first section's head goes on with its bytes.
    first: _Reader | None = None
    pos = body.head_size
    try:
        while pos < body.length:
            reader = _Reader(data, pos, wake)
            yield from reader.fill(8)
            span = _span(reader.piece[:8], pos, not spans)
            if first is None:
                first = reader
            else:
                reader.chunks.close()
            if span is None:  # the footer
                break
            if not span:  # not bytes STOMP can carry as they are
                spans = []
                break
            spans.append(span)
            pos = span[1]
        if not spans and pos < body.length:
            yield from _converted(headers, delivered, data, wake)
            return
        length = sum(end - start for start, end in spans)
        headers["content-length"] = str(length)
        yield frames.encode_head("MESSAGE", headers, length)
        for n, (start, end) in enumerate(spans):
            reader = first if n == 0 and first is not None else _Reader(data, start, wake)
            yield from reader.between(start, end)
    finally:
        if first is not None:
            first.chunks.close()


def _span(head: bytes, pos: int, first: bool) -> tuple[int, int] | tuple[()] | None:
    """Where the STOMP body's bytes of the section at `pos` (whose first bytes are
    `head`) lie: (start, end) for a data section, or a first binary or string value;
    None for the footer; () for anything else."""
    if len(head) < 5 or head[:2] != b"\x00\x53":
        return ()
    code, kind = head[2], head[3]
    if code == amqp_codec.FOOTER:
        return None
    if not (code == amqp_codec.DATA and kind in _BYTES) and not (
        code == amqp_codec.VALUE and kind in _BYTES_OR_TEXT and first
    ):
        return ()
    if kind & 0x10:
        if len(head) < 8:
            return ()
        start, size = pos + 8, _U32.unpack_from(head, 4)[0]
    else:
        start, size = pos + 5, head[4]
    return start, start + size


def _converted(
    headers: dict[str, str], delivered: bytes, data: LargeHead, wake: Callable[[], None]
) -> Generator[bytes, None, None]:
    """The frame of a body converted to its text: read whole first (off the loop where
    the store reads so), as its conversion needs the value decoded."""
    body = data.body
    parts = [delivered]
    for piece in _Reader(data, body.head_size, wake).between(body.head_size, body.length):
        if piece:
            parts.append(piece)
        else:
            yield b""
    _, payload = convert.from_amqp(b"".join(parts))
    yield frames.encode("MESSAGE", headers, payload)
