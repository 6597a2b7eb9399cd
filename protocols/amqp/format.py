"""AMQP 1.0 messages as the broker sees them: a MessageFormat over the narrow codec."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog
from proton import Message as ProtonMessage

from scow.core.duplicates import DUPLICATE_ID_PROPERTY, key_of
from scow.core.message import Header, Message
from scow.core.speedups import PURE_PYTHON
from scow.protocols.amqp import codec

if PURE_PYTHON:
    Inspector = None
else:
    try:  # the C build of `inspect` (protocols/amqp/_speedups.c); optional, as a compiler is
        from scow.protocols.amqp._speedups import Inspector
    except ImportError:
        Inspector = None

log = structlog.get_logger("scow.amqp")

_DUPLICATE_ID_NAME = DUPLICATE_ID_PROPERTY.encode()
_NAME_SIZE = len(_DUPLICATE_ID_NAME)
#: Message beginnings (up to the duplicate id's name) an id-layouts cache holds.
ID_LAYOUTS_CACHE_SIZE = 256
#: Up to this size a message's bytes are searched whole for the property's name; past it,
#: reading its section headers up to the application properties costs less.
_SEARCH_WHOLE = 4096
#: The descriptor codes of body sections (each section is a described value, `00 53 code`
#: with the usual smallulong descriptor).
_BODY_SECTIONS = frozenset((codec.DATA, codec.AMQP_SEQUENCE, codec.AMQP_VALUE))
_HEADER = codec.HEADER
#: What `inspect` reads of a message that is only a body: the header's defaults, no id.
_BODY_ONLY: Header = (False, 4, 0, None)
#: `AmqpMessageFormat._id_shape`: (a message's bytes up to its id's constructor, where
#: the id's length byte is, where the application properties end, whether the id is a
#: string, the header's durable, priority and ttl).
_IdShape = tuple[bytes, int, int, bool, bool, int, int]
#: Before any id was read by layout: no message begins with a section of code 0.
_NO_SHAPE: _IdShape = (b"\x00\x53\x00", 0, 0, False, False, 4, 0)


class AmqpMessageFormat:
    """Reads header fields and rewrites delivery-count without re-encoding the message."""

    name = "amqp-1.0"

    def __init__(self, *, speedups: bool = True) -> None:
        #: `MessageFormat.inspect`: `_inspect`, or (`speedups`, when built) its C build,
        #: which reads the usual layouts itself and hands any other message to `_inspect`.
        self.inspect: Callable[[bytes], Header] = (
            Inspector(self._inspect) if speedups and Inspector is not None else self._inspect
        )
        #: Encoded application-properties -> decoded, shared by `properties` callers.
        self._properties: dict[bytes, dict[str, Any]] = {}
        #: A message's bytes before the duplicate id's name -> where its application
        #: properties end when the name there is one of their keys, else -1.
        self._id_layouts: dict[bytes, int] = {}
        #: The last id read by its layout: (the message's bytes up to the id's
        #: constructor, included; where the id's length byte is; where the application
        #: properties end; whether the id is a string; the header's three fields).
        self._id_shape: _IdShape = _NO_SHAPE

    def _inspect(self, data: bytes) -> Header:
        # No duplicate id, nearly always. A message that begins with its body has neither
        # a header nor application properties (both come before it): nothing to read.
        # Others cost one search for the property's name (`find`: `in` costs twice as
        # much) before anything is parsed.
        try:
            first = data[2] if data[1] == 0x53 and data[0] == 0 else None
        except IndexError:
            first = None  # too short to be a message: parse_header says why
        if first in _BODY_SECTIONS:
            return _BODY_ONLY
        shape = self._id_shape
        if data.startswith(shape[0]):
            # alike up to its id's constructor with the last message whose id was read by
            # layout (`_duplicate_id_at`): the same header, the same layout, the id's
            # length next; one test and one slice
            _prefix, length_at, end, string, durable, priority, ttl = shape
            if end <= len(data):
                stop = length_at + 1 + data[length_at]
                if stop <= end and (not string or _is_utf8(data, length_at + 1, stop)):
                    return durable, priority, ttl, data[length_at - 1 : stop]
        if first is not None and first != _HEADER:
            # no header section: its defaults, without the call (parse_header's first test)
            durable, priority, ttl = False, 4, 0
        else:
            durable, priority, ttl, _first, _count = codec.parse_header(data)
            ttl = ttl or 0
        if len(data) <= _SEARCH_WHOLE:
            at = data.find(_DUPLICATE_ID_NAME)
            if at < 0:
                return durable, priority, ttl, None
            return durable, priority, ttl, self._duplicate_id_at(data, at, (durable, priority, ttl))
        return durable, priority, ttl, self._duplicate_id(data)

    def selector_lookup(self, message: Message) -> Callable[[str], object]:
        return codec.selector_lookup(codec.MessageInfo(message.data))

    def properties(self, data: bytes) -> Mapping[str, object]:
        # paged messages of one producer mostly carry the same few property maps
        return codec.application_properties(data, self._properties)

    def for_delivery(self, message: Message, delivery_count: int) -> bytes:
        if delivery_count == 0:
            return message.data
        try:
            return codec.with_delivery_count(message.data, delivery_count)
        except codec.DecodeError:  # a malformed message: delivered as it came
            return message.data

    def annotate(self, data: bytes, annotations: Mapping[str, object]) -> bytes:
        try:
            return codec.with_annotations(data, dict(annotations))
        except codec.DecodeError as exc:  # a malformed message: moved as it came
            log.warning("message not annotated: it cannot be decoded", reason=str(exc))
            return data

    def target_address(self, data: bytes) -> str | None:
        return codec.MessageInfo(data).to

    def _duplicate_id_at(self, data: bytes, at: int, fields: tuple[bool, int, int]) -> object:
        """The duplicate id (`Header`: its key) of a message holding the property's name
        at `at`, whose header's fields are `fields`.

        Whether the name there is a key of the application properties depends only on
        the bytes before it: messages alike up to there (a producer's, mostly) are parsed
        for the first of them (`_id_layouts`), and the others' id (a binary or a string
        of up to 255 bytes) read at once after the name: its encoding is its key, so the
        key is one slice. Any other value, or the name elsewhere, is read the long way.
        An id read by layout makes its message the shape `inspect` tests the next one
        against before anything else (`_id_shape`): a producer's next message, mostly.
        """
        prefix = data[:at]
        layouts = self._id_layouts
        end = layouts.get(prefix)
        if end is None:
            try:
                end = codec.application_property_key_end(data, at - 2, _NAME_SIZE)
            except codec.DecodeError:
                return None  # unreadable properties: no id to go by
            if len(layouts) >= ID_LAYOUTS_CACHE_SIZE:
                layouts.clear()
            layouts[prefix] = end
        value = at + _NAME_SIZE
        if value + 2 <= end <= len(data):
            code = data[value]
            stop = value + 2 + data[value + 1]
            if stop <= end and (code == 0xA0 or code == 0xA1):  # vbin8, str8
                string = code == 0xA1
                if string and not _is_utf8(data, value + 2, stop):
                    return None  # as the long way: unreadable, no id to go by
                self._id_shape = (data[: value + 1], value + 1, end, string, *fields)
                return data[value:stop]
        return self._duplicate_id(data)

    @staticmethod
    def _duplicate_id(data: bytes) -> object:
        """The duplicate id as `Header` holds it: its key, or a value of another type."""
        try:  # reads the section headers and the application-properties' keys only
            value = codec.application_property(data, DUPLICATE_ID_PROPERTY)
        except codec.DecodeError:
            return None  # unreadable properties: no id to go by
        key = key_of(value)
        return value if key is None else key

    def describe(self, data: bytes, preview: int) -> dict[str, Any]:
        try:
            return _described(data, preview)
        except Exception as exc:  # proton's decoder and getters raise kinds of their own
            # a malformed message that was accepted as bytes: said, not a failed request
            return {
                **dict.fromkeys(_DESCRIBED, None),
                "properties": {},
                "annotations": {},
                "body-preview": "",
                "unreadable": f"the message cannot be decoded: {exc}",
            }


def _described(data: bytes, preview: int) -> dict[str, Any]:
    message = ProtonMessage()
    message.decode(data)
    body = message.body
    if isinstance(body, (bytes, memoryview)):
        text = bytes(body)[:preview].decode("utf-8", "replace")
    else:
        text = str(body)[:preview]
    return {
        "message-id": _plain(message.id),
        "correlation-id": _plain(message.correlation_id),
        "subject": message.subject,
        "to": message.address,
        "reply-to": message.reply_to,
        "content-type": message.content_type,
        "properties": _plain_map(message.properties, "application-properties"),
        "annotations": _plain_map(message.annotations, "message-annotations"),
        "body-preview": text,
    }


#: The fields `describe` reads from the properties section.
_DESCRIBED = ("message-id", "correlation-id", "subject", "to", "reply-to", "content-type")


def _plain_map(value: Any, section: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"its {section} section holds a {type(value).__name__}, not a map")
    return {str(k): _plain(v) for k, v in value.items()}


def _is_utf8(data: bytes, start: int, stop: int) -> bool:
    try:
        data[start:stop].decode()
    except UnicodeDecodeError:
        return False
    return True


def _plain(value: Any) -> Any:
    """JSON-able: proton's UUIDs, binaries and the like as strings."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


AMQP_FORMAT = AmqpMessageFormat()
