"""`DatabaseStreamStore`: a stream queue's records as rows, one row per record.

Unlike pages (read once, in order, then deleted), a stream is read again and again from
any position, so each record is its own row keyed by (stream, sequence number): a
positioned read is one range scan of the primary key, with the database's own buffers
doing what the page cache does for segment files. Segments are kept as a column (the
first sequence number of the record's segment): retention deletes whole segments, which
are ranges of sequence numbers. An append is one transaction (a binary COPY on
PostgreSQL) fenced by the broker's lock row, so a broker that lost its lock never writes.

The stream's cursors are a JSON column of its directory row, replaced whole.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from scow.core.interfaces import StreamAppended, StreamContents, StreamRecord, StreamSegment
from scow.plugins.database_store import database
from scow.plugins.database_store.schema import insert_rows
from scow.plugins.database_store.settings import DatabaseSettings, resolve

#: Bytes a record counts for besides its message, as in a segment file (header and frame),
#: so that segment-bytes and retention-bytes mean about the same on either store.
RECORD_OVERHEAD = 32

#: Message ids are unsigned 64-bit (a committed pack's rows have ids from 2**63 up:
#: `scow.plugins.spark.records.row_id`); the column is a signed BIGINT, so an id is
#: stored as the signed number of its 64 bits.
_ID_WRAP = 1 << 64
_SIGNED_MAX = (1 << 63) - 1


def _stored_id(message_id: int) -> int:
    return message_id - _ID_WRAP if message_id > _SIGNED_MAX else message_id


def _message_id(stored: int) -> int:
    return stored + _ID_WRAP if stored < 0 else stored


class DatabaseStreamStore:
    """The records of one stream in the database; one thread writes, any thread reads."""

    def __init__(self, settings: DatabaseSettings, name: str, segment_bytes: int) -> None:
        self.name = name
        self.segment_bytes = segment_bytes
        self.db = database.acquire(settings)
        self._directory = self.db.schema.streams
        self._records = self.db.schema.stream_records
        self._lock = threading.Lock()
        #: [first sequence number, bytes, first enqueue time] per segment, oldest first
        self._segments: list[list[int]] = []
        self._stream_id = -1
        self._released = False

    def _what(self, doing: str) -> str:
        return f"{doing} stream {self.name!r}"

    # ------------------------------------------------------------------ opening

    def open(self) -> StreamContents:
        return self.db.run(self._what("opening"), self._open)

    def _open(self, conn: sa.Connection) -> StreamContents:
        d = self._directory.c
        found = conn.execute(sa.select(d.stream_id).where(d.name == self.name)).scalar()
        if found is None:
            highest = conn.execute(sa.select(sa.func.max(d.stream_id))).scalar()
            found = (highest or 0) + 1
            conn.execute(
                sa.insert(self._directory).values(stream_id=found, name=self.name, cursors="{}")
            )
        self._stream_id = int(found)
        r = self._records.c
        rows = conn.execute(
            sa.select(
                r.segment,
                sa.func.count(),
                sa.func.sum(sa.func.length(r.data)),
                sa.func.min(r.enqueued),
                sa.func.max(r.seq),
            )
            .where(r.stream_id == self._stream_id)
            .group_by(r.segment)
            .order_by(r.segment)
        ).all()
        segments = [
            [int(first), int(size) + RECORD_OVERHEAD * int(count), int(first_time)]
            for first, count, size, first_time, _last in rows
        ]
        next_seq = int(rows[-1][4]) + 1 if rows else 0
        recent: set[int] = set()
        if segments:
            since = segments[-2:][0][0]
            recent = {
                _message_id(stored)
                for stored in conn.execute(
                    sa.select(r.message_id).where(r.stream_id == self._stream_id, r.seq >= since)
                ).scalars()
            }
        with self._lock:
            self._segments = segments
        return StreamContents([StreamSegment(*s) for s in segments], next_seq, recent)

    # ------------------------------------------------------------------ writing

    def append(self, records: Sequence[StreamRecord]) -> StreamAppended:
        appended = StreamAppended()
        with self._lock:
            last = list(self._segments[-1]) if self._segments else None
        rows: list[dict[str, Any]] = []
        segments: list[list[int]] = []  # the last one and those the append begins
        if last is not None:
            segments.append(last)
        for seq, enqueued, message_id, data in records:
            if not segments or segments[-1][1] >= self.segment_bytes:
                segments.append([seq, 0, enqueued])
                appended.new_segments.append(StreamSegment(seq, 0, enqueued))
            segment = segments[-1]
            segment[1] += len(data) + RECORD_OVERHEAD
            rows.append(
                {
                    "stream_id": self._stream_id,
                    "seq": seq,
                    "segment": segment[0],
                    "enqueued": enqueued,
                    "message_id": _stored_id(message_id),
                    "data": data,
                }
            )
        if not rows:
            return appended
        last_seq = rows[-1]["seq"]
        attempts = 0

        def write(conn: sa.Connection) -> None:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and self._holds(conn, last_seq):
                return  # the last attempt committed, but its answer was lost
            insert_rows(conn, self._records, rows)
            self.db.fence(conn)  # last: the lock row is locked only for the commit

        self.db.run(self._what("appending to"), write)
        for segment in segments:
            appended.sizes[segment[0]] = segment[1]
        for new in appended.new_segments:
            new.size = appended.sizes[new.first]
        with self._lock:
            if last is not None and self._segments and self._segments[-1][0] == last[0]:
                self._segments[-1] = segments[0]
            self._segments.extend(segments[1 if last is not None else 0 :])
        return appended

    def _holds(self, conn: sa.Connection, seq: int) -> bool:
        r = self._records.c
        query = sa.select(r.seq).where(r.stream_id == self._stream_id, r.seq == seq)
        return conn.execute(query).first() is not None

    def delete_segments(self, firsts: Sequence[int]) -> None:
        gone = set(firsts)
        with self._lock:
            segments = self._segments
            # never the last one: retention keeps the segment appended to
            ranges = [
                (segments[i][0], segments[i + 1][0])
                for i in range(len(segments) - 1)
                if segments[i][0] in gone
            ]
        if not ranges:
            return
        r = self._records.c

        def delete(conn: sa.Connection) -> None:
            for first, following in ranges:
                conn.execute(
                    sa.delete(self._records).where(
                        r.stream_id == self._stream_id, r.seq >= first, r.seq < following
                    )
                )
            self.db.fence(conn)

        self.db.run(self._what("deleting segments of"), delete)
        deleted = {first for first, _following in ranges}
        with self._lock:
            self._segments = [s for s in self._segments if s[0] not in deleted]

    # ------------------------------------------------------------------ reading

    def read(self, seq: int, end: int, limit: int) -> tuple[list[tuple[int, int, bytes]], int]:
        if seq >= end or limit <= 0:
            return [], seq
        r = self._records.c
        query = (
            sa.select(r.seq, r.enqueued, r.data)
            .where(r.stream_id == self._stream_id, r.seq >= seq, r.seq < end)
            .order_by(r.seq)
            .limit(limit)
        )
        rows = self.db.run(self._what("reading"), lambda conn: conn.execute(query).all(), read=True)
        if not rows:
            return [], seq
        out = [(int(s), int(t), bytes(data)) for s, t, data in rows]
        return out, out[-1][0] + 1

    def seek(self, when: int) -> int | None:
        with self._lock:
            times = [s[2] for s in self._segments]
            firsts = [s[0] for s in self._segments]
        if not firsts:
            return None
        since = firsts[max(bisect.bisect_right(times, when) - 1, 0)]
        r = self._records.c
        query = (
            sa.select(r.seq)
            .where(r.stream_id == self._stream_id, r.seq >= since, r.enqueued >= when)
            .order_by(r.seq)
            .limit(1)
        )
        found = self.db.run(
            self._what("seeking in"), lambda conn: conn.execute(query).scalar(), read=True
        )
        return None if found is None else int(found)

    # ------------------------------------------------------------------ cursors

    def load_cursors(self) -> dict[str, tuple[int, int]]:
        d = self._directory.c
        query = sa.select(d.cursors).where(d.stream_id == self._stream_id)
        text = self.db.run(
            self._what("reading the cursors of"),
            lambda conn: conn.execute(query).scalar(),
            read=True,
        )
        stored = json.loads(text or "{}")
        return {name: (int(seq), int(used)) for name, (seq, used) in stored.items()}

    def save_cursors(self, cursors: Mapping[str, tuple[int, int]]) -> None:
        d = self._directory.c
        text = json.dumps({name: list(value) for name, value in cursors.items()})

        def save(conn: sa.Connection) -> None:
            conn.execute(
                sa.update(self._directory)
                .where(d.stream_id == self._stream_id)
                .values(cursors=text)
            )
            self.db.fence(conn)

        self.db.run(self._what("saving the cursors of"), save)

    # ------------------------------------------------------------------ lifetime

    def destroy(self) -> None:
        def delete(conn: sa.Connection) -> None:
            r, d = self._records.c, self._directory.c
            conn.execute(sa.delete(self._records).where(r.stream_id == self._stream_id))
            conn.execute(sa.delete(self._directory).where(d.stream_id == self._stream_id))
            self.db.fence(conn)

        try:
            self.db.run(self._what("deleting"), delete)
        finally:
            self.close()

    def close(self) -> None:
        if not self._released:
            self._released = True
            database.release(self.db)


def open_store(
    data_dir: Path, name: str, segment_bytes: int, settings: Mapping[str, Any]
) -> DatabaseStreamStore:
    """The stream store factory: `settings` is the `[database]` section."""
    return DatabaseStreamStore(resolve(settings, data_dir), name, segment_bytes)
