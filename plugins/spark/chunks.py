"""Chunk summaries of a stream: which property values each run of records holds.

A stream's sequence numbers are cut into chunks of `CHUNK` (chunk k holds k * CHUNK up
to (k + 1) * CHUNK, gaps included), and each chunk gets a `PageSummary` of its records'
application properties, as RabbitMQ streams keep a Bloom filter per chunk: a read with
a selector requiring `name = value` or `name IN (...)` passes over a chunk whose summary
holds none of the values (or not the name) without reading it.

A record whose application properties are a duplicate id and nothing else (what the Spark
sink writes) counts as "any value" of `_AMQ_DUPL_ID`, read without parsing: its values
are unique by design, so a Bloom filter of them would cost every append a parse and a
hash for the rare selector that names one id (such a selector reads the chunk). A record
whose body follows the annotations at once (a batch write's row) has no properties, also
known without a parse.

A summary is only made by whoever sees its chunk from the first record on, so it never
misses one: the writer thread as it appends (a chunk begun before this start has none),
or a reader thread whose read covered a whole chunk without one (after a restart). A
chunk without a summary is read. The chunk being written has an exact summary that
grows with the appends; a finished one becomes Bloom filters.

Threads: the writer thread adds to the summaries after its append is stored, before the
loop makes those records readable, so a reader never sees a record its chunk's summary
lacks; readers test and rebuild; the loop forgets what retention deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from scow.core.duplicates import DUPLICATE_ID_PROPERTY
from scow.plugins.paging.selecting import RecordFilter
from scow.plugins.paging.summary import PageSummary
from scow.plugins.spark.records import (
    DURABLE_HEADER,
    NO_ID,
    STREAM_SECTION_PREFIX,
    STREAM_SECTION_SIZE,
    id_value_at,
)

#: Sequence numbers per chunk: a read's size (`stream.READ_AHEAD`), so a read from a
#: chunk's start covers it whole.
CHUNK = 4096


class ChunkSummaries:
    """The chunk summaries of one stream (see the module docstring)."""

    __slots__ = ("_chunks", "_properties", "skipped")

    def __init__(self, properties: Callable[[bytes], Mapping[str, object]]) -> None:
        self._properties = properties
        #: chunk number -> its summary
        self._chunks: dict[int, PageSummary] = {}
        #: Chunks reads passed over by their summaries.
        self.skipped = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def appended(self, records: Iterable[tuple[int, bytes]]) -> None:
        """(writer thread) (sequence, bytes) of records just stored, in order."""
        chunks = self._chunks
        summary = None
        chunk = -1
        for seq, data in records:
            if seq // CHUNK != chunk:
                chunk = seq // CHUNK
                if seq % CHUNK == 0:
                    finished = chunks.get(chunk - 1)
                    if finished is not None:
                        finished.close()
                    summary = chunks[chunk] = PageSummary()
                else:
                    summary = chunks.get(chunk)
            if summary is not None:
                self._add(summary, data)

    def rebuild(self, first: int, records: list[tuple[int, int, bytes]], following: int) -> None:
        """(reader thread) Summarize the chunks without one that a read from `first`,
        which gave `records` (sequence, time, bytes) and stopped at `following`, covered
        whole."""
        chunks = self._chunks
        start = 0
        while start < len(records):
            chunk = records[start][0] // CHUNK
            stop = start
            while stop < len(records) and records[stop][0] // CHUNK == chunk:
                stop += 1
            whole = first <= chunk * CHUNK and (chunk + 1) * CHUNK <= following
            if whole and chunk not in chunks:
                built = PageSummary()
                for _seq, _time, data in records[start:stop]:
                    self._add(built, data)
                built.close()
                chunks.setdefault(chunk, built)
            start = stop

    def _add(self, summary: PageSummary, data: bytes) -> None:
        if data.startswith(DURABLE_HEADER) and data.startswith(
            STREAM_SECTION_PREFIX, len(DURABLE_HEADER)
        ):
            at = id_value_at(data, _SECTIONS_AT)
            if at is not None:
                summary.add(_NONE if at == NO_ID else _ANY_ID)
                return
        try:
            summary.add(self._properties(data))
        except ValueError:
            summary.unknown()  # unreadable properties: the chunk is always read

    def skip(self, seq: int, end: int, selecting: RecordFilter) -> int:
        """(reader thread) The first sequence number from `seq` on (below `end`) whose
        chunk may hold a record `selecting` accepts; `end` if none."""
        chunks = self._chunks
        while seq < end:
            summary = chunks.get(seq // CHUNK)
            if summary is None or not selecting.skips(summary):
                return seq
            self.skipped += 1
            seq = (seq // CHUNK + 1) * CHUNK
        return end

    def forget_before(self, seq: int) -> None:
        """(loop) Retention deleted every record below `seq`."""
        chunks = self._chunks
        for chunk in [c for c in list(chunks) if (c + 1) * CHUNK <= seq]:
            chunks.pop(chunk, None)


#: Where a durable record's sections start past the stream's annotations: a row the
#: connector wrote (`records.id_value_at`) is summarized from there without a parse...
_SECTIONS_AT = len(DURABLE_HEADER) + STREAM_SECTION_SIZE
#: ...as its id, a value no key stands for ("any"), when its properties are that alone...
_ANY_ID: Mapping[str, object] = {DUPLICATE_ID_PROPERTY: None}
#: ...or as no properties when it is a body alone (a batch write's row).
_NONE: Mapping[str, object] = {}
