"""STOMP frames to and from the broker's message encoding (AMQP 1.0).

The broker stores and forwards messages in the encoding its `message_format` reads,
which is AMQP 1.0's, so a STOMP SEND becomes an AMQP message once, at the edge (as
Artemis converts STOMP frames to its core messages), and AMQP consumers read it as any
other. Headers map like this, both ways:

- `persistent` -> header durable; `priority` -> header priority; `expires` (ms since
  the epoch) -> ttl;
- `content-type`, `correlation-id`, `reply-to`, `subject` -> the properties of that name;
- every other header (except the frame's own: destination, receipt, transaction,
  content-length) -> an application property (a string).

A body sent with `content-length` is binary (an AMQP data section); without it, text
(an AMQP string value), as Artemis tells STOMP bytes and text messages apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from proton import Message as AmqpMessage

from scow_stomp import amqp_codec

#: Headers that steer the SEND frame itself, never part of the message.
FRAME_HEADERS = frozenset({"destination", "receipt", "transaction", "content-length"})
#: Headers carried as AMQP properties of the same name.
PROPERTY_HEADERS = ("content-type", "correlation-id", "reply-to", "subject")
_HEADER_FIELDS = frozenset({"persistent", "priority", "expires", *PROPERTY_HEADERS})
#: Headers a MESSAGE frame sets itself; application properties may not override them.
_MESSAGE_HEADERS = frozenset({"subscription", "message-id", "destination", "ack"})


def to_amqp(headers: Mapping[str, str], body: bytes, address: str) -> bytes:
    """The AMQP 1.0 encoding of a SEND frame's message, addressed to `address`.

    Raises ValueError naming a header whose value is not accepted.
    """
    return b"".join(to_amqp_sections(headers, body, address))


def to_amqp_sections(headers: Mapping[str, str], body: bytes, address: str) -> tuple[bytes, bytes]:
    """`to_amqp` as (the sections before the body, the body section)."""
    text = "content-length" not in headers
    return to_amqp_head(headers, address), amqp_codec.body_section(
        body.decode("utf-8", "surrogateescape") if text else body
    )


def to_amqp_head(headers: Mapping[str, str], address: str) -> bytes:
    """The sections before the body of a SEND frame's message (see `to_amqp`)."""
    priority = headers.get("priority")
    if priority is not None and (not priority.isdigit() or int(priority) > 9):
        raise ValueError(f"priority {priority!r}: expected an integer from 0 to 9")
    ttl = 0
    expires = headers.get("expires")
    if expires is not None and expires != "0":
        if not expires.isdigit():
            raise ValueError(f"expires {expires!r}: expected milliseconds since the epoch")
        ttl = max(int(expires) - int(time.time() * 1000), 1)
    return amqp_codec.encode_head(
        to=address,
        durable=persistent(headers),
        priority=None if priority is None else int(priority),
        ttl_ms=ttl,
        properties={k: headers[k] for k in PROPERTY_HEADERS if k in headers},
        application_properties={
            k: v for k, v in headers.items() if k not in FRAME_HEADERS and k not in _HEADER_FIELDS
        },
    )


def persistent(headers: Mapping[str, str]) -> bool:
    """The SEND frame asks for a durable message (`persistent:true`)."""
    return headers.get("persistent", "false").lower() == "true"


def from_amqp(data: bytes) -> tuple[dict[str, str], bytes]:
    """The headers and body of a MESSAGE frame for a stored message (any producer's)."""
    try:
        parts = amqp_codec.decode(data)
    except (amqp_codec.Unsupported, IndexError, UnicodeDecodeError):
        parts = _decode_with_proton(data)
    headers = {
        str(k): _text(v)
        for k, v in parts.application_properties.items()
        if str(k) not in _MESSAGE_HEADERS
    }
    for header in PROPERTY_HEADERS:
        value = parts.properties.get(header)
        if value is not None:
            headers[header] = _text(value)
    if parts.durable:
        headers["persistent"] = "true"
    if parts.priority != 4:
        headers["priority"] = str(parts.priority)
    message_id = parts.properties.get("message-id")
    if message_id is not None:
        headers["amqp-message-id"] = _text(message_id)
    body = parts.body
    if body is None:
        payload = b""
    elif isinstance(body, (bytes, bytearray, memoryview)):
        payload = bytes(body)
    elif isinstance(body, str):
        payload = body.encode("utf-8", "surrogateescape")
    else:  # maps, lists, numbers from AMQP producers: their text
        payload = str(body).encode()
    return headers, payload


def _decode_with_proton(data: bytes) -> amqp_codec.Parts:
    """Any AMQP message, through proton's general (and slower) decoder."""
    message = AmqpMessage()
    message.decode(data)
    properties: dict[str, Any] = {"message-id": message.id}
    for header in PROPERTY_HEADERS:
        value = getattr(message, header.replace("-", "_"))
        # proton reads an absent content-type as the symbol "None"
        if value and not (header == "content-type" and value == "None"):
            properties[header] = value
    return amqp_codec.Parts(
        durable=bool(message.durable),
        priority=int(message.priority),
        properties={k: v for k, v in properties.items() if v is not None},
        application_properties=dict(message.properties or {}),
        body=message.body,
    )


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
