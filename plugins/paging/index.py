"""A closed page's index: its message records' fields as columns, read without a walk.

The page writer notes the head of each record it appends to a page (`PageIndex.note`,
once per batch: two C-level passes, nothing per record in Python) and, when the pager
closes the page, writes the index as a record of its own just before the summary (flag
`record.INDEX`, routed to no queue, so every reader of messages passes over it as it
passes over the summary), sealed with the CRC-32 of every byte of the page before it
(`seal`), which only the writer knows: it appended them. Its columns are cut out of the
noted heads with strided slice copies, so the close of a page whose records all go
to one queue and none in a transaction costs no Python per record either (the others
look up each record's route and transaction). A reader that finds the index checks its
frame's CRC and that region CRC, two calls over the whole page, and gets every record's
fields with one conversion per column (`read`) instead of walking the frames in Python.

    version       u8    1
    count         u32   message records in the page, all of them before the index
    region end    u32   page offset of the index's own frame (where the records end)
    region CRC    u32   CRC-32 of the page's bytes before it
    routes        u16   distinct sets of queues the records are routed to
    transactions  u32   records sent in a transaction
    columns, big-endian, `count` entries each, in page order:
      offset u32 (the record's frame), message id u64, expiration u64,
      flags << 8 | priority u16, route u16 (an index into the route table)
    route table: per route, its queue count u16 and queue ids u64 each
    transactions: record index u32 each, then transaction id u64 each

Anything in doubt (no index: a page written before indexes, the page open at a crash,
a store that cannot tell what it appended; an index whose CRC fails; records whose CRC
fails) reads as no index, and the reader walks the frames as before, which finds the
exact frame where a corrupt page ends.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate
from operator import itemgetter
from typing import Final

from scow.core.page_frames import HEADER_SIZE, crc32
from scow.plugins.paging.record import HEAD, INDEX

_VERSION: Final = 1
#: version, count, region end, region CRC, routes, transactions
_FIXED = struct.Struct(">BIIIHI")
#: What the writer keeps of each record while its page is written: its head and first
#: queue id, as `record.encode` lays them out (id, expiration, tx id, flags, priority,
#: queue count, first queue id).
_ROW: Final = HEAD.size + 8
_HEAD_OF = itemgetter(slice(0, _ROW))
#: (offset in a row, bytes) of the fields the columns take.
_ID, _EXPIRATION, _TX, _KEY, _COUNT, _FIRST = (0, 8), (8, 8), (16, 8), (24, 2), (26, 2), (28, 8)
_ONE_QUEUE = b"\x00\x01"
#: The largest page offset a u32 column holds: a larger page is not indexed.
_MAX_OFFSET: Final = 0xFFFF_FFFF
_MAX_ROUTES: Final = 0xFFFF
_LITTLE_ENDIAN = sys.byteorder == "little"

for _code, _size in (("I", 4), ("Q", 8), ("H", 2)):
    if array(_code).itemsize != _size:  # pragma: no cover - every platform we build on
        raise ImportError(f"array type {_code!r} is not {_size} bytes here; page indexes need it")


def _column(code: str, values: Sequence[int]) -> bytes:
    """`values` as a big-endian column."""
    column = array(code, values)
    if _LITTLE_ENDIAN:
        column.byteswap()
    return column.tobytes()


def _ints(code: str, data: bytes | memoryview) -> list[int]:
    """A big-endian column's values."""
    column = array(code)
    column.frombytes(data)
    if _LITTLE_ENDIAN:
        column.byteswap()
    return column.tolist()


def _field(rows: bytes, count: int, field: tuple[int, int]) -> bytes:
    """One field of every row as a column of its bytes (big-endian, as in the record):
    one strided copy per byte of the field."""
    at, size = field
    column = bytearray(size * count)
    for k in range(size):
        column[k::size] = rows[at + k :: _ROW]
    return bytes(column)


class PageIndex:
    """The index of a page being written: noted by the page writer as it appends the
    page's records, sealed by it when the page closes."""

    __slots__ = ("heads", "lengths", "routes", "size", "spoiled")

    def __init__(self) -> None:
        #: Each record's head and first queue id (`_ROW` bytes), in page order.
        self.heads = bytearray()
        #: Each record's length (its frame's payload).
        self.lengths = array("Q")
        #: record number -> its queue ids, for records routed to more than one queue
        #: (the pager notes them: the head holds the first only).
        self.routes: dict[int, bytes] = {}
        #: Bytes of the sealed index record (0: none was).
        self.size = 0
        #: An append of the page's records was refused (not noted): the pager's count of
        #: them, which `routes` is keyed by, no longer matches the notes, so no index.
        self.spoiled = False

    def note(self, records: Sequence[bytes]) -> None:
        """`records` were appended to the page, after those noted before (writer thread)."""
        self.heads += b"".join(map(_HEAD_OF, records))
        self.lengths.extend(map(len, records))

    def seal(self, size: int, crc: int) -> bytes | None:
        """The index record of the page whose first `size` bytes (CRC `crc`) the store
        appended, or None when they are not the records noted (a write the store refused,
        a page it did not write from its start, an append of it that was refused), or the
        page cannot be indexed (too large for the offsets, too many routes). Frees what
        was noted."""
        heads, lengths, multi = bytes(self.heads), self.lengths, self.routes
        self.heads, self.lengths, self.routes = bytearray(), array("Q"), {}
        if self.spoiled:
            return None
        count = len(lengths)
        offsets = list(accumulate(map(HEADER_SIZE.__add__, lengths), initial=0))
        if not count or offsets.pop() != size or size > _MAX_OFFSET:
            return None
        counts, firsts = _field(heads, count, _COUNT), _field(heads, count, _FIRST)
        if not multi and counts == _ONE_QUEUE * count and firsts == firsts[:8] * count:
            table: dict[bytes, int] = {firsts[:8]: 0}  # the common page: one queue
            routes = bytes(2 * count)
        else:
            table = {}
            routes = _column(
                "H",
                [
                    table.setdefault(multi.get(i) or firsts[8 * i : 8 * i + 8], len(table))
                    for i in range(count)
                ],
            )
            if len(table) > _MAX_ROUTES:
                return None
        txs = _field(heads, count, _TX)
        tx_at = [i for i, tx in enumerate(_ints("Q", txs)) if tx] if any(txs) else []
        parts = [
            HEAD.pack(0, 0, 0, INDEX, 0, 0),
            _FIXED.pack(_VERSION, count, size, crc, len(table), len(tx_at)),
            _column("I", offsets),
            _field(heads, count, _ID),
            _field(heads, count, _EXPIRATION),
            _field(heads, count, _KEY),
            routes,
        ]
        for queue_ids in table:
            parts += [struct.pack(">H", len(queue_ids) // 8), queue_ids]
        parts += [_column("I", tx_at), b"".join(txs[8 * i : 8 * i + 8] for i in tx_at)]
        sealed = b"".join(parts)
        self.size = len(sealed)
        return sealed


class Columns:
    """A page's records as its index gives them (see the module docstring)."""

    __slots__ = ("end", "expirations", "ids", "keys", "offsets", "route_ids", "routes", "txs")

    def __init__(self) -> None:
        #: Page offset of the index's frame: the records end there.
        self.end = 0
        self.offsets: list[int] = []
        self.ids: list[int] = []
        self.expirations: list[int] = []
        self.keys: list[int] = []
        #: Each record's route, and each route's queue ids.
        self.routes: list[int] = []
        self.route_ids: list[tuple[int, ...]] = []
        #: record index -> transaction id, for those sent in one.
        self.txs: dict[int, int] = {}


def read(buf: bytes, at: int) -> Columns | None:
    """The columns of the index whose frame starts at `at` in `buf` (the page from its
    first byte), once its own CRC and the CRC of every byte before it check out; None
    when anything does not (the caller walks the frames)."""
    payload = at + HEADER_SIZE
    if at < 0 or payload + HEAD.size + _FIXED.size > len(buf):
        return None
    length, crc = struct.unpack_from(">II", buf, at)
    end = payload + length
    view = memoryview(buf)
    try:
        if end > len(buf) or crc32(view[payload:end]) != crc:
            return None
        if not HEAD.unpack_from(buf, payload)[3] & INDEX:
            return None
        version, count, region_end, region_crc, routes, txs = _FIXED.unpack_from(
            buf, payload + HEAD.size
        )
        if version != _VERSION or region_end != at or crc32(view[:at]) != region_crc:
            return None
        pos = payload + HEAD.size + _FIXED.size
        columns = Columns()
        columns.end = at
        for name, code, size in (
            ("offsets", "I", 4),
            ("ids", "Q", 8),
            ("expirations", "Q", 8),
            ("keys", "H", 2),
            ("routes", "H", 2),
        ):
            setattr(columns, name, _ints(code, view[pos : pos + size * count]))
            pos += size * count
        for _ in range(routes):
            (n,) = struct.unpack_from(">H", buf, pos)
            columns.route_ids.append(tuple(_ints("Q", view[pos + 2 : pos + 2 + 8 * n])))
            pos += 2 + 8 * n
        tx_at = _ints("I", view[pos : pos + 4 * txs])
        pos += 4 * txs
        columns.txs = dict(zip(tx_at, _ints("Q", view[pos : pos + 8 * txs]), strict=True))
        if pos + 8 * txs != end:
            return None
    except (struct.error, ValueError):
        return None  # a column cut short: not an index this code wrote
    finally:
        view.release()
    return columns
