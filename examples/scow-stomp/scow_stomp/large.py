"""Large messages over STOMP: never whole in memory, either way.

In: a SEND whose body is `[stomp] min-large-message-size` or more (the parser hands it
out in parts, see `scow_stomp.frames`) becomes an `IncomingSend`, which writes the
message's AMQP head, then its body section's bytes as they arrive, to the message's
file: a data section when a content-length gave its size, otherwise a string value
(STOMP's text body) whose size is written over its placeholder once the NUL has come. Out: a large message whose body STOMP can carry as it is (data sections,
or a binary or string value) goes out as a `StreamedFrame`: the MESSAGE frame's head,
then the body's bytes read from the file as the socket takes them.
"""

from __future__ import annotations

import codecs
import struct
from collections.abc import Callable, Generator
from typing import Any

from scow.core import LargeHead, MessageRef
from scow_stomp import amqp_codec

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


def payload_spans(data: LargeHead) -> list[tuple[int, int]] | None:
    """Where the bytes of a MESSAGE frame's body lie in a large message's file: one
    (start, end) per data section, or the one binary or string value; None for a body
    of another kind (converted whole). Raises OSError when the file cannot be read."""
    body = data.body
    spans: list[tuple[int, int]] = []
    pos = body.head_size
    while pos < body.length:
        chunks = body.chunks(pos)  # read when asked: the section's head only is needed
        try:
            head = next(chunks, b"")[:8]
        finally:
            chunks.close()
        if len(head) < 5 or head[:2] != b"\x00\x53":
            return None
        code, kind = head[2], head[3]
        if code == amqp_codec.FOOTER:
            break
        if not (code == amqp_codec.DATA and kind in _BYTES) and not (
            code == amqp_codec.VALUE and kind in _BYTES_OR_TEXT and not spans
        ):
            return None
        if kind & 0x10:
            if len(head) < 8:
                return None
            start, size = pos + 8, _U32.unpack_from(head, 4)[0]
        else:
            start, size = pos + 5, head[4]
        spans.append((start, start + size))
        pos = start + size
    return spans


class StreamedFrame:
    """A MESSAGE frame whose body is written from its large message's file."""

    __slots__ = ("chunks", "head", "ref")

    def __init__(
        self, head: bytes, data: LargeHead, spans: list[tuple[int, int]], wake: Callable[[], None]
    ) -> None:
        #: The frame up to its body.
        self.head = head
        #: The body's bytes, read as they are asked for; `b""` while the store is still
        #: reading (it calls `wake` on the event loop once more is ready).
        self.chunks: Generator[bytes, None, None] = _read(data, spans, wake)
        #: Acknowledged once the frame is written whole (auto mode), released if it is
        #: not; None when the client acknowledges.
        self.ref: MessageRef | None = None


def _read(
    data: LargeHead, spans: list[tuple[int, int]], wake: Callable[[], None]
) -> Generator[bytes, None, None]:
    for start, end in spans:
        chunks = data.body.chunks(start, wake)
        try:
            pos = start
            while pos < end:
                chunk = next(chunks, None)
                if chunk is None:
                    raise OSError(f"large message {data.body.file_id}: ends at {pos} of {end}")
                chunk = chunk[: end - pos]
                pos += len(chunk)
                yield chunk
        finally:
            chunks.close()
