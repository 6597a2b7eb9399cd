"""Page summaries: which property values a page's messages hold, so selectors skip pages.

Per property name, the `value_key`s (`scow.core.selector`) of the values the page's
messages give it: an exact set while the page is written, a Bloom filter once it is
closed. A name is "any" when one of its values has no key or it has more than
`MAX_VALUES` of them; a summary that could not read some message's properties, or saw
more than `MAX_NAMES` names, proves nothing. A selector that can only be TRUE when a
property holds one of a few values (`Selector.requires`) cannot match any message of a
page whose summary lacks them all, or lacks the name: a missing property makes `=`
and `IN` UNKNOWN, never TRUE.

A closed page's summary is stored as the page's last record (see `record.SUMMARY`);
recovery reads it back, and rebuilds the summary of a page without one (the page being
written when the broker stopped).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Final

from scow.core.selector import Requirements, is_property_name, value_key

#: Distinct values of one name a page summarizes before the name counts as "any".
MAX_VALUES: Final = 4096
#: Names a page summarizes before the summary proves nothing.
MAX_NAMES: Final = 256
#: Bloom filter bits per value (about 1 % false positives with `_PROBES`).
_BITS_PER_VALUE: Final = 10
_PROBES: Final = 7
_VERSION: Final = 1
_ANY: Final = 0
_BLOOM: Final = 1
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _positions(key: bytes, bits: int) -> list[int]:
    digest = hashlib.blake2b(key, digest_size=16).digest()
    h1 = int.from_bytes(digest[:8], "big")
    h2 = int.from_bytes(digest[8:], "big") | 1
    return [(h1 + i * h2) % bits for i in range(_PROBES)]


class Bloom:
    """A Bloom filter of value keys, sized for the values it was built from."""

    __slots__ = ("bits", "data")

    def __init__(self, data: bytearray) -> None:
        self.data = data
        self.bits = len(data) * 8

    @classmethod
    def of(cls, keys: set[bytes]) -> Bloom:
        size = max(8, (len(keys) * _BITS_PER_VALUE + 7) // 8)
        bloom = cls(bytearray(size))
        for key in keys:
            for bit in _positions(key, bloom.bits):
                bloom.data[bit >> 3] |= 1 << (bit & 7)
        return bloom

    def __contains__(self, key: bytes) -> bool:
        data = self.data
        return all(data[bit >> 3] & (1 << (bit & 7)) for bit in _positions(key, self.bits))


class PageSummary:
    """The property values of one page's messages (see the module docstring)."""

    __slots__ = ("_last", "complete", "names")

    def __init__(self) -> None:
        #: The properties last added: a format may hand the same mapping again for
        #: messages whose properties are the same (see `MessageFormat.properties`).
        self._last: object = None
        #: name -> its value keys (a set while written, a Bloom once closed); None: any.
        self.names: dict[str, set[bytes] | Bloom | None] = {}
        #: False once the summary cannot vouch for the page (it proves nothing).
        self.complete = True

    def add(self, properties: Mapping[str, object]) -> None:
        """Note one message's properties (while the page is written)."""
        if not self.complete or properties is self._last:
            return
        self._last = properties
        names = self.names
        for name, value in properties.items():
            if not isinstance(name, str):
                continue  # no selector identifier names it
            key = value_key(value)
            if name not in names:
                if len(names) >= MAX_NAMES:
                    self.unknown()
                    return
                names[name] = None if key is None else {key}
                continue
            keys = names[name]
            if not isinstance(keys, set):
                continue  # any value already
            if key is None or len(keys) >= MAX_VALUES:
                names[name] = None
            else:
                keys.add(key)

    def unknown(self) -> None:
        """A message whose properties could not be read: the page proves nothing."""
        self.complete = False
        self.names.clear()

    def may_match(self, requires: Requirements) -> bool:
        """False when no message of the page can satisfy `requires` (a selector's)."""
        if not self.complete:
            return True
        names = self.names
        for name, wanted in requires.items():
            if not is_property_name(name):
                continue  # a header or a property of another section: not summarized
            if name not in names:
                return False  # no message has it: `=` and `IN` are UNKNOWN
            keys = names[name]
            if keys is not None and not any(key in keys for key in wanted):
                return False
        return True

    def close(self) -> None:
        """The page is closed: its exact value sets become Bloom filters."""
        for name, keys in self.names.items():
            if isinstance(keys, set):
                self.names[name] = Bloom.of(keys)

    def encode(self) -> bytes:
        """The closed summary as bytes (`decode` reads them back)."""
        self.close()
        parts = [bytes((_VERSION, 1 if self.complete else 0)), _U16.pack(len(self.names))]
        for name, keys in self.names.items():
            encoded = name.encode("utf-8", "surrogatepass")
            parts += [_U16.pack(len(encoded)), encoded]
            if isinstance(keys, Bloom):
                parts += [bytes((_BLOOM,)), _U32.pack(len(keys.data)), bytes(keys.data)]
            else:
                parts.append(bytes((_ANY,)))
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> PageSummary | None:
        """A summary from `encode`'s bytes; None when they are not one this reads."""
        summary = cls()
        try:
            if data[0] != _VERSION:
                return None
            summary.complete = bool(data[1])
            (count,) = _U16.unpack_from(data, 2)
            at = 4
            for _ in range(count):
                (length,) = _U16.unpack_from(data, at)
                name = bytes(data[at + 2 : at + 2 + length]).decode("utf-8", "surrogatepass")
                at += 2 + length
                kind = data[at]
                at += 1
                if kind == _BLOOM:
                    (size,) = _U32.unpack_from(data, at)
                    bits = bytearray(data[at + 4 : at + 4 + size])
                    if len(bits) != size or not size:
                        return None
                    summary.names[name] = Bloom(bits)
                    at += 4 + size
                elif kind == _ANY:
                    summary.names[name] = None
                else:
                    return None
        except (IndexError, struct.error, UnicodeDecodeError):
            return None
        return summary
