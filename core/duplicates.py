"""Duplicate detection: the ids of the messages each address admitted last (Artemis's
duplicate-id caches).

A producer that does not know whether a send arrived (its connection dropped before the
outcome) resends it with the same `_AMQ_DUPL_ID` application property, and the broker
keeps it once: a resend whose id is in its address's cache is accepted and dropped, or,
inside a transaction, fails the commit. Each cache keeps at least the last
`id-cache-size` ids, and at most twice as many (`DuplicateIdCache`: two generations).

Ids are keys of bytes here: the id's AMQP encoding in its shortest form (`str8`/`vbin8`
up to 255 bytes, `str32`/`vbin32` beyond), so "a" and b"a" differ and the AMQP format
reads the usual id of a message as one slice of its bytes, building nothing. Data dirs
written before held keys of a tag byte (1: string, 2: binary) and the id's bytes:
`current_key` converts those as they are recovered. `Broker` owns the caches (by address
name: they outlive an address that is auto-deleted and created again) and journals them
through `StorageManager`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from scow.core.interfaces import Completion
from scow.core.model import BrokerError, InvalidField
from scow.core.speedups import PURE_PYTHON

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
    in one loop pass, or those one transaction admits. All its ids are in one generation
    of the cache; its record goes when that generation is dropped."""

    __slots__ = ("keys", "record_id")

    def __init__(self, keys: bytes | None, record_id: int = 0) -> None:
        #: Its journal record (0: not journaled, or not yet).
        self.record_id = record_id
        #: Its ids' keys back to back, until its record is written (None once written,
        #: or once its generation was dropped before).
        self.keys = keys


class PyIdGenerations:
    """A cache's two generations of ids, its open block and its size: the part of
    `DuplicateIdCache` every message with an id uses, as `_speedups.IdGenerations`
    (core/_speedups.c) builds it in C; this is the build that runs without it. Its
    generations are dicts (the C build's are tables of its own, read alike: `in`, `len`,
    iteration in the order the ids came, `pop`), changed through the methods here only.
    """

    __slots__ = ("journaled", "old", "open", "size", "young")

    def __init__(self, size: int, *, journaled: bool = True) -> None:
        self.size = size
        #: Whether the cache's blocks are journaled (persist-id-cache on a journal).
        self.journaled = journaled
        #: The ids admitted since the young generation began (at most `size`), as the
        #: keys of a dict: a miss reads less memory than in a set (whose table is twice
        #: the size), and every new id is a miss.
        self.young: dict[bytes, None] = {}
        #: The generation before it (no id of it is in `young`).
        self.old: dict[bytes, None] = {}
        #: The keys of the ids admitted on their own since the last `close`, back to
        #: back as their record holds them (None: none yet, or the cache is not
        #: journaled). Not a list of the keys: a key is then let go with its message.
        self.open: bytearray | None = None

    def __contains__(self, key: bytes) -> bool:
        return key in self.young or key in self.old

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    def admit(self, key: bytes) -> bool:
        """Admit `key` (newest, not in the cache) into the open block; True when this
        opened the block, so that a `close` is due."""
        if len(self.young) < self.size:  # the usual case
            keys = self.open
            if keys is not None:
                self.young[key] = None
                keys += key
                return False
            if not self.journaled:
                self.young[key] = None
                return False
        return self._admit(key)

    def admit_new(self, key: bytes) -> bool | None:
        """None when the cache holds `key` (a duplicate); otherwise admit it, as
        `admit`: a send accepted at once admits its id as it checks it."""
        if key in self.young or key in self.old:
            return None
        return self.admit(key)

    def withdraw(self, key: bytes) -> None:
        """Undo the admission of `key` just made: its send was refused."""
        self.young.pop(key, None)
        keys = self.open
        if keys:
            held = split_keys(bytes(keys))
            if key in held:  # (an open block's ids are distinct)
                held.remove(key)
                keys[:] = b"".join(held)

    def _admit(self, key: bytes) -> bool:
        """`admit` when the young generation is full or no block is open."""
        raise NotImplementedError

    # The generations change through these only (the C build's are its own tables).

    def _add(self, key: bytes) -> None:
        """Put `key` in the young generation."""
        self.young[key] = None

    def _age_generations(self) -> None:
        """The young generation becomes the old one, whose ids are dropped."""
        self.old, self.young = self.young, {}

    def _clear_generations(self) -> None:
        """Forget every id."""
        self.young.clear()
        self.old.clear()


if TYPE_CHECKING or PURE_PYTHON:
    IdGenerations = PyIdGenerations
else:
    try:  # the C build (core/_speedups.c); optional, as a compiler is
        from scow.core._speedups import IdGenerations
    except ImportError:
        IdGenerations = PyIdGenerations


class DuplicateIdCache(IdGenerations):
    """The ids one address admitted last: at least its last `size`, in two generations.

    Ids go into the young generation; when it holds `size` ids, the next id first makes
    it the old one and drops the old one whole. An id at most `size` admissions old is
    therefore always found (Artemis's guarantee), and the cache holds up to 2 x `size`.
    Why not exactly the last `size`, as Artemis: pushing out the oldest id at each
    admission (an entry `size` admissions old: a cache miss) and counting down its
    block's ids still cached was about half of the admission's cost (benchmarks/
    RESULTS.md, dup5); a generation dropped whole frees its ids in one C loop, and a
    block's record goes with its generation, so no block counts its ids.

    Ids admitted on their own (their message is not journaled) go into the open block,
    which `close` hands over to be written as one record, with the records of the
    generation dropped meanwhile to delete; ids admitted together (a transaction, the
    records recovery finds, oldest first) come as a block of their own (`add_block`),
    which ages the young generation first if they would not fit in it. So a generation
    never holds more than `size` ids and each block's ids are in one generation: the
    blocks of a generation are deleted with it, and replaying the records in order
    rebuilds the same generations.
    """

    __slots__ = ("dead", "old_blocks", "pending", "unwritten", "young_blocks")

    def __init__(self, size: int, *, journaled: bool = True) -> None:
        super().__init__(size, journaled=journaled)
        #: The blocks of each generation, oldest first.
        self.young_blocks: list[IdBlock] = []
        self.old_blocks: list[IdBlock] = []
        #: Blocks cut from the open one when its generation aged, to write at `close`.
        self.unwritten: list[IdBlock] = []
        #: Records of dropped generations, to delete at the next `close`.
        self.dead: list[int] = []
        #: Ids whose admitting commit is not durable yet -> outcomes of resends waiting
        #: for it (a resend is confirmed only once what it duplicates is safe).
        self.pending: dict[bytes, list[Completion]] = {}

    def holds_any(self, keys: Iterable[bytes]) -> bool:
        """Whether any of `keys` is in the cache."""
        return any(key in self for key in keys)

    def kept(self, keys: list[bytes]) -> list[bytes]:
        """Of ids about to be admitted together (oldest first), those the cache keeps."""
        return keys[max(len(keys) - self.size, 0) :] if self.size > 0 else []

    def _admit(self, key: bytes) -> bool:
        if len(self.young) >= self.size:  # full: as `add_block` of one id
            self._age()
        self._add(key)
        keys = self.open
        if keys is not None:
            keys += key
            return False
        if self.journaled:
            self.open = bytearray(key)
            return True
        return False

    def close(self) -> tuple[list[tuple[IdBlock, bytes]], list[int]]:
        """End the open block: (the blocks to write, oldest first, with their ids' keys
        back to back: each one record, then set its `record_id`; the records to
        delete)."""
        blocks = [(block, block.keys) for block in self.unwritten if block.keys is not None]
        self.unwritten = []
        if self.open:
            keys = bytes(self.open)
            block = IdBlock(keys)
            self.young_blocks.append(block)
            blocks.append((block, keys))
        self.open = None
        dead, self.dead = self.dead, []
        return blocks, dead

    def emptied_by(self, keys: list[bytes]) -> list[int]:
        """The records that admitting `keys` together (`kept`) would drop, without
        changing anything (`close` first: this ignores `dead`)."""
        if not self._ages_for(keys):
            return []
        return [block.record_id for block in self.old_blocks if block.record_id]

    def add_block(self, keys: list[bytes], record_id: int) -> list[int]:
        """Admit ids journaled together as record `record_id` (0: none), oldest first,
        keeping the newest `size`; an id already in the cache moves to the young
        generation. Returns the records this dropped (`close` first: they are taken
        from `dead`)."""
        keys = self.kept(keys)
        if keys:
            if self._ages_for(keys):
                self._age()
            old = self.old
            for key in keys:
                old.pop(key, None)
                self._add(key)
            if record_id:
                self.young_blocks.append(IdBlock(None, record_id))
        dead, self.dead = self.dead, []
        return dead

    def clear(self) -> list[int]:
        """Forget every id; returns the records of their blocks, and those to delete."""
        records = {block.record_id for block in self.young_blocks if block.record_id}
        records.update(block.record_id for block in self.old_blocks if block.record_id)
        records.update(self.dead)
        self._clear_generations()
        self.young_blocks, self.old_blocks, self.unwritten, self.dead = [], [], [], []
        self.open = None
        return sorted(records)

    def _ages_for(self, keys: list[bytes]) -> bool:
        """Whether `keys` (at most `size`) admitted together would not fit in the young
        generation, so that it ages first."""
        young = self.young
        return len(young) + sum(1 for key in set(keys) if key not in young) > self.size

    def _age(self) -> None:
        """The young generation becomes the old one; the old one is dropped whole."""
        if self.open:  # its ids are in the generation that ages: a block of their own
            block = IdBlock(bytes(self.open))
            self.young_blocks.append(block)
            self.unwritten.append(block)
            self.open = bytearray()  # still open (its `close` is due), for the new generation
        for block in self.old_blocks:
            block.keys = None  # not written, if it was not yet
            if block.record_id:
                self.dead.append(block.record_id)
        self._age_generations()
        self.old_blocks, self.young_blocks = self.young_blocks, []
