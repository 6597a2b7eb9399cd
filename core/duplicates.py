"""Duplicate detection: the ids of the messages each address admitted last (Artemis's
duplicate-id caches).

A producer that does not know whether a send arrived (its connection dropped before the
outcome) resends it with the same `_AMQ_DUPL_ID` application property, and the broker
keeps it once: a resend whose id is in its address's cache is accepted and dropped, or,
inside a transaction, fails the commit. Each cache keeps the last `id-cache-size` ids;
admitting one more forgets the oldest.

Ids are keys of bytes here: a tag byte (string or binary, so "a" and b"a" differ) and the
id's bytes. `Broker` owns the caches (by address name: they outlive an address that is
auto-deleted and created again) and journals them through `StorageManager`.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from scow.core.interfaces import Completion
from scow.core.model import BrokerError, InvalidField

#: The application property a producer sets to have a message kept once (Artemis's
#: `Message.HDR_DUPLICATE_DETECTION_ID`).
DUPLICATE_ID_PROPERTY = "_AMQ_DUPL_ID"
#: `id-cache-size` when neither [broker] nor the address settings say.
DEFAULT_ID_CACHE_SIZE = 20_000

_STRING = 0x01
_BINARY = 0x02
_STRING_TAG = bytes((_STRING,))
_BINARY_TAG = bytes((_BINARY,))
_SHOWN = 64  # bytes of an id an error message shows


class DuplicateMessage(BrokerError):
    """A transaction sends a message whose id its address has already admitted."""

    condition = "amqp:transaction:rollback"


def id_key(value: object, address: str) -> bytes:
    """The cache key of a `_AMQ_DUPL_ID` value; InvalidField when it is not a string or
    binary."""
    if value.__class__ is bytes:  # the usual binary id, at the cost of one concatenation
        return _BINARY_TAG + value
    if isinstance(value, str):
        return _STRING_TAG + value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _BINARY_TAG + bytes(value)
    raise InvalidField(
        f"address '{address}': application property {DUPLICATE_ID_PROPERTY} = {value!r} "
        f"({type(value).__name__}): expected a string or binary"
    )


def describe_id(key: bytes) -> str:
    """A key as an error message or a log line shows it: 'text' or binary 0a1b..."""
    body = key[1:]
    if key[:1] == _STRING_TAG:
        text = body.decode("utf-8", "replace")
        return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")
    shown = body[:_SHOWN].hex() + ("..." if len(body) > _SHOWN else "")
    return f"binary {shown or '(empty)'}"


def duplicate_error(key: bytes, address: str) -> DuplicateMessage:
    return DuplicateMessage(
        f"duplicate message: {DUPLICATE_ID_PROPERTY} {describe_id(key)} was already sent "
        f"to address '{address}'"
    )


class DuplicateIdCache:
    """The last `size` ids one address admitted, oldest first, with their records."""

    __slots__ = ("ids", "pending", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        #: id key -> the record id of its journal record (0: not journaled), oldest first.
        self.ids: OrderedDict[bytes, int] = OrderedDict()
        #: Ids whose admitting commit is not durable yet -> outcomes of resends waiting
        #: for it (a resend is confirmed only once what it duplicates is safe).
        self.pending: dict[bytes, list[Completion]] = {}

    def __contains__(self, key: bytes) -> bool:
        return key in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def kept(self, keys: list[bytes]) -> list[bytes]:
        """Of ids about to be admitted together (oldest first), those the cache keeps."""
        return keys[max(len(keys) - self.size, 0) :] if self.size > 0 else []

    def pushed_out(self, adding: int) -> list[int]:
        """The records of the entries that `adding` more ids would push out (journaled
        ones), oldest first, without changing anything."""
        over = len(self.ids) + adding - self.size
        if over <= 0:
            return []
        if over == 1:  # a full cache admitting one more: the usual case
            rid = next(iter(self.ids.values()))
            return [rid] if rid else []
        return [rid for rid in itertools.islice(self.ids.values(), over) if rid]

    def add(self, key: bytes, record_id: int) -> list[int]:
        """Admit `key` (newest); returns the records of the entries it pushed out, and of
        an older entry of the same key."""
        ids = self.ids
        dropped = []
        if key in ids:
            old = ids.pop(key)
            if old:
                dropped.append(old)
        ids[key] = record_id
        while len(ids) > self.size:
            rid = ids.popitem(last=False)[1]
            if rid:
                dropped.append(rid)
        return dropped

    def clear(self) -> list[int]:
        """Forget every id; returns their records."""
        records = [rid for rid in self.ids.values() if rid]
        self.ids.clear()
        return records
