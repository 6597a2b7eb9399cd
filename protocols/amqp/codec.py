"""A narrow AMQP 1.0 codec for a broker that forwards messages as the bytes it received.

Decoding a whole message with proton and encoding it again costs tens of microseconds and
is never needed to route: the broker reads a few header fields for every message, and
properties or application-properties only when a selector or a routing rule asks. So this
module decodes single values on demand (:func:`decode_value`, :func:`skip_value`), finds
the sections of a message in one cheap pass (:func:`scan_sections`), exposes routing fields
lazily (:class:`MessageInfo`), and edits a message by re-encoding only the section that
changes (:func:`with_delivery_count`, :func:`with_header_fields`, :func:`with_annotations`).
The encoders (:func:`encode_value`, :func:`encode_message`) serve test and perf clients and
the dead-letter and expiry copies the broker builds.

Every decoder accepts any bytes-like object (``bytes``, ``bytearray``, ``memoryview``) and
raises :class:`DecodeError`, never ``IndexError`` or ``struct.error``, on bad input.
"""

from __future__ import annotations

import difflib
import struct
import uuid
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

__all__ = [
    "AMQP_SEQUENCE",
    "AMQP_VALUE",
    "APPLICATION_PROPERTIES",
    "DATA",
    "DELIVERY_ANNOTATIONS",
    "FOOTER",
    "HEADER",
    "HEADER_FIELDS",
    "MESSAGE_ANNOTATIONS",
    "PROPERTIES",
    "PROPERTY_FIELDS",
    "Byte",
    "DecodeError",
    "Described",
    "Int",
    "Long",
    "MessageInfo",
    "Sections",
    "Short",
    "Symbol",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
    "decode_value",
    "encode_message",
    "encode_value",
    "scan_sections",
    "selector_lookup",
    "skip_value",
    "with_annotations",
    "with_delivery_count",
    "with_header_fields",
]

Buffer = bytes | bytearray | memoryview


# ---------------------------------------------------------------------------------------------
# Value types
# ---------------------------------------------------------------------------------------------


class DecodeError(ValueError):
    """Malformed or truncated AMQP data.

    ``offset`` is where the offending value starts and ``constructor`` its constructor byte
    (``None`` when the data ended before one).
    """

    def __init__(self, reason: str, offset: int, constructor: int | None = None) -> None:
        self.reason = reason
        self.offset = offset
        self.constructor = constructor
        where = f"offset {offset}"
        if constructor is not None:
            where += f" (constructor 0x{constructor:02x})"
        super().__init__(f"AMQP decode error at {where}: {reason}")


class Symbol(str):
    """An AMQP symbol: an ASCII string from a constrained domain, such as an annotation key."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class Timestamp(int):
    """An AMQP timestamp: milliseconds since the Unix epoch."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Timestamp({int.__repr__(self)})"


class _SizedInt(int):
    """An int that encodes as one fixed AMQP integer type; construction checks the range."""

    __slots__ = ()
    _lo = 0
    _hi = 0

    def __new__(cls, value: int = 0) -> _SizedInt:
        v = int.__new__(cls, value)
        if not cls._lo <= v <= cls._hi:
            raise ValueError(
                f"{cls.__name__}: {int(v)} is out of range; accepted {cls._lo}..{cls._hi}"
            )
        return v

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int.__repr__(self)})"


class UByte(_SizedInt):
    """AMQP ubyte (0..255)."""

    __slots__ = ()
    _lo, _hi = 0, 0xFF


class UShort(_SizedInt):
    """AMQP ushort (0..65535)."""

    __slots__ = ()
    _lo, _hi = 0, 0xFFFF


class UInt(_SizedInt):
    """AMQP uint (0..2**32-1)."""

    __slots__ = ()
    _lo, _hi = 0, 0xFFFFFFFF


class ULong(_SizedInt):
    """AMQP ulong (0..2**64-1)."""

    __slots__ = ()
    _lo, _hi = 0, 0xFFFFFFFFFFFFFFFF


class Byte(_SizedInt):
    """AMQP byte (-128..127)."""

    __slots__ = ()
    _lo, _hi = -0x80, 0x7F


class Short(_SizedInt):
    """AMQP short (-32768..32767)."""

    __slots__ = ()
    _lo, _hi = -0x8000, 0x7FFF


class Int(_SizedInt):
    """AMQP int (-2**31..2**31-1)."""

    __slots__ = ()
    _lo, _hi = -0x80000000, 0x7FFFFFFF


class Long(_SizedInt):
    """AMQP long (-2**63..2**63-1); plain Python ints encode as this type too."""

    __slots__ = ()
    _lo, _hi = -0x8000000000000000, 0x7FFFFFFFFFFFFFFF


class Described(NamedTuple):
    """An AMQP described value: a descriptor (ulong or symbol) and the value it describes."""

    descriptor: Any
    value: Any


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------

_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from

_MAX_SYMBOL_CACHE = 4096
# Annotation keys and content types repeat across messages; interning them saves the
# decode and the Symbol construction on every lookup after the first.
_symbols: dict[bytes, Symbol] = {}

_Decoder = Callable[[Any, int], tuple[Any, int]]


def _truncated(buf: Any, at: int) -> DecodeError:
    return DecodeError("truncated: the data ends inside this value", at, buf[at])


def _decode(buf: Any, off: int) -> tuple[Any, int]:
    """Decode the value whose constructor is at ``off``; return it and the offset after it."""
    try:
        code = buf[off]
    except IndexError:
        raise DecodeError("truncated: expected a value, found the end of the data", off) from None
    return _DECODERS[code](buf, off + 1)


# Each decoder takes the offset just after its constructor byte, so array elements, which
# share one constructor, reuse the same functions.


def _d_invalid(buf: Any, off: int) -> tuple[Any, int]:
    raise DecodeError("not an AMQP 1.0 type constructor", off - 1, buf[off - 1])


def _d_null(buf: Any, off: int) -> tuple[Any, int]:
    return None, off


def _d_true(buf: Any, off: int) -> tuple[Any, int]:
    return True, off


def _d_false(buf: Any, off: int) -> tuple[Any, int]:
    return False, off


def _d_zero(buf: Any, off: int) -> tuple[Any, int]:
    return 0, off


def _d_list0(buf: Any, off: int) -> tuple[Any, int]:
    return [], off


def _d_bool(buf: Any, off: int) -> tuple[Any, int]:
    try:
        # Lenient like proton: any non-zero byte is true.
        return buf[off] != 0, off + 1
    except IndexError:
        raise _truncated(buf, off - 1) from None


def _d_u8(buf: Any, off: int) -> tuple[Any, int]:
    try:
        return buf[off], off + 1
    except IndexError:
        raise _truncated(buf, off - 1) from None


def _fixed(fmt: str, wrap: Callable[[Any], Any] | None = None) -> _Decoder:
    s = struct.Struct(fmt)
    unpack = s.unpack_from
    n = s.size
    if wrap is None:

        def dec(buf: Any, off: int) -> tuple[Any, int]:
            try:
                return unpack(buf, off)[0], off + n
            except struct.error:
                raise _truncated(buf, off - 1) from None

    else:

        def dec(buf: Any, off: int) -> tuple[Any, int]:
            try:
                return wrap(unpack(buf, off)[0]), off + n
            except struct.error:
                raise _truncated(buf, off - 1) from None

    return dec


def _raw(n: int) -> _Decoder:
    def dec(buf: Any, off: int) -> tuple[Any, int]:
        end = off + n
        if end > len(buf):
            raise _truncated(buf, off - 1)
        return bytes(buf[off:end]), end

    return dec


def _d_uuid(buf: Any, off: int) -> tuple[Any, int]:
    end = off + 16
    if end > len(buf):
        raise _truncated(buf, off - 1)
    return uuid.UUID(bytes=bytes(buf[off:end])), end


def _d_char(buf: Any, off: int) -> tuple[Any, int]:
    try:
        cp = _U32(buf, off)[0]
    except struct.error:
        raise _truncated(buf, off - 1) from None
    if cp > 0x10FFFF:
        raise DecodeError(f"char code point 0x{cp:x} is beyond U+10FFFF", off - 1, buf[off - 1])
    return chr(cp), off + 4


def _span8(buf: Any, off: int) -> tuple[int, int]:
    try:
        start = off + 1
        end = start + buf[off]
    except IndexError:
        raise _truncated(buf, off - 1) from None
    if end > len(buf):
        raise _truncated(buf, off - 1)
    return start, end


def _span32(buf: Any, off: int) -> tuple[int, int]:
    try:
        start = off + 4
        end = start + _U32(buf, off)[0]
    except struct.error:
        raise _truncated(buf, off - 1) from None
    if end > len(buf):
        raise _truncated(buf, off - 1)
    return start, end


def _d_bin8(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span8(buf, off)
    return bytes(buf[start:end]), end


def _d_bin32(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span32(buf, off)
    return bytes(buf[start:end]), end


def _utf8(buf: Any, start: int, end: int, at: int) -> str:
    try:
        return str(buf[start:end], "utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"string is not valid UTF-8 ({e.reason})", at, buf[at]) from None


def _d_str8(buf: Any, off: int) -> tuple[Any, int]:
    try:
        start = off + 1
        end = start + buf[off]
    except IndexError:
        raise _truncated(buf, off - 1) from None
    if end > len(buf):
        raise _truncated(buf, off - 1)
    try:
        return str(buf[start:end], "utf-8"), end
    except UnicodeDecodeError as e:
        raise DecodeError(
            f"string is not valid UTF-8 ({e.reason})", off - 1, buf[off - 1]
        ) from None


def _d_str32(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span32(buf, off)
    return _utf8(buf, start, end, off - 1), end


def _symbol(buf: Any, start: int, end: int, at: int) -> Symbol:
    raw = bytes(buf[start:end])
    sym = _symbols.get(raw)
    if sym is None:
        # Symbols should be ASCII; UTF-8 is accepted because some clients send it and the
        # broker should not drop their messages over it.
        try:
            sym = Symbol(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise DecodeError(f"symbol is not valid UTF-8 ({e.reason})", at, buf[at]) from None
        if len(_symbols) >= _MAX_SYMBOL_CACHE:
            _symbols.clear()
        _symbols[raw] = sym
    return sym


def _d_sym8(buf: Any, off: int) -> tuple[Any, int]:
    try:
        start = off + 1
        end = start + buf[off]
    except IndexError:
        raise _truncated(buf, off - 1) from None
    if end > len(buf):
        raise _truncated(buf, off - 1)
    sym = _symbols.get(bytes(buf[start:end]))
    if sym is not None:
        return sym, end
    return _symbol(buf, start, end, off - 1), end


def _d_sym32(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span32(buf, off)
    return _symbol(buf, start, end, off - 1), end


def _items(buf: Any, p: int, count: int, end: int, at: int) -> list[Any]:
    # Every element carries its own constructor, so it takes at least one byte: a count
    # beyond that is malformed, and rejecting it early bounds the loop.
    if count > end - p:
        raise DecodeError(
            f"count {count} is more than the {end - p} bytes of the body can hold", at, buf[at]
        )
    items: list[Any] = []
    append = items.append
    decoders = _DECODERS
    try:
        for _ in range(count):
            # _decode inlined: this loop decodes every properties and map element.
            code = buf[p]
            if code == 0x40:
                append(None)
                p += 1
            else:
                v, p = decoders[code](buf, p + 1)
                append(v)
    except IndexError:
        raise DecodeError("truncated: expected a value, found the end of the data", p) from None
    if p != end:
        raise DecodeError(f"elements end at offset {p} but the size says offset {end}", at, buf[at])
    return items


def _d_list8(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span8(buf, off)
    if start == end:
        raise DecodeError("list8 size 0 leaves no room for its count", off - 1, buf[off - 1])
    return _items(buf, start + 1, buf[start], end, off - 1), end


def _d_list32(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span32(buf, off)
    if end - start < 4:
        raise DecodeError("list32 size leaves no room for its count", off - 1, buf[off - 1])
    return _items(buf, start + 4, _U32(buf, start)[0], end, off - 1), end


def _to_dict(items: list[Any], buf: Any, at: int) -> dict[Any, Any]:
    if len(items) & 1:
        raise DecodeError(f"map has an odd number of elements ({len(items)})", at, buf[at])
    it = iter(items)
    try:
        return dict(zip(it, it, strict=True))
    except TypeError:
        bad = next(k for k in items[::2] if not _hashable(k))
        raise DecodeError(
            f"map key of type {type(bad).__name__} is not supported", at, buf[at]
        ) from None


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _d_map8(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span8(buf, off)
    if start == end:
        raise DecodeError("map8 size 0 leaves no room for its count", off - 1, buf[off - 1])
    return _to_dict(_items(buf, start + 1, buf[start], end, off - 1), buf, off - 1), end


def _d_map32(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span32(buf, off)
    if end - start < 4:
        raise DecodeError("map32 size leaves no room for its count", off - 1, buf[off - 1])
    items = _items(buf, start + 4, _U32(buf, start)[0], end, off - 1)
    return _to_dict(items, buf, off - 1), end


# Constructors whose values take no bytes; an array of them has only its count to bound it.
_ZERO_WIDTH = frozenset((0x40, 0x41, 0x42, 0x43, 0x44, 0x45))


def _array(buf: Any, p: int, count: int, end: int, at: int) -> list[Any]:
    if p >= end:
        raise DecodeError("array has no element constructor", at, buf[at])
    code = buf[p]
    p += 1
    descriptor: Any = None
    described = code == 0x00
    if described:
        descriptor, p = _decode(buf, p)
        if p >= end:
            raise DecodeError("described array has no element constructor", at, buf[at])
        code = buf[p]
        p += 1
        if code == 0x00:
            raise DecodeError("array element constructor is described twice", at, buf[at])
    limit = len(buf) if code in _ZERO_WIDTH else end - p
    if count > limit:
        raise DecodeError(
            f"array count {count} is more than its {end - p} bytes can hold", at, buf[at]
        )
    dec = _DECODERS[code]
    if dec is _d_invalid:
        raise DecodeError(f"array element constructor 0x{code:02x} is not valid", at, buf[at])
    items: list[Any] = []
    append = items.append
    for _ in range(count):
        v, p = dec(buf, p)
        append(Described(descriptor, v) if described else v)
    if p != end:
        raise DecodeError(
            f"array elements end at offset {p} but the size says offset {end}", at, buf[at]
        )
    return items


def _d_array8(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span8(buf, off)
    if start == end:
        raise DecodeError("array8 size 0 leaves no room for its count", off - 1, buf[off - 1])
    return _array(buf, start + 1, buf[start], end, off - 1), end


def _d_array32(buf: Any, off: int) -> tuple[Any, int]:
    start, end = _span32(buf, off)
    if end - start < 4:
        raise DecodeError("array32 size leaves no room for its count", off - 1, buf[off - 1])
    return _array(buf, start + 4, _U32(buf, start)[0], end, off - 1), end


def _d_described(buf: Any, off: int) -> tuple[Any, int]:
    descriptor, p = _decode(buf, off)
    value, p = _decode(buf, p)
    return Described(descriptor, value), p


_DECODERS: list[_Decoder] = [_d_invalid] * 256
_DECODERS[0x00] = _d_described
_DECODERS[0x40] = _d_null
_DECODERS[0x41] = _d_true
_DECODERS[0x42] = _d_false
_DECODERS[0x56] = _d_bool
_DECODERS[0x50] = _d_u8
_DECODERS[0x60] = _fixed(">H")
_DECODERS[0x70] = _fixed(">I")
_DECODERS[0x52] = _d_u8
_DECODERS[0x43] = _d_zero
_DECODERS[0x80] = _fixed(">Q")
_DECODERS[0x53] = _d_u8
_DECODERS[0x44] = _d_zero
_DECODERS[0x51] = _fixed(">b")
_DECODERS[0x61] = _fixed(">h")
_DECODERS[0x71] = _fixed(">i")
_DECODERS[0x54] = _fixed(">b")
_DECODERS[0x81] = _fixed(">q")
_DECODERS[0x55] = _fixed(">b")
_DECODERS[0x72] = _fixed(">f")
_DECODERS[0x82] = _fixed(">d")
_DECODERS[0x74] = _raw(4)
_DECODERS[0x84] = _raw(8)
_DECODERS[0x94] = _raw(16)
_DECODERS[0x73] = _d_char
_DECODERS[0x83] = _fixed(">q", Timestamp)
_DECODERS[0x98] = _d_uuid
_DECODERS[0xA0] = _d_bin8
_DECODERS[0xB0] = _d_bin32
_DECODERS[0xA1] = _d_str8
_DECODERS[0xB1] = _d_str32
_DECODERS[0xA3] = _d_sym8
_DECODERS[0xB3] = _d_sym32
_DECODERS[0x45] = _d_list0
_DECODERS[0xC0] = _d_list8
_DECODERS[0xD0] = _d_list32
_DECODERS[0xC1] = _d_map8
_DECODERS[0xD1] = _d_map32
_DECODERS[0xE0] = _d_array8
_DECODERS[0xF0] = _d_array32


def _check_offset(offset: int) -> None:
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")


def decode_value(buf: Buffer, offset: int = 0) -> tuple[Any, int]:
    """Decode the AMQP value whose constructor is at ``offset``; return ``(value, next_offset)``.

    Types map to: null ``None``; boolean ``bool``; all integer types ``int``; float and
    double ``float``; decimal32/64/128 the raw big-endian ``bytes``; char a one-character
    ``str``; timestamp :class:`Timestamp` (ms); uuid ``uuid.UUID``; binary ``bytes``;
    string ``str``; symbol :class:`Symbol`; list and array ``list``; map ``dict``;
    described :class:`Described`.
    """
    _check_offset(offset)
    try:
        return _decode(buf, offset)
    except RecursionError:
        raise DecodeError("values are nested too deeply", offset, buf[offset]) from None


# skip_value reads only sizes: fixed widths come from this table, variable ones from the
# size field. Negative entries mark the non-fixed kinds.
_SIZE8 = -1
_SIZE32 = -4
_DESCRIBED = -2
_INVALID = -99
_WIDTH: list[int] = [_INVALID] * 256
for _code in (0x40, 0x41, 0x42, 0x43, 0x44, 0x45):
    _WIDTH[_code] = 0
for _code in (0x50, 0x52, 0x53, 0x51, 0x54, 0x55, 0x56):
    _WIDTH[_code] = 1
for _code in (0x60, 0x61):
    _WIDTH[_code] = 2
for _code in (0x70, 0x71, 0x72, 0x73, 0x74):
    _WIDTH[_code] = 4
for _code in (0x80, 0x81, 0x82, 0x83, 0x84):
    _WIDTH[_code] = 8
for _code in (0x94, 0x98):
    _WIDTH[_code] = 16
for _code in (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0):
    _WIDTH[_code] = _SIZE8
for _code in (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0):
    _WIDTH[_code] = _SIZE32
_WIDTH[0x00] = _DESCRIBED
del _code


def _skip(buf: Any, off: int) -> int:
    """Return the offset just after the value whose constructor is at ``off``."""
    try:
        code = buf[off]
    except IndexError:
        raise DecodeError("truncated: expected a value, found the end of the data", off) from None
    w = _WIDTH[code]
    if w >= 0:
        end = off + 1 + w
    elif w == _SIZE8:
        try:
            end = off + 2 + buf[off + 1]
        except IndexError:
            raise _truncated(buf, off) from None
    elif w == _SIZE32:
        try:
            end = off + 5 + _U32(buf, off + 1)[0]
        except struct.error:
            raise _truncated(buf, off) from None
    elif w == _DESCRIBED:
        return _skip(buf, _skip(buf, off + 1))
    else:
        raise DecodeError("not an AMQP 1.0 type constructor", off, code)
    if end > len(buf):
        raise _truncated(buf, off)
    return end


def skip_value(buf: Buffer, offset: int = 0) -> int:
    """Return the offset just after the value at ``offset``, without building it.

    Only sizes are checked: the contents of a list, map or array are not validated.
    """
    _check_offset(offset)
    try:
        return _skip(buf, offset)
    except RecursionError:
        raise DecodeError("descriptors are nested too deeply", offset, buf[offset]) from None


def _compound(buf: Any, off: int, kinds: str) -> tuple[int, int, int]:
    """Bounds of the list or map at ``off``: ``(first_element, count, end)``.

    ``kinds`` is ``"list"`` or ``"map"``; any other constructor raises DecodeError.
    """
    try:
        code = buf[off]
    except IndexError:
        raise DecodeError(f"truncated: expected a {kinds}", off) from None
    if kinds == "list":
        if code == 0x45:
            return off + 1, 0, off + 1
        small, big = 0xC0, 0xD0
    else:
        small, big = 0xC1, 0xD1
    if code == small:
        start, end = _span8(buf, off + 1)
        if start == end:
            raise DecodeError(f"{kinds} size 0 leaves no room for its count", off, code)
        p, count = start + 1, buf[start]
    elif code == big:
        start, end = _span32(buf, off + 1)
        if end - start < 4:
            raise DecodeError(f"{kinds} size leaves no room for its count", off, code)
        p, count = start + 4, _U32(buf, start)[0]
    else:
        raise DecodeError(f"expected a {kinds}", off, code)
    if count > end - p:
        raise DecodeError(
            f"count {count} is more than the {end - p} bytes of the body can hold", off, code
        )
    return p, count, end


def _element_spans(buf: Any, p: int, count: int, end: int, at: int) -> list[tuple[int, int]]:
    spans = []
    for _ in range(count):
        q = _skip(buf, p)
        spans.append((p, q))
        p = q
    if p != end:
        raise DecodeError(f"elements end at offset {p} but the size says offset {end}", at, buf[at])
    return spans


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_SECTION_NAMES = {
    HEADER: "header",
    DELIVERY_ANNOTATIONS: "delivery-annotations",
    MESSAGE_ANNOTATIONS: "message-annotations",
    PROPERTIES: "properties",
    APPLICATION_PROPERTIES: "application-properties",
    DATA: "data",
    AMQP_SEQUENCE: "amqp-sequence",
    AMQP_VALUE: "amqp-value",
    FOOTER: "footer",
}
_SECTION_SYMBOLS = {
    b"amqp:header:list": HEADER,
    b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES,
    b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": AMQP_SEQUENCE,
    b"amqp:amqp-value:*": AMQP_VALUE,
    b"amqp:footer:map": FOOTER,
}
_ACCEPTED_SECTIONS = ", ".join(f"{n} (0x{c:02x})" for c, n in _SECTION_NAMES.items())

# The order the spec fixes; body sections share one rank.
_RANK = {
    HEADER: 0,
    DELIVERY_ANNOTATIONS: 1,
    MESSAGE_ANNOTATIONS: 2,
    PROPERTIES: 3,
    APPLICATION_PROPERTIES: 4,
    DATA: 5,
    AMQP_SEQUENCE: 5,
    AMQP_VALUE: 5,
    FOOTER: 6,
}
_LISTS = frozenset((0x45, 0xC0, 0xD0))
_MAPS = frozenset((0xC1, 0xD1))
_BINARIES = frozenset((0xA0, 0xB0))
_SECTION_VALUE_KINDS: dict[int, tuple[frozenset[int] | None, str]] = {
    HEADER: (_LISTS, "a list"),
    DELIVERY_ANNOTATIONS: (_MAPS, "a map"),
    MESSAGE_ANNOTATIONS: (_MAPS, "a map"),
    PROPERTIES: (_LISTS, "a list"),
    APPLICATION_PROPERTIES: (_MAPS, "a map"),
    DATA: (_BINARIES, "a binary"),
    AMQP_SEQUENCE: (_LISTS, "a list"),
    AMQP_VALUE: (None, "any value"),
    FOOTER: (_MAPS, "a map"),
}


def _section_code(buf: Any, start: int) -> tuple[int, int]:
    """Read the section starting at ``start``: return its code and the offset of its value."""
    try:
        if buf[start] != 0x00:
            raise DecodeError(
                "expected a described section (0x00) at the top level of the message",
                start,
                buf[start],
            )
        d = buf[start + 1]
        if d == 0x53:
            code, voff = buf[start + 2], start + 3
        elif d == 0x80:
            descriptor = _U64(buf, start + 2)[0]
            code, voff = descriptor if descriptor <= 0xFF else -1, start + 10
        elif d == 0xA3 or d == 0xB3:
            s, e = _span8(buf, start + 2) if d == 0xA3 else _span32(buf, start + 2)
            code, voff = _SECTION_SYMBOLS.get(bytes(buf[s:e]), -1), e
        else:
            raise DecodeError(
                "section descriptor must be a ulong or a symbol", start + 1, buf[start + 1]
            )
    except (IndexError, struct.error):
        raise DecodeError("truncated: the data ends inside a section descriptor", start) from None
    if code not in _SECTION_NAMES:
        raise DecodeError(
            f"unknown section descriptor; accepted {_ACCEPTED_SECTIONS}", start + 1, buf[start + 1]
        )
    return code, voff


#: Distinct application-properties maps an `application_properties` cache holds.
PROPERTIES_CACHE_SIZE = 256


def _application_properties_map(data: Buffer) -> tuple[int, int, int, int] | None:
    """(value offset, first entry, end, entry count) of the application-properties map,
    found by reading section headers only; None when the message has none."""
    n = len(data)
    off = 0
    while off < n:
        if data[off] == 0x00 and off + 3 <= n and data[off + 1] == 0x53:
            code, voff = data[off + 2], off + 3
        else:
            code, voff = _section_code(data, off)
        if code == APPLICATION_PROPERTIES:
            break
        if code > APPLICATION_PROPERTIES:  # the body: there are none
            return None
        off = _skip(data, voff)
    else:
        return None
    try:
        constructor = data[voff]
        if constructor == 0xC1:
            start, end = _span8(data, voff + 1)
            count, p = data[start], start + 1
        elif constructor == 0xD1:
            start, end = _span32(data, voff + 1)
            count, p = _U32(data, start)[0], start + 4
        else:
            raise DecodeError("application-properties section must hold a map", voff, constructor)
    except (IndexError, struct.error):
        raise DecodeError("truncated: application-properties end early", voff) from None
    if count & 1:
        raise DecodeError(f"map has an odd number of elements ({count})", voff, constructor)
    return voff, p, end, count // 2


def application_property(data: Buffer, name: str) -> Any:
    """The value of application property `name`, or None when the message has none.

    Narrower than `application_properties`: it reads the section headers up
    to the application-properties (never the body) and, in that map, compares the keys'
    bytes with the name's and decodes only the value asked for. Raises DecodeError on
    malformed data it reads.
    """
    found = _application_properties_map(data)
    if found is None:
        return None
    voff, p, end, entries = found
    encoded = name.encode("utf-8")
    size = len(encoded)
    try:
        for _ in range(entries):
            code = data[p]
            # keys are str8 (or, from some clients, sym8): compared without decoding
            if code == 0xA1 or code == 0xA3:
                start = p + 2
                p = start + data[p + 1]
                matched = p - start == size and data[start:p] == encoded
            else:
                key, p = _DECODERS[code](data, p + 1)
                matched = key == name
            if p >= end:
                raise DecodeError("a map entry ends past the map's size", voff, data[voff])
            if matched:
                if data[p] == 0xA0:  # vbin8, the usual duplicate id: no decoder to call
                    start = p + 2
                    p = start + data[p + 1]
                    value = bytes(data[start:p])
                else:
                    value, p = _DECODERS[data[p]](data, p + 1)
            else:
                p = _skip(data, p)
            if p > end:
                raise DecodeError("a map entry ends past the map's size", voff, data[voff])
            if matched:
                return value
    except (IndexError, struct.error):
        raise DecodeError("truncated: application-properties end early", voff) from None
    except RecursionError:
        raise DecodeError("map values are nested too deeply", voff, data[voff]) from None
    return None


def application_property_key_end(data: Buffer, offset: int, size: int) -> int:
    """Where the application-properties map ends (offset) when one of its keys, a str8 or
    sym8 of `size` bytes, has its constructor at `offset`; -1 when none has.

    It reads only what lies before the key's bytes, so messages alike up to there get
    the same answer. Raises DecodeError on malformed data it reads.
    """
    found = _application_properties_map(data)
    if found is None:
        return -1
    voff, p, end, entries = found
    try:
        for _ in range(entries):
            if p >= offset:
                matched = p == offset and data[p] in (0xA1, 0xA3) and data[p + 1] == size
                return end if matched else -1
            p = _skip(data, _skip(data, p))  # a key and its value
    except (IndexError, struct.error):
        raise DecodeError("truncated: application-properties end early", voff) from None
    except RecursionError:
        raise DecodeError("map values are nested too deeply", voff, data[voff]) from None
    return -1


def application_properties(
    data: Buffer, cache: dict[bytes, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The application-properties map ({} when absent), reading section headers only up
    to it: what `MessageInfo.application_properties` gives, without scanning the body.
    Raises DecodeError on malformed data it reads.

    With `cache` (encoded map -> decoded map, up to `PROPERTIES_CACHE_SIZE` entries),
    messages whose maps are byte for byte the same share one decoded dict: treat it as
    read-only."""
    found = _application_properties_map(data)
    if found is None:
        return {}
    voff, p, end, entries = found
    if cache is not None:
        encoded = bytes(data[voff:end])
        values = cache.get(encoded)
        if values is None:
            values = application_properties(data)
            if len(cache) >= PROPERTIES_CACHE_SIZE:
                cache.clear()  # values that repeat come back at once
            cache[encoded] = values
        return values
    decoders = _DECODERS
    values: dict[str, Any] = {}
    try:
        for _ in range(entries):
            key, p = decoders[data[p]](data, p + 1)
            value, p = decoders[data[p]](data, p + 1)
            values[key] = value
    except (IndexError, struct.error, KeyError, TypeError):
        raise DecodeError("truncated or malformed application-properties", voff) from None
    except RecursionError:
        raise DecodeError("map values are nested too deeply", voff, data[voff]) from None
    if p > end:
        raise DecodeError("a map entry ends past the map's size", voff, data[voff])
    return values


def head_length(data: Buffer) -> int | None:
    """How many of a message's first bytes `data` are its sections before the body
    (header, annotations, properties, application properties): where its body starts.

    None when those sections go on past the end of `data` (more of the message is
    needed to tell). Raises DecodeError when what `data` holds of them is malformed.
    """
    n = len(data)
    off = 0
    try:
        while off < n:
            code, voff = _section_code(data, off)
            if code >= DATA:  # a body section, or the footer of a message without a body
                return off
            off = _skip(data, voff)
    except DecodeError as exc:
        if exc.reason.startswith("truncated"):
            return None
        raise
    return None


class Sections:
    """Where each section of one message lies, as ``(start, end)`` byte ranges (end exclusive).

    A section that is absent is ``None``. ``body`` covers every body section together (a body
    may be several data or amqp-sequence sections) and ``body_code`` says which kind they
    are. ``spans`` lists ``(code, start, end)`` for every section in message order, and
    ``size`` is the length of the message.
    """

    __slots__ = (
        "application_properties",
        "body",
        "body_code",
        "delivery_annotations",
        "footer",
        "header",
        "message_annotations",
        "properties",
        "size",
        "spans",
    )

    def __init__(self) -> None:
        self.header: tuple[int, int] | None = None
        self.delivery_annotations: tuple[int, int] | None = None
        self.message_annotations: tuple[int, int] | None = None
        self.properties: tuple[int, int] | None = None
        self.application_properties: tuple[int, int] | None = None
        self.body: tuple[int, int] | None = None
        self.body_code: int | None = None
        self.footer: tuple[int, int] | None = None
        self.spans: list[tuple[int, int, int]] = []
        self.size = 0

    def __repr__(self) -> str:
        parts = ", ".join(f"{_SECTION_NAMES[c]}={s}..{e}" for c, s, e in self.spans)
        return f"Sections({parts})"


def _scan(data: Any) -> Sections:
    n = len(data)
    if n == 0:
        raise DecodeError("empty message: expected at least one section", 0)
    sections = Sections()
    spans = sections.spans
    last_rank = -1
    last_code = -1
    off = 0
    while off < n:
        # The smallulong descriptor is what nearly every client sends; test it inline.
        if data[off] == 0x00 and off + 3 <= n and data[off + 1] == 0x53 and data[off + 2] in _RANK:
            code, voff = data[off + 2], off + 3
        else:
            code, voff = _section_code(data, off)
        rank = _RANK[code]
        if rank < last_rank or (
            rank == last_rank and (rank != 5 or code != last_code or code == AMQP_VALUE)
        ):
            if rank == 5 and last_rank == 5:
                why = (
                    "a body has exactly one amqp-value section"
                    if code == AMQP_VALUE and last_code == AMQP_VALUE
                    else f"{_SECTION_NAMES[code]} cannot follow a {_SECTION_NAMES[last_code]} body"
                )
            elif rank == last_rank:
                why = f"duplicate {_SECTION_NAMES[code]} section"
            else:
                why = f"{_SECTION_NAMES[code]} section after {_SECTION_NAMES[last_code]}"
            raise DecodeError(f"sections out of order: {why}", off, data[off])
        kinds, what = _SECTION_VALUE_KINDS[code]
        if voff >= n:
            raise DecodeError(f"truncated: {_SECTION_NAMES[code]} section has no value", off, 0)
        if kinds is not None and data[voff] not in kinds:
            raise DecodeError(f"{_SECTION_NAMES[code]} section must hold {what}", voff, data[voff])
        end = _skip(data, voff)
        spans.append((code, off, end))
        if code == HEADER:
            sections.header = (off, end)
        elif code == DELIVERY_ANNOTATIONS:
            sections.delivery_annotations = (off, end)
        elif code == MESSAGE_ANNOTATIONS:
            sections.message_annotations = (off, end)
        elif code == PROPERTIES:
            sections.properties = (off, end)
        elif code == APPLICATION_PROPERTIES:
            sections.application_properties = (off, end)
        elif code == FOOTER:
            sections.footer = (off, end)
        else:
            body = sections.body
            sections.body = (off, end) if body is None else (body[0], end)
            sections.body_code = code
        last_rank, last_code = rank, code
        off = end
    sections.size = n
    return sections


def scan_sections(data: Buffer) -> Sections:
    """Find every section of ``data`` in one pass, skipping their contents.

    Checks the section order the spec fixes and that each section holds the right kind of
    value; a message without a body is accepted (proton produces them). Contents of lists
    and maps are not validated here.
    """
    try:
        return _scan(data)
    except RecursionError:
        raise DecodeError("descriptors are nested too deeply", 0, data[0]) from None


def _value_offset(data: Any, span: tuple[int, int]) -> int:
    return _section_code(data, span[0])[1]


# ---------------------------------------------------------------------------------------------
# MessageInfo
# ---------------------------------------------------------------------------------------------

PROPERTY_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)
"""The fields of the properties section in list order, by their AMQP names with underscores."""

HEADER_FIELDS = ("durable", "priority", "ttl", "first_acquirer", "delivery_count")
_DEFAULT_HEADER = (False, 4, None, False, 0)
_NO_PROPERTIES = (None,) * len(PROPERTY_FIELDS)


def _header_error(field: str, value: Any, expected: str, at: int, data: Any) -> DecodeError:
    return DecodeError(
        f"header {field} must be {expected}, got {type(value).__name__} {value!r}", at, data[at]
    )


def _parse_header(data: Any) -> tuple[Any, ...]:
    """Header fields of ``data`` (defaults when it has no header), read from offset 0."""
    # The header, when present, is the first section, so no scan is needed; the common
    # smallulong descriptor is tested inline because this runs for every message.
    try:
        if data[0] == 0x00 and data[1] == 0x53:
            if data[2] != HEADER:
                return _DEFAULT_HEADER
            voff = 3
        else:
            code, voff = _section_code(data, 0)
            if code != HEADER:
                return _DEFAULT_HEADER
        code = data[voff]
    except IndexError:
        raise DecodeError("truncated: the message ends inside its first section", 0) from None
    if code == 0xC0:
        try:
            end = voff + 2 + data[voff + 1]
            count = data[voff + 2]
        except IndexError:
            raise _truncated(data, voff) from None
        p = voff + 3
        if end > len(data):
            raise _truncated(data, voff)
    elif code == 0x45:
        return _DEFAULT_HEADER
    else:
        p, count, end = _compound(data, voff, "list")
    if count == 0:
        return _DEFAULT_HEADER
    priority = ttl = first_acquirer = delivery_count = None
    try:
        durable, p = _decode(data, p)
        if count > 1:
            priority, p = _decode(data, p)
            if count > 2:
                ttl, p = _decode(data, p)
                if count > 3:
                    first_acquirer, p = _decode(data, p)
                    if count > 4:
                        delivery_count, p = _decode(data, p)
                        for _ in range(count - 5):
                            p = _skip(data, p)
    except RecursionError:
        raise DecodeError("header values are nested too deeply", voff, data[voff]) from None
    if p != end:
        raise DecodeError(
            f"header elements end at offset {p} but the list size says offset {end}",
            voff,
            data[voff],
        )
    if durable is None:
        durable = False
    elif durable is not True and durable is not False:
        raise _header_error("durable", durable, "a boolean", voff, data)
    if priority is None:
        priority = 4
    elif type(priority) is not int:
        raise _header_error("priority", priority, "a ubyte", voff, data)
    if ttl is not None and type(ttl) is not int:
        raise _header_error("ttl", ttl, "a uint (milliseconds)", voff, data)
    if first_acquirer is None:
        first_acquirer = False
    elif first_acquirer is not True and first_acquirer is not False:
        raise _header_error("first-acquirer", first_acquirer, "a boolean", voff, data)
    if delivery_count is None:
        delivery_count = 0
    elif type(delivery_count) is not int:
        raise _header_error("delivery-count", delivery_count, "a uint", voff, data)
    return (durable, priority, ttl, first_acquirer, delivery_count)


#: The header fields of an encoded message without a `MessageInfo` (routing reads them
#: for every message sent).
parse_header = _parse_header


class MessageInfo:
    """Routing fields of one encoded message, each parsed the first time it is read.

    Header fields come straight from the first section without scanning the message;
    properties, application-properties and message-annotations cost one
    :func:`scan_sections` pass (shared, and skipped when ``sections`` is given) plus the
    decode of that one section. Any field access may raise :class:`DecodeError`. Returned
    dicts are cached: treat them as read-only.
    """

    __slots__ = ("_annotations", "_app", "_header", "_properties", "_sections", "data")

    def __init__(self, data: Buffer, sections: Sections | None = None) -> None:
        self.data = data
        self._sections = sections
        self._header: tuple[Any, ...] | None = None
        self._properties: tuple[Any, ...] | None = None
        self._app: dict[str, Any] | None = None
        self._annotations: dict[Any, Any] | None = None

    def __repr__(self) -> str:
        return f"MessageInfo({len(self.data)} bytes)"

    @property
    def sections(self) -> Sections:
        """The message's section layout, scanned on first use."""
        s = self._sections
        if s is None:
            s = self._sections = scan_sections(self.data)
        return s

    # -- header ---------------------------------------------------------------------------

    @property
    def header(self) -> tuple[bool, int, int | None, bool, int]:
        """``(durable, priority, ttl, first_acquirer, delivery_count)`` with defaults applied."""
        h = self._header
        if h is None:
            h = self._header = _parse_header(self.data)
        return h

    @property
    def durable(self) -> bool:
        """Header durable (default False)."""
        h = self._header
        if h is None:
            h = self._header = _parse_header(self.data)
        return h[0]

    @property
    def priority(self) -> int:
        """Header priority (default 4)."""
        h = self._header
        if h is None:
            h = self._header = _parse_header(self.data)
        return h[1]

    @property
    def ttl(self) -> int | None:
        """Header ttl in milliseconds, or None when the message does not expire by ttl."""
        h = self._header
        if h is None:
            h = self._header = _parse_header(self.data)
        return h[2]

    @property
    def first_acquirer(self) -> bool:
        """Header first-acquirer (default False)."""
        h = self._header
        if h is None:
            h = self._header = _parse_header(self.data)
        return h[3]

    @property
    def delivery_count(self) -> int:
        """Header delivery-count (default 0)."""
        h = self._header
        if h is None:
            h = self._header = _parse_header(self.data)
        return h[4]

    # -- properties -----------------------------------------------------------------------

    def _props(self) -> tuple[Any, ...]:
        p = self._properties
        if p is None:
            span = self.sections.properties
            if span is None:
                p = _NO_PROPERTIES
            else:
                voff = _value_offset(self.data, span)
                try:
                    values = _decode(self.data, voff)[0]
                except RecursionError:
                    raise DecodeError(
                        "properties values are nested too deeply", voff, self.data[voff]
                    ) from None
                n = len(values)
                if n < 13:
                    values.extend([None] * (13 - n))
                p = tuple(values[:13])
            self._properties = p
        return p

    @property
    def properties(self) -> dict[str, Any]:
        """The properties section as ``{field: value}`` for the fields that are set."""
        return {k: v for k, v in zip(PROPERTY_FIELDS, self._props(), strict=True) if v is not None}

    @property
    def message_id(self) -> Any:
        """properties message-id: int (ulong), uuid.UUID, bytes or str; None when unset."""
        return self._props()[0]

    @property
    def user_id(self) -> bytes | None:
        """properties user-id."""
        return self._props()[1]

    @property
    def to(self) -> str | None:
        """properties to (the address the producer sent to)."""
        return self._props()[2]

    @property
    def subject(self) -> str | None:
        """properties subject."""
        return self._props()[3]

    @property
    def reply_to(self) -> str | None:
        """properties reply-to."""
        return self._props()[4]

    @property
    def correlation_id(self) -> Any:
        """properties correlation-id: int (ulong), uuid.UUID, bytes or str; None when unset."""
        return self._props()[5]

    @property
    def content_type(self) -> Symbol | None:
        """properties content-type."""
        return self._props()[6]

    @property
    def content_encoding(self) -> Symbol | None:
        """properties content-encoding."""
        return self._props()[7]

    @property
    def absolute_expiry_time(self) -> int | None:
        """properties absolute-expiry-time in milliseconds since the epoch."""
        return self._props()[8]

    @property
    def creation_time(self) -> int | None:
        """properties creation-time in milliseconds since the epoch."""
        return self._props()[9]

    @property
    def group_id(self) -> str | None:
        """properties group-id."""
        return self._props()[10]

    @property
    def group_sequence(self) -> int | None:
        """properties group-sequence."""
        return self._props()[11]

    @property
    def reply_to_group_id(self) -> str | None:
        """properties reply-to-group-id."""
        return self._props()[12]

    # -- maps -----------------------------------------------------------------------------

    def _map(self, span: tuple[int, int] | None) -> dict[Any, Any]:
        if span is None:
            return {}
        voff = _value_offset(self.data, span)
        try:
            return _decode(self.data, voff)[0]
        except RecursionError:
            raise DecodeError("map values are nested too deeply", voff, self.data[voff]) from None

    @property
    def application_properties(self) -> dict[str, Any]:
        """The application-properties map ({} when absent)."""
        a = self._app
        if a is None:
            a = self._app = self._map(self.sections.application_properties)
        return a

    @property
    def message_annotations(self) -> dict[Any, Any]:
        """The message-annotations map ({} when absent); keys are Symbol or int."""
        a = self._annotations
        if a is None:
            a = self._annotations = self._map(self.sections.message_annotations)
        return a


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------

_P_B = struct.Struct(">B").pack
_P_b = struct.Struct(">b").pack
_P_H = struct.Struct(">H").pack
_P_h = struct.Struct(">h").pack
_P_I = struct.Struct(">I").pack
_P_i = struct.Struct(">i").pack
_P_Q = struct.Struct(">Q").pack
_P_q = struct.Struct(">q").pack
_P_d = struct.Struct(">d").pack
_P_II = struct.Struct(">II").pack


def _e_null(v: Any) -> bytes:
    return b"\x40"


def _e_bool(v: Any) -> bytes:
    return b"\x41" if v else b"\x42"


def _e_long(v: int) -> bytes:
    if -128 <= v <= 127:
        return b"\x55" + _P_b(v)
    if -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF:
        return b"\x81" + _P_q(v)
    raise ValueError(
        f"int {v} does not fit an AMQP long (-2**63..2**63-1); wrap it in ULong for 0..2**64-1"
    )


def _e_ulong(v: int) -> bytes:
    if v == 0:
        return b"\x44"
    if v <= 0xFF:
        return b"\x53" + _P_B(v)
    return b"\x80" + _P_Q(v)


def _e_uint(v: int) -> bytes:
    if v == 0:
        return b"\x43"
    if v <= 0xFF:
        return b"\x52" + _P_B(v)
    return b"\x70" + _P_I(v)


def _e_int(v: int) -> bytes:
    if -128 <= v <= 127:
        return b"\x54" + _P_b(v)
    return b"\x71" + _P_i(v)


def _e_float(v: float) -> bytes:
    return b"\x82" + _P_d(v)


def _e_str(v: str) -> bytes:
    raw = v.encode("utf-8")
    n = len(raw)
    return (b"\xa1" + _P_B(n) if n <= 0xFF else b"\xb1" + _P_I(n)) + raw


def _e_symbol(v: str) -> bytes:
    try:
        raw = v.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"symbol {v!r} is not ASCII; AMQP symbols accept ASCII only") from None
    n = len(raw)
    return (b"\xa3" + _P_B(n) if n <= 0xFF else b"\xb3" + _P_I(n)) + raw


def _e_binary(v: bytes | bytearray | memoryview) -> bytes:
    raw = bytes(v)
    n = len(raw)
    return (b"\xa0" + _P_B(n) if n <= 0xFF else b"\xb0" + _P_I(n)) + raw


def _e_timestamp(v: int) -> bytes:
    return b"\x83" + _P_q(v)


def _e_uuid(v: uuid.UUID) -> bytes:
    return b"\x98" + v.bytes


def _list_bytes(encoded: list[bytes]) -> bytes:
    count = len(encoded)
    if count == 0:
        return b"\x45"
    body = b"".join(encoded)
    if len(body) + 1 <= 0xFF and count <= 0xFF:
        return b"\xc0" + _P_B(len(body) + 1) + _P_B(count) + body
    return b"\xd0" + _P_II(len(body) + 4, count) + body


def _map_bytes(encoded: list[bytes]) -> bytes:
    # Maps have no map0 form, so even an empty map carries a size and count.
    count = len(encoded)
    body = b"".join(encoded)
    if len(body) + 1 <= 0xFF and count <= 0xFF:
        return b"\xc1" + _P_B(len(body) + 1) + _P_B(count) + body
    return b"\xd1" + _P_II(len(body) + 4, count) + body


def _e_list(v: Iterable[Any]) -> bytes:
    return _list_bytes([_enc(x) for x in v])


def _e_map(v: dict[Any, Any]) -> bytes:
    encoded = []
    for k, x in v.items():
        encoded.append(_enc(k))
        encoded.append(_enc(x))
    return _map_bytes(encoded)


def _e_described(v: Described) -> bytes:
    d = v.descriptor
    # A descriptor is a ulong or a symbol; a plain int here means the ulong form.
    dbytes = _e_ulong(d) if type(d) is int else _enc(d)
    return b"\x00" + dbytes + _enc(v.value)


_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    type(None): _e_null,
    bool: _e_bool,
    int: _e_long,
    float: _e_float,
    str: _e_str,
    Symbol: _e_symbol,
    bytes: _e_binary,
    bytearray: _e_binary,
    memoryview: _e_binary,
    Timestamp: _e_timestamp,
    uuid.UUID: _e_uuid,
    UByte: lambda v: b"\x50" + _P_B(v),
    UShort: lambda v: b"\x60" + _P_H(v),
    UInt: _e_uint,
    ULong: _e_ulong,
    Byte: lambda v: b"\x51" + _P_b(v),
    Short: lambda v: b"\x61" + _P_h(v),
    Int: _e_int,
    Long: _e_long,
    list: _e_list,
    tuple: _e_list,
    dict: _e_map,
    Described: _e_described,
}

# Subclasses not in the table (an IntEnum, a user's str subclass) fall back to the first
# base that is, in this order.
_FALLBACKS: tuple[tuple[type, Callable[[Any], bytes]], ...] = (
    (bool, _e_bool),
    (Symbol, _e_symbol),
    (str, _e_str),
    (Timestamp, _e_timestamp),
    (int, _e_long),
    (float, _e_float),
    (bytes, _e_binary),
    (bytearray, _e_binary),
    (memoryview, _e_binary),
    (uuid.UUID, _e_uuid),
    (Described, _e_described),
    (list, _e_list),
    (tuple, _e_list),
    (dict, _e_map),
)
_ENCODABLE = (
    "None, bool, int, float, str, bytes, Symbol, Timestamp, uuid.UUID, the sized int "
    "wrappers (UByte..Long), list, tuple, dict or Described"
)


def _enc(v: Any) -> bytes:
    f = _ENCODERS.get(type(v))
    if f is None:
        for base, g in _FALLBACKS:
            if isinstance(v, base):
                f = g
                break
        else:
            raise TypeError(
                f"cannot encode {type(v).__name__} {v!r} as AMQP; accepted {_ENCODABLE}"
            )
    return f(v)


def encode_value(value: Any) -> bytes:
    """Encode one Python value as AMQP.

    A plain ``int`` encodes as AMQP *long* (smalllong 0x55 for -128..127, else 0x81), never
    as *int* or an unsigned type: proton maps Python ints to long in both directions, and a
    JMS consumer can read a long with ``getLongProperty`` whatever its size, so the type a
    value arrives as does not depend on its magnitude. Wrap the value in :class:`UInt`,
    :class:`ULong`, :class:`Int` and so on for another type. ``float`` encodes as double;
    ``list`` and ``tuple`` as list; ``dict`` as map; ``str`` as string (:class:`Symbol` as
    symbol); ``bytes`` as binary; :class:`Timestamp` as timestamp. Each encoding uses its
    smallest form (str8 before str32, list0/list8 before list32).
    """
    return _enc(value)


# -- message ------------------------------------------------------------------------------


def _section(code: int, value: bytes) -> bytes:
    return b"\x00\x53" + _P_B(code) + value


def _as_symbol_key(k: Any, what: str) -> Any:
    if isinstance(k, Symbol) or type(k) is ULong:
        return k
    if isinstance(k, str):
        return Symbol(k)
    if isinstance(k, int) and not isinstance(k, bool):
        return ULong(k)
    raise TypeError(f"{what} key {k!r} must be a str (sent as a symbol) or an int (sent as ulong)")


def _annotations_map(values: dict[Any, Any], what: str) -> bytes:
    return _e_map({_as_symbol_key(k, what): v for k, v in values.items()})


def _check_bool(field: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"header {field} must be a bool, got {type(v).__name__} {v!r}")
    return v


def _check_uint(field: str, v: Any, hi: int = 0xFFFFFFFF) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{field} must be an int, got {type(v).__name__} {v!r}")
    if not 0 <= v <= hi:
        raise ValueError(f"{field} {v} is out of range; accepted 0..{hi}")
    return v


def _header_list(
    durable: bool, priority: int | None, ttl: int | None, first_acquirer: bool, delivery: int
) -> list[bytes]:
    fields = [
        (b"\x41" if durable else None),
        (b"\x50" + _P_B(priority) if priority is not None else None),
        (_e_uint(ttl) if ttl is not None else None),
        (b"\x41" if first_acquirer else None),
        (_e_uint(delivery) if delivery else None),
    ]
    while fields and fields[-1] is None:
        fields.pop()
    return [b"\x40" if f is None else f for f in fields]


def _id_value(field: str, v: Any) -> bytes:
    if isinstance(v, int) and not isinstance(v, bool):
        return _e_ulong(_check_uint(f"properties {field}", v, 0xFFFFFFFFFFFFFFFF))
    if isinstance(v, str) and not isinstance(v, Symbol):
        return _e_str(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return _e_binary(v)
    if isinstance(v, uuid.UUID):
        return _e_uuid(v)
    raise TypeError(
        f"properties {field} must be an int (ulong), str, bytes or uuid.UUID, "
        f"got {type(v).__name__} {v!r}"
    )


def _str_value(field: str, v: Any) -> bytes:
    if not isinstance(v, str):
        raise TypeError(f"properties {field} must be a str, got {type(v).__name__} {v!r}")
    return _e_str(v)


def _symbol_value(field: str, v: Any) -> bytes:
    if not isinstance(v, str):
        raise TypeError(f"properties {field} must be a str, got {type(v).__name__} {v!r}")
    return _e_symbol(v)


def _time_value(field: str, v: Any) -> bytes:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(
            f"properties {field} must be an int of milliseconds since the epoch, "
            f"got {type(v).__name__} {v!r}"
        )
    return _e_timestamp(v)


def _user_id_value(field: str, v: Any) -> bytes:
    if isinstance(v, str):
        v = v.encode("utf-8")
    if not isinstance(v, bytes | bytearray | memoryview):
        raise TypeError(f"properties {field} must be bytes or str, got {type(v).__name__} {v!r}")
    return _e_binary(v)


def _seq_value(field: str, v: Any) -> bytes:
    return _e_uint(_check_uint(f"properties {field}", v))


_PROPERTY_ENCODERS: tuple[Callable[[str, Any], bytes], ...] = (
    _id_value,
    _user_id_value,
    _str_value,
    _str_value,
    _str_value,
    _id_value,
    _symbol_value,
    _symbol_value,
    _time_value,
    _time_value,
    _str_value,
    _seq_value,
    _str_value,
)
_PROPERTY_INDEX = {name: i for i, name in enumerate(PROPERTY_FIELDS)}
_PROPERTY_INDEX.update({name.replace("_", "-"): i for i, name in enumerate(PROPERTY_FIELDS)})


def _properties_list(properties: dict[str, Any]) -> bytes:
    fields: list[bytes | None] = [None] * 13
    for name, v in properties.items():
        i = _PROPERTY_INDEX.get(name)
        if i is None:
            close = difflib.get_close_matches(str(name), PROPERTY_FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown message property {name!r}; accepted {', '.join(PROPERTY_FIELDS)}{hint}"
            )
        if v is not None:
            fields[i] = _PROPERTY_ENCODERS[i](PROPERTY_FIELDS[i], v)
    while fields and fields[-1] is None:
        fields.pop()
    return _list_bytes([b"\x40" if f is None else f for f in fields])


_BODY_KINDS = ("data", "value", "sequence")


def encode_message(
    body: Any = None,
    *,
    durable: bool = False,
    priority: int | None = None,
    ttl: int | None = None,
    first_acquirer: bool = False,
    delivery_count: int = 0,
    properties: dict[str, Any] | None = None,
    application_properties: dict[str, Any] | None = None,
    message_annotations: dict[Any, Any] | None = None,
    delivery_annotations: dict[Any, Any] | None = None,
    footer: dict[Any, Any] | None = None,
    body_kind: str = "data",
) -> bytes:
    """Encode a complete AMQP message.

    ``ttl`` is in milliseconds. ``properties`` is keyed by :data:`PROPERTY_FIELDS` names
    (``message-id`` style also accepted); ids that are ints go as ulong and times are ints
    of milliseconds. Annotation keys that are str go as symbols, ints as ulong. The header
    is left out when every header field has its default.

    ``body_kind`` picks the body section: ``"data"`` (``body`` is bytes, or a str sent as
    UTF-8), ``"value"`` (an amqp-value holding any encodable ``body``) or ``"sequence"``
    (an amqp-sequence of the items of ``body``). A ``None`` body is sent as an amqp-value
    null whatever the kind, which proton reads back as no body.
    """
    parts: list[bytes] = []
    if durable or priority is not None or ttl is not None or first_acquirer or delivery_count:
        _check_bool("durable", durable)
        _check_bool("first_acquirer", first_acquirer)
        if priority is not None:
            _check_uint("header priority", priority, 0xFF)
        if ttl is not None:
            _check_uint("header ttl", ttl)
        _check_uint("header delivery_count", delivery_count)
        fields = _header_list(durable, priority, ttl, first_acquirer, delivery_count)
        parts.append(_section(HEADER, _list_bytes(fields)))
    if delivery_annotations:
        parts.append(
            _section(
                DELIVERY_ANNOTATIONS, _annotations_map(delivery_annotations, "delivery annotation")
            )
        )
    if message_annotations:
        parts.append(
            _section(
                MESSAGE_ANNOTATIONS, _annotations_map(message_annotations, "message annotation")
            )
        )
    if properties:
        parts.append(_section(PROPERTIES, _properties_list(properties)))
    if application_properties:
        for k in application_properties:
            if not isinstance(k, str) or isinstance(k, Symbol):
                raise TypeError(
                    f"application property key {k!r} must be a str "
                    f"(AMQP allows only string keys there)"
                )
        parts.append(_section(APPLICATION_PROPERTIES, _e_map(application_properties)))
    if body_kind not in _BODY_KINDS:
        raise ValueError(f"body_kind {body_kind!r} is not known; accepted {', '.join(_BODY_KINDS)}")
    if body is None:
        parts.append(_section(AMQP_VALUE, b"\x40"))
    elif body_kind == "data":
        if isinstance(body, str):
            body = body.encode("utf-8")
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(
                f"a data body must be bytes or str, got {type(body).__name__}; "
                f"use body_kind='value' for other values"
            )
        parts.append(_section(DATA, _e_binary(body)))
    elif body_kind == "value":
        parts.append(_section(AMQP_VALUE, _enc(body)))
    else:
        parts.append(_section(AMQP_SEQUENCE, _e_list(body)))
    if footer:
        parts.append(_section(FOOTER, _annotations_map(footer, "footer")))
    return b"".join(parts)


# -- editing ------------------------------------------------------------------------------

_KEEP: Any = object()


def _first_section_is_header(data: Any) -> tuple[int, int] | None:
    code, voff = _section_code(data, 0)
    if code != HEADER:
        return None
    return (0, _skip(data, voff))


def with_header_fields(
    data: Buffer,
    *,
    durable: bool = _KEEP,
    priority: int | None = _KEEP,
    ttl: int | None = _KEEP,
    first_acquirer: bool = _KEEP,
    delivery_count: int = _KEEP,
    sections: Sections | None = None,
) -> bytes:
    """Return ``data`` with the given header fields changed and every other byte unchanged.

    Fields not passed keep their encoded bytes. ``priority=None`` or ``ttl=None`` clears
    the field (priority then reads as the default 4). A header is inserted when the
    message has none. ``sections``, when given, must describe ``data``; without it only the
    first section is read.
    """
    if durable is not _KEEP:
        _check_bool("durable", durable)
    if first_acquirer is not _KEEP:
        _check_bool("first_acquirer", first_acquirer)
    if priority is not _KEEP and priority is not None:
        _check_uint("header priority", priority, 0xFF)
    if ttl is not _KEEP and ttl is not None:
        _check_uint("header ttl", ttl)
    if delivery_count is not _KEEP:
        _check_uint("header delivery_count", delivery_count)
    try:
        span = sections.header if sections is not None else _first_section_is_header(data)
        if span is None:
            prefix = b"\x00\x53\x70"
            elements: list[bytes] = []
            start = end = 0
        else:
            start, end = span
            voff = _value_offset(data, span)
            prefix = bytes(data[start:voff])
            p, count, list_end = _compound(data, voff, "list")
            spans = _element_spans(data, p, count, list_end, voff)
            elements = [bytes(data[s:e]) for s, e in spans]
    except RecursionError:
        raise DecodeError("descriptors are nested too deeply", 0, data[0]) from None
    if len(elements) < 5:
        elements.extend([b"\x40"] * (5 - len(elements)))
    if durable is not _KEEP:
        elements[0] = b"\x41" if durable else b"\x42"
    if priority is not _KEEP:
        elements[1] = b"\x40" if priority is None else b"\x50" + _P_B(priority)
    if ttl is not _KEEP:
        elements[2] = b"\x40" if ttl is None else _e_uint(ttl)
    if first_acquirer is not _KEEP:
        elements[3] = b"\x41" if first_acquirer else b"\x42"
    if delivery_count is not _KEEP:
        elements[4] = _e_uint(delivery_count)
    # Trailing nulls carry nothing (a list may be shorter than its type's field count).
    while elements and elements[-1] == b"\x40":
        elements.pop()
    header = prefix + _list_bytes(elements)
    return b"".join((bytes(data[:start]), header, bytes(data[end:])))


def with_delivery_count(data: Buffer, count: int, sections: Sections | None = None) -> bytes:
    """Return ``data`` with its header delivery-count set to ``count``; see with_header_fields."""
    return with_header_fields(data, delivery_count=count, sections=sections)


def with_annotations(
    data: Buffer, extra_message_annotations: dict[Any, Any], sections: Sections | None = None
) -> bytes:
    """Return ``data`` with message-annotations entries added or replaced.

    Keys that are str are sent as symbols and ints as ulong. Existing entries that are not
    replaced keep their bytes, as does every other section; a message-annotations section is
    inserted after the header and delivery-annotations when the message has none.
    """
    new = {_as_symbol_key(k, "message annotation"): v for k, v in extra_message_annotations.items()}
    if sections is None:
        sections = scan_sections(data)
    span = sections.message_annotations
    encoded: list[bytes] = []
    try:
        if span is None:
            before = sections.delivery_annotations or sections.header
            start = end = before[1] if before is not None else 0
            prefix = b"\x00\x53\x72"
        else:
            start, end = span
            voff = _value_offset(data, span)
            prefix = bytes(data[start:voff])
            p, count, map_end = _compound(data, voff, "map")
            if count & 1:
                raise DecodeError(
                    f"message-annotations map has an odd number of elements ({count})",
                    voff,
                    data[voff],
                )
            spans = _element_spans(data, p, count, map_end, voff)
            for i in range(0, count, 2):
                (ks, ke), (vs, ve) = spans[i], spans[i + 1]
                key = _decode(data, ks)[0]
                if _hashable(key) and key in new:
                    continue
                encoded.append(bytes(data[ks:ke]))
                encoded.append(bytes(data[vs:ve]))
    except RecursionError:
        raise DecodeError("values are nested too deeply", 0, data[0]) from None
    for k, v in new.items():
        encoded.append(_enc(k))
        encoded.append(_enc(v))
    section = prefix + _map_bytes(encoded)
    return b"".join((bytes(data[:start]), section, bytes(data[end:])))


# ---------------------------------------------------------------------------------------------
# Selectors
# ---------------------------------------------------------------------------------------------


def _jms_id(v: Any) -> Any:
    # The string forms Qpid JMS gives non-string ids, so a selector written against what a
    # JMS consumer sees as JMSMessageID matches. String ids are used as they are (Qpid JMS
    # would prefix ones lacking "ID:" with "ID:AMQP_NO_PREFIX:"; selectors here do not).
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, uuid.UUID):
        return f"ID:AMQP_UUID:{v}"
    if isinstance(v, int):
        return f"ID:AMQP_ULONG:{v}"
    if isinstance(v, bytes):
        return f"ID:AMQP_BINARY:{v.hex().upper()}"
    return str(v)


_JMS_HEADERS: dict[str, Callable[[MessageInfo], Any]] = {
    "JMSPriority": lambda m: m.priority,
    "JMSDeliveryMode": lambda m: "PERSISTENT" if m.durable else "NON_PERSISTENT",
    "JMSMessageID": lambda m: _jms_id(m.message_id),
    "JMSCorrelationID": lambda m: _jms_id(m.correlation_id),
    "JMSType": lambda m: m.subject,
    "JMSTimestamp": lambda m: m.creation_time,
    "JMSExpiration": lambda m: m.absolute_expiry_time,
}
_HEADER_NAMES = {name: i for i, name in enumerate(HEADER_FIELDS)}
_HEADER_NAMES.update({name.replace("_", "-"): i for i, name in enumerate(HEADER_FIELDS)})


def selector_lookup(info: MessageInfo) -> Callable[[str], object]:
    """Return a function resolving JMS selector identifiers against ``info``; None when missing.

    Resolution, following how ActiveMQ Artemis evaluates selectors on AMQP messages:

    - ``JMSPriority`` header priority; ``JMSDeliveryMode`` ``'PERSISTENT'`` or
      ``'NON_PERSISTENT'`` from durable; ``JMSMessageID`` / ``JMSCorrelationID`` the id as a
      string (str ids as they are, others in Qpid JMS form such as ``ID:AMQP_ULONG:42``);
      ``JMSType`` subject; ``JMSTimestamp`` creation-time; ``JMSExpiration``
      absolute-expiry-time (both ms). ``JMSDestination`` and ``JMSReplyTo`` are not mapped
      and fall through to application-properties like any other name.
    - ``header.<field>`` and ``properties.<field>`` read those sections by AMQP field name,
      with ``-`` or ``_`` (``properties.subject``, ``header.delivery-count``).
    - ``m.<key>`` reads message-annotations (Artemis's prefix for the annotation area).
    - Anything else reads application-properties; a name starting with ``x-opt-`` that is
      not there falls back to message-annotations, where such keys normally live.
    """

    def lookup(name: str) -> object:
        jms = _JMS_HEADERS.get(name)
        if jms is not None:
            return jms(info)
        if name.startswith("header."):
            i = _HEADER_NAMES.get(name[7:])
            return info.header[i] if i is not None else None
        if name.startswith("properties."):
            i = _PROPERTY_INDEX.get(name[11:])
            return info._props()[i] if i is not None else None
        if name.startswith("m."):
            return info.message_annotations.get(name[2:])
        value = info.application_properties.get(name)
        if value is None and name.startswith("x-opt-"):
            value = info.message_annotations.get(name)
        return value

    return lookup
