"""Duplicate detection: the ids of the messages each address admitted last (Artemis's
duplicate-id caches).

A producer that does not know whether a send arrived (its connection dropped before the
outcome) resends it with the same `_AMQ_DUPL_ID` application property, and the broker
keeps it once: a resend whose id is in its address's cache is accepted and dropped, or,
inside a transaction, fails the commit. Each cache keeps the last `id-cache-size` ids;
admitting one more forgets the oldest.

Ids are keys of bytes here: the id's AMQP encoding in its shortest form (`str8`/`vbin8`
up to 255 bytes, `str32`/`vbin32` beyond), so "a" and b"a" differ and the AMQP format
reads the usual id of a message as one slice of its bytes, building nothing. Data dirs
written before held keys of a tag byte (1: string, 2: binary) and the id's bytes:
`current_key` converts those as they are recovered. `Broker` owns the caches (by address
name: they outlive an address that is auto-deleted and created again) and journals them
through `StorageManager`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator

from scow.core.interfaces import Completion
from scow.core.model import BrokerError, InvalidField

#: The application property a producer sets to have a message kept once (Artemis's
#: `Message.HDR_DUPLICATE_DETECTION_ID`).
DUPLICATE_ID_PROPERTY = "_AMQ_DUPL_ID"
#: `id-cache-size` when neither [broker] nor the address settings say.
DEFAULT_ID_CACHE_SIZE = 20_000

# AMQP type codes of a key's first byte
_STR8, _STR32, _VBIN8, _VBIN32 = 0xA1, 0xB1, 0xA0, 0xB0
# the tag bytes of keys written before keys were encodings
_OLD_STRING = 0x01
_OLD_TAGS = (b"\x01", b"\x02")
_SHOWN = 64  # bytes of an id an error message shows


class DuplicateMessage(BrokerError):
    """A transaction sends a message whose id its address has already admitted."""

    condition = "amqp:transaction:rollback"


def _encoded(data: bytes, string: bool) -> bytes:
    """The key of an id whose bytes are `data` (its UTF-8 when `string`)."""
    size = len(data)
    if size <= 0xFF:
        return bytes((_STR8 if string else _VBIN8, size)) + data
    return bytes((_STR32 if string else _VBIN32,)) + size.to_bytes(4, "big") + data


def key_of(value: object) -> bytes | None:
    """The cache key of a `_AMQ_DUPL_ID` value; None when it is not a string or binary."""
    if isinstance(value, str):
        return _encoded(value.encode("utf-8", "surrogatepass"), True)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _encoded(bytes(value), False)
    return None


def id_key(value: object, address: str) -> bytes:
    """The cache key of a `_AMQ_DUPL_ID` value; InvalidField when it is not a string or
    binary."""
    key = key_of(value)
    if key is None:
        raise InvalidField(
            f"address '{address}': application property {DUPLICATE_ID_PROPERTY} = {value!r} "
            f"({type(value).__name__}): expected a string or binary"
        )
    return key


def current_key(key: bytes) -> bytes:
    """`key` as this version keys ids: one of an earlier data dir (a tag byte and the id)
    is converted, any other returned as it is."""
    if key[:1] in _OLD_TAGS:
        return _encoded(key[1:], key[0] == _OLD_STRING)
    return key


def split_keys(data: bytes, start: int = 0) -> list[bytes]:
    """The keys written back to back in `data` from `start` (each gives its own length);
    ValueError when one is not a key."""
    keys = []
    end = len(data)
    while start < end:
        code = data[start]
        if start + 1 == end:
            stop = end + 1  # not even a length
        elif code in (_VBIN8, _STR8):
            stop = start + 2 + data[start + 1]
        elif code in (_VBIN32, _STR32):
            stop = start + 5 + int.from_bytes(data[start + 1 : start + 5], "big")
        else:
            raise ValueError(
                f"duplicate-id keys: type code 0x{code:02x} at byte {start}; expected "
                f"str8, str32, vbin8 or vbin32 (0xa1, 0xb1, 0xa0, 0xb0)"
            )
        if stop > end:
            raise ValueError(f"duplicate-id keys: the key at byte {start} runs past the end")
        keys.append(data[start:stop])
        start = stop
    return keys


def describe_id(key: bytes) -> str:
    """A key as an error message or a log line shows it: 'text' or binary 0a1b..."""
    key = current_key(key)
    body = key[2:] if key[0] in (_STR8, _VBIN8) else key[5:]
    if key[0] in (_STR8, _STR32):
        text = body.decode("utf-8", "replace")
        return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")
    shown = body[:_SHOWN].hex() + ("..." if len(body) > _SHOWN else "")
    return f"binary {shown or '(empty)'}"


def duplicate_error(key: bytes, address: str) -> DuplicateMessage:
    return DuplicateMessage(
        f"duplicate message: {DUPLICATE_ID_PROPERTY} {describe_id(key)} was already sent "
        f"to address '{address}'"
    )


class IdBlock:
    """Ids of one address's cache journaled as one record: the ids admitted on their own
    in one loop pass, or those one transaction admits. Its record goes once every id of
    it has been pushed out of the cache."""

    __slots__ = ("keys", "live", "record_id")

    def __init__(self, record_id: int, keys: list[bytes] | None) -> None:
        #: Its journal record (0: not journaled, or not yet).
        self.record_id = record_id
        #: Its ids still in the cache.
        self.live = 0
        #: The ids admitted into it, while it is open (None once closed, or when the
        #: cache is not journaled).
        self.keys = keys


class DuplicateIdCache:
    """The last `size` ids one address admitted, oldest first, in blocks of a record each.

    Ids admitted on their own (their message is not journaled) go into the open block,
    which `close` hands over to be written as one record, with the records of the blocks
    pushed out meanwhile to delete; ids admitted by a transaction come as a block of their
    own (`add_block`), as do the records recovery finds, oldest first.

    Per id admitted, a plain dict (key -> block) and a ring of keys in admission order,
    not an OrderedDict, whose insert and pop of the oldest cost 1.5x as much (200 against
    135 ns per id at 20,000 ids, CPU, best of 7).
    An id admitted again by `add_block` (recovery, an import) moves to the newest; its
    older place stays in the ring, counted in `moved`, and is skipped when it comes out.
    """

    __slots__ = ("dead", "ids", "journaled", "moved", "open", "pending", "ring", "size")

    def __init__(self, size: int, *, journaled: bool = True) -> None:
        self.size = size
        #: Whether the cache's blocks are journaled (persist-id-cache on a journal).
        self.journaled = journaled
        #: id key -> its block, oldest first.
        self.ids: dict[bytes, IdBlock] = {}
        #: The ids' keys, oldest first, with the older places of ids that moved.
        self.ring: deque[bytes] = deque()
        #: id key -> how many older places of it the ring holds (ids that moved).
        self.moved: dict[bytes, int] = {}
        #: The block that ids admitted on their own go into; a cache that is not
        #: journaled keeps one for good. Its `live` counts only the ids pushed out of it
        #: (negatively) until `close` adds those admitted: one count less per id.
        self.open: IdBlock | None = None if journaled else IdBlock(0, None)
        #: Records of blocks whose every id was pushed out, to delete at the next `close`.
        self.dead: list[int] = []
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

    def admit(self, key: bytes) -> bool:
        """Admit `key` (newest, not in the cache) into the open block; True when this
        opened the block, so that a `close` is due."""
        block = self.open
        opened = block is None
        if block is None:
            block = self.open = IdBlock(0, [])
        keys = block.keys
        if keys is not None:
            keys.append(key)
        ids = self.ids
        ids[key] = block
        self.ring.append(key)
        if len(ids) > self.size:  # full: the oldest goes (`_push_out`, inlined: per id)
            if self.moved:
                self._push_out()
            else:
                oldest = ids.pop(self.ring.popleft())
                oldest.live -= 1
                if not oldest.live and oldest.record_id:
                    self.dead.append(oldest.record_id)
                if len(ids) > self.size:  # the size was lowered
                    self._push_out()
        return opened

    def close(self) -> tuple[IdBlock | None, list[bytes], list[int]]:
        """End the open block: (it, its ids still in the cache, oldest first), to be
        written as one record (then set its `record_id`), and the records to delete."""
        block, self.open = self.open, None
        dead, self.dead = self.dead, []
        if block is None or block.keys is None:
            self.open = block  # a cache that is not journaled keeps its block
            return None, [], dead
        keys, block.keys = block.keys, None
        block.live += len(keys)
        if block.live < len(keys):  # some were pushed out already
            ids = self.ids
            keys = [key for key in keys if ids.get(key) is block]
        return block, keys, dead

    def emptied_by(self, adding: int) -> list[int]:
        """The records of the blocks that `adding` more ids would push out whole, oldest
        first, without changing anything (`close` first: this ignores `dead`)."""
        over = len(self.ids) + adding - self.size
        if over <= 0:
            return []
        leaving: dict[IdBlock, int] = {}
        for block in itertools.islice(self._oldest(), over):
            leaving[block] = leaving.get(block, 0) + 1
        return [b.record_id for b, n in leaving.items() if n == b.live and b.record_id]

    def add_block(self, keys: list[bytes], record_id: int) -> list[int]:
        """Admit ids journaled together as record `record_id` (0: none), oldest first; an
        id already in the cache moves to the newest. Returns the records of the blocks
        this pushed out whole (`close` first: they are taken from `dead`)."""
        block = IdBlock(record_id, None)
        block.live = len(keys)  # first: a key twice in `keys` leaves the block once
        ids, ring, moved = self.ids, self.ring, self.moved
        for key in keys:
            old = ids.pop(key, None)
            if old is not None:
                self._leave(old)
                moved[key] = moved.get(key, 0) + 1
            ids[key] = block
            ring.append(key)
        self._push_out()
        dead, self.dead = self.dead, []
        return dead

    def clear(self) -> list[int]:
        """Forget every id; returns the records of their blocks, and those to delete."""
        records = {block.record_id for block in self.ids.values() if block.record_id}
        records.update(self.dead)
        self.ids.clear()
        self.ring.clear()
        self.moved.clear()
        self.dead = []
        if self.journaled:
            self.open = None
        return sorted(records)

    def _oldest(self) -> Iterator[IdBlock]:
        """The blocks of the ids in the cache, oldest id first (one per id)."""
        ids, skip = self.ids, dict(self.moved)
        for key in self.ring:
            if skip.get(key):
                skip[key] -= 1
            else:
                yield ids[key]

    def _push_out(self) -> None:
        ids, ring, moved = self.ids, self.ring, self.moved
        while len(ids) > self.size:
            key = ring.popleft()
            if moved and key in moved:  # an older place of an id that moved
                if moved[key] == 1:
                    del moved[key]
                else:
                    moved[key] -= 1
                continue
            self._leave(ids.pop(key))

    def _leave(self, block: IdBlock) -> None:
        """One id of `block` left the cache."""
        block.live -= 1
        if not block.live and block.record_id:
            self.dead.append(block.record_id)
