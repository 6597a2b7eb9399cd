"""A closed page's index: its message records' fields as columns, read without a walk.

The pager notes each record's head as it pages it (`PageIndex.add`: one slice appended
to a bytearray) and, when it closes the page, writes the index as a record of its own
just before the summary (flag `record.INDEX`, routed to no queue, so every reader of
messages passes over it as it passes over the summary). The page writer seals it with
the CRC-32 of every byte of the page before it (`seal`), which only the writer knows:
it appended them. A reader that finds the index checks its frame's CRC and that region
CRC, two calls over the whole page, and gets every record's fields with one unpack per
column (`read`) instead of walking the frames in Python.

    version       u8    1
    count         u32   message records in the page, all of them before the index
    region end    u32   page offset of the index's own frame (where the records end)
    region CRC    u32   CRC-32 of the page's bytes before it
    routes        u16   distinct sets of queues the records are routed to
    transactions  u32   records sent in a transaction
    columns, little-endian, `count` entries each, in page order:
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
from typing import Final

from scow.core.page_frames import HEADER_SIZE, crc32
from scow.plugins.paging.record import HEAD, INDEX

_VERSION: Final = 1
#: version, count, region end, region CRC, routes, transactions
_FIXED = struct.Struct("<BIIIHI")
#: Where the region CRC sits in the index's payload (the writer fills it in).
_CRC_AT: Final = HEAD.size + 9
#: What the pager keeps of each record while its page is written: its head and first
#: queue id, as `record.encode` lays them out.
_ROW = struct.Struct(">QQQBBHQ")
#: The largest page offset a u32 column holds: a larger page is not indexed.
_MAX_OFFSET: Final = 0xFFFF_FFFF
_MAX_ROUTES: Final = 0xFFFF
_BIG_ENDIAN = sys.byteorder == "big"

for _code, _size in (("I", 4), ("Q", 8), ("H", 2)):
    if array(_code).itemsize != _size:  # pragma: no cover - every platform we build on
        raise ImportError(f"array type {_code!r} is not {_size} bytes here; page indexes need it")


def _column(code: str, values: Sequence[int]) -> bytes:
    column = array(code, values)
    if _BIG_ENDIAN:  # pragma: no cover
        column.byteswap()
    return column.tobytes()


def _ints(code: str, data: bytes | memoryview) -> list[int]:
    column = array(code)
    column.frombytes(data)
    if _BIG_ENDIAN:  # pragma: no cover
        column.byteswap()
    return column.tolist()


class PageIndex:
    """The index of the page being written: filled as records are paged, encoded when
    the page closes (on the loop), sealed by the page writer."""

    __slots__ = ("_encoded", "heads", "offsets", "routes")

    def __init__(self) -> None:
        #: Each record's `_ROW`: its header and first queue id, sliced from its bytes.
        self.heads = bytearray()
        #: Each record's page offset.
        self.offsets = array("Q")
        #: record number -> its queue ids, for records routed to more than one queue.
        self.routes: dict[int, bytes] = {}
        self._encoded: bytearray | None = None

    def add(self, offset: int, data: bytes, queues: int) -> None:
        """One more record, paged at `offset`: `data` as `record.encode` made it."""
        if queues > 1:
            self.routes[len(self.offsets)] = data[HEAD.size : HEAD.size + 8 * queues]
        self.heads += data[: _ROW.size]
        self.offsets.append(offset)

    def __len__(self) -> int:
        """Bytes of the index record once closed (0: the page has none)."""
        return len(self._encoded) if self._encoded is not None else 0

    def close(self, end: int) -> int:
        """Encode the index of the page closed at `end` (its region CRC is left for
        `seal`); returns its record's size, 0 when the page cannot be indexed (too large
        for the offsets, too many routes). Frees what the builder held."""
        heads, offsets, multi = self.heads, self.offsets, self.routes
        self.heads, self.offsets, self.routes = bytearray(), array("Q"), {}
        count = len(offsets)
        if not count or end > _MAX_OFFSET:
            return 0
        ids, expirations, txs, flags, priorities, _n, firsts = zip(
            *_ROW.iter_unpack(heads), strict=True
        )
        # most pages: every record to the same queue, or the same set of queues
        if not multi and firsts.count(firsts[0]) == count:
            table: dict[bytes, int] = {firsts[0].to_bytes(8, "big"): 0}
            routes = [0] * count
        else:
            table = {}
            routes = [
                table.setdefault(multi.get(i) or first.to_bytes(8, "big"), len(table))
                for i, first in enumerate(firsts)
            ]
            if len(table) > _MAX_ROUTES:
                return 0
        tx_at = [i for i, tx in enumerate(txs) if tx] if any(txs) else []
        keys = [f << 8 | p for f, p in zip(flags, priorities, strict=True)]
        parts = [
            HEAD.pack(0, 0, 0, INDEX, 0, 0),
            _FIXED.pack(_VERSION, count, end, 0, len(table), len(tx_at)),
            _column("I", offsets),
            _column("Q", ids),
            _column("Q", expirations),
            _column("H", keys),
            _column("H", routes),
        ]
        for ids_bytes in table:
            n = len(ids_bytes) // 8
            parts += [struct.pack("<H", n), _column("Q", struct.unpack(f">{n}Q", ids_bytes))]
        parts += [_column("I", tx_at), _column("Q", [txs[i] for i in tx_at])]
        self._encoded = bytearray(b"".join(parts))
        return len(self._encoded)

    def seal(self, size: int, crc: int) -> bytes | None:
        """The encoded index with the CRC of the page's first `size` bytes (what the
        store appended), or None when they are not the records it indexes (a write the
        store refused, a page it did not write from its start)."""
        encoded, self._encoded = self._encoded, None
        if encoded is None or _FIXED.unpack_from(encoded, HEAD.size)[2] != size:
            return None
        struct.pack_into("<I", encoded, _CRC_AT, crc)
        return bytes(encoded)


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
            (n,) = struct.unpack_from("<H", buf, pos)
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
