"""A narrow AMQP 1.0 message codec: what STOMP conversion needs, without proton's objects.

proton's `Message.encode`/`decode` cost about 50 us a message; STOMP converts every
message once each way, so the common shapes are written and read here directly:
header, properties, application-properties and a data or string-value body (AMQP 1.0
part 3, section 3.2). `decode` raises `Unsupported` for anything else it meets (arrays,
described values inside sections, sequence bodies); the caller then falls back to proton.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_U32 = struct.Struct(">I")
_LIST32 = struct.Struct(">BII")
# section descriptors (smallulong codes)
HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, SEQUENCE, VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
#: The properties section's fields, in order (part 3, 3.2.4).
PROPERTY_FIELDS = (
    "message-id", "user-id", "to", "subject", "reply-to", "correlation-id", "content-type",
    "content-encoding", "absolute-expiry-time", "creation-time", "group-id",
    "group-sequence", "reply-to-group-id",
)  # fmt: skip


class Unsupported(ValueError):
    """The message uses an encoding this codec does not read."""


@dataclass
class Parts:
    """The parts of a message STOMP maps to and from headers."""

    durable: bool = False
    priority: int = 4
    ttl: int = 0
    properties: dict[str, Any] = field(default_factory=dict)
    application_properties: dict[str, Any] = field(default_factory=dict)
    #: bytes for data sections; any decoded value for an amqp-value body; None: no body.
    body: Any = None


# --------------------------------------------------------------------------- encoding


def _variable_head(small: int, large: int, size: int) -> bytes:
    """The constructor and length of a variable-width value of `size` bytes."""
    if size < 256:
        return bytes((small, size))
    return bytes((large,)) + _U32.pack(size)


def _variable(small: int, large: int, data: bytes) -> bytes:
    return _variable_head(small, large, len(data)) + data


def _string(text: str) -> bytes:
    return _variable(0xA1, 0xB1, text.encode())


def _symbol(text: str) -> bytes:
    return _variable(0xA3, 0xB3, text.encode("ascii"))


def _compound(code: int, items: list[bytes], count: int) -> bytes:
    body = b"".join(items)
    return _LIST32.pack(code, len(body) + 4, count) + body


def _section(code: int, value: bytes) -> bytes:
    return b"\x00\x53" + bytes((code,)) + value


def encode_head(
    *,
    to: str,
    durable: bool,
    priority: int | None,
    ttl_ms: int,
    properties: Mapping[str, str],
    application_properties: Mapping[str, str],
) -> bytes:
    """An AMQP message's sections before its body: header (when anything in it differs
    from the defaults), properties (`to` and the string `properties` named in
    PROPERTY_FIELDS) and application-properties (string values). A large message keeps
    them in memory and, followed by its body, in its file."""
    out = []
    if durable or priority is not None or ttl_ms:
        fields = [
            b"\x41" if durable else b"\x42",
            b"\x50" + bytes((4 if priority is None else priority,)),
            b"\x70" + _U32.pack(ttl_ms) if ttl_ms else b"\x40",
        ]
        out.append(_section(HEADER, _compound(0xD0, fields, len(fields))))
    values = {**properties, "to": to}
    last = max(PROPERTY_FIELDS.index(name) for name in values)
    fields = []
    for name in PROPERTY_FIELDS[: last + 1]:
        value = values.get(name)
        if value is None:
            fields.append(b"\x40")
        elif name == "content-type":
            fields.append(_symbol(value))
        else:
            fields.append(_string(value))
    out.append(_section(PROPERTIES, _compound(0xD0, fields, len(fields))))
    if application_properties:
        pairs = [_string(k) + _string(v) for k, v in application_properties.items()]
        out.append(_section(APPLICATION_PROPERTIES, _compound(0xD1, pairs, 2 * len(pairs))))
    return b"".join(out)


def body_section(body: bytes | str) -> bytes:
    """A data section (bytes) or string-value section (str) holding `body`."""
    if isinstance(body, str):
        return _section(VALUE, _string(body))
    return _section(DATA, _variable(0xA0, 0xB0, body))


def data_section_head(size: int) -> bytes:
    """What comes before the `size` bytes of a data section: a body written as it
    arrives follows it."""
    return _section(DATA, _variable_head(0xA0, 0xB0, size))


def text_section_head(size: int) -> bytes:
    """What comes before the `size` bytes (UTF-8) of a string-value section, always in
    its 32-bit form: a text body written as it arrives follows it, and this is written
    again once its size is known, in the same number of bytes."""
    return _section(VALUE, b"\xb1" + _U32.pack(size))


# --------------------------------------------------------------------------- decoding

_FIXED: dict[int, tuple[int, str | None]] = {
    0x50: (1, ">B"), 0x51: (1, ">b"), 0x60: (2, ">H"), 0x61: (2, ">h"),
    0x70: (4, ">I"), 0x71: (4, ">i"), 0x72: (4, ">f"), 0x73: (4, ">I"),
    0x80: (8, ">Q"), 0x81: (8, ">q"), 0x82: (8, ">d"), 0x83: (8, ">q"),
    0x52: (1, ">B"), 0x53: (1, ">B"), 0x54: (1, ">b"), 0x55: (1, ">b"),
}  # fmt: skip
_CONSTANTS = {0x40: None, 0x41: True, 0x42: False, 0x43: 0, 0x44: 0}


def _value(data: bytes, pos: int) -> tuple[Any, int]:
    code = data[pos]
    pos += 1
    if code in _CONSTANTS:
        return _CONSTANTS[code], pos
    if code == 0x45:  # list0
        return [], pos
    fixed = _FIXED.get(code)
    if fixed is not None:
        size, fmt = fixed
        return struct.unpack_from(fmt, data, pos)[0], pos + size  # type: ignore[arg-type]
    if code == 0x56:
        return data[pos] != 0, pos + 1
    if code == 0x98:
        return uuid.UUID(bytes=bytes(data[pos : pos + 16])), pos + 16
    if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        if code & 0x10:
            size, pos = _U32.unpack_from(data, pos)[0], pos + 4
        else:
            size, pos = data[pos], pos + 1
        raw = bytes(data[pos : pos + size])
        value: Any = raw if code in (0xA0, 0xB0) else raw.decode()
        return value, pos + size
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        if code & 0x10:
            size, count = struct.unpack_from(">II", data, pos)
            pos += 8
            end = pos + size - 4
        else:
            size, count = data[pos], data[pos + 1]
            pos += 2
            end = pos + size - 1
        items = []
        for _ in range(count):
            item, pos = _value(data, pos)
            items.append(item)
        if pos != end:
            raise Unsupported(f"compound of {count} items ends at {pos}, expected {end}")
        if code in (0xC1, 0xD1):
            return dict(zip(items[::2], items[1::2], strict=True)), pos
        return items, pos
    raise Unsupported(f"AMQP type 0x{code:02x}")


def decode(data: bytes) -> Parts:
    """The parts of an AMQP message; Unsupported when it needs the general decoder."""
    parts = Parts()
    pos = 0
    body: list[bytes] = []
    while pos < len(data):
        if data[pos] != 0x00 or data[pos + 1] != 0x53:
            raise Unsupported("a section without a small numeric descriptor")
        code = data[pos + 2]
        value, pos = _value(data, pos + 3)
        if code == HEADER:
            header = [*value, None, None, None][:3]
            parts.durable = bool(header[0])
            parts.priority = 4 if header[1] is None else header[1]
            parts.ttl = header[2] or 0
        elif code == PROPERTIES:
            parts.properties = {PROPERTY_FIELDS[i]: v for i, v in enumerate(value) if v is not None}
        elif code == APPLICATION_PROPERTIES:
            parts.application_properties = value
        elif code == DATA:
            body.append(value)
        elif code == VALUE:
            parts.body = value
        elif code not in (DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, FOOTER):
            raise Unsupported(f"section 0x{code:02x}")
    if body:
        parts.body = b"".join(body)
    return parts
