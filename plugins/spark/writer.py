"""A stream's writer thread: appends what the loop queues to the stream's store.

`append(seq, message_id, data, token)` queues a record (sequence numbers given in order
by the loop), `append_rows` the rows of a committed pack (`PackedRows`, whose sizes the
loop checked: `records.rows_in`), unpacked here rather than on the loop; the thread
stamps each with its enqueue time, writes into it the stream's annotations
(`records.annotate`), appends everything queued to the store in one call (one sync:
group commit) and calls `on_written(Written)`, which must hand over to the loop itself.
Tokens come back only for records the store has made durable.

An append the store refuses (it undoes it whole) holds its records, with everything
queued after them, to be appended again every `RETRY` seconds (at once when more comes)
until it succeeds: a full file system (the disk monitor then holds producers back, see
`out_of_space`) or any other failure. Nothing is dropped and nothing is acknowledged
that is not stored; a stream never has a hole that would hide what follows it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from scow.core import disk_monitor
from scow.core.disk_monitor import is_no_space
from scow.core.interfaces import StreamAppended, StreamStore
from scow.plugins.spark.records import row_id, unpack

log = structlog.get_logger("scow.stream")

#: Seconds between attempts to append what the store refused.
RETRY = 1.0

#: (sequence number, message id, bytes, token, first row): a record when first row < 0,
#: else the rows of a committed pack from that one on
_Item = tuple[int, int, bytes, object, int]


@dataclass(slots=True)
class Written:
    """What one append did, handed back to the loop."""

    last_seq: int
    appended: StreamAppended
    tokens: list[object] = field(default_factory=list)


class StreamWriter:
    """The thread that appends one stream's records to its store (see the module doc).

    `place` is where a file store writes (for the disk monitor's verdict on a full file
    system).
    """

    def __init__(
        self,
        store: StreamStore,
        place: Path,
        on_written: Callable[[Written], None],
        annotate: Callable[[bytes, int, int], bytes],
        on_stored: Callable[[list[tuple[int, bytes]]], None] | None = None,
    ) -> None:
        self.store = store
        self.place = place
        self.on_written = on_written
        self.annotate = annotate
        #: Told (in this thread) the (sequence, bytes) of each append once it is stored,
        #: before `on_written`.
        self.on_stored = on_stored
        self._last_time = 0
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        #: Appends the store refused, and the records waiting to be appended again.
        self.errors = 0
        self.held = 0
        self._owner = f"stream {store.name!r}"
        self._thread = threading.Thread(
            target=self._run, name=f"scow-stream-{store.name}"[:60], daemon=True
        )
        self._thread.start()

    def append(self, seq: int, message_id: int, data: bytes, token: object) -> None:
        self._queue.put((seq, message_id, data, token, -1))

    def append_rows(self, seq: int, pack_id: int, data: bytes, first: int, token: object) -> None:
        """Append the rows of the committed pack `data` (message id `pack_id`) from row
        `first` on, at `seq` and the numbers after it; each stored with its `row_id`. They
        go in one store append, and `token` comes back once they are all stored."""
        self._queue.put((seq, pack_id, data, token, first))

    def delete(self, firsts: list[int]) -> None:
        """Delete the oldest segments (retention), in order with the appends."""
        self._queue.put((-1, 0, b"", firsts, -1))

    def close(self) -> None:
        """Append what is queued (what the store refuses stays unacknowledged), stop the
        thread. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        held: list[_Item] = []
        problem: str | None = None  # why held records wait
        while True:
            batch, held = held, []
            stopping = False
            try:  # with records held, new work tries again at once, else every RETRY s
                item = get(timeout=RETRY if batch else None)
                while item is not None:
                    batch.append(item)
                    item = get_nowait()
                stopping = True
            except queue.Empty:
                pass
            try:
                self._write(batch)
                reason = None
            except Exception as exc:  # held, tried again: never dropped, never acked
                held, reason = [item for item in batch if item[0] >= 0], exc
            self.held = len(held)
            problem = self._report(reason, problem, len(held))
            if stopping:
                if held:
                    log.error(
                        "stream records not stored at shutdown (never acknowledged)",
                        stream=self.store.name,
                        records=len(held),
                    )
                    disk_monitor.out_of_space(self.place, self._owner, None)
                return

    def _report(self, reason: Exception | None, problem: str | None, held: int) -> str | None:
        """Log a hold once and its end once; tell the disk monitor about a full file
        system. Returns the problem now."""
        if reason is not None and problem is None:
            self.errors += 1
            if is_no_space(reason):
                problem = disk_monitor.describe_no_room(self.place, "a stream write")
                disk_monitor.out_of_space(self.place, self._owner, problem)
                log.warning(
                    "stream write refused: file system full; producers held back and the "
                    "write tried again until space returns",
                    stream=self.store.name,
                    records=held,
                )
            else:
                problem = str(reason)
                log.error(
                    "stream write failed; tried again until it succeeds",
                    stream=self.store.name,
                    records=held,
                    exc_info=reason,
                )
        elif reason is None and problem is not None:
            log.info("stream writes go on", stream=self.store.name)
            disk_monitor.out_of_space(self.place, self._owner, None)
            problem = None
        return problem

    def _write(self, batch: Sequence[_Item]) -> None:
        """Append `batch` (and run its deletions); raises what the store raised, with
        nothing of the batch's records stored."""
        records = []
        written = Written(-1, StreamAppended())
        annotate = self.annotate
        for seq, message_id, data, token, first in batch:
            if seq < 0:  # retention: older segments than any append touches
                self.store.delete_segments(token)  # type: ignore[arg-type]
                continue
            now = max(int(time.time() * 1000), self._last_time)
            self._last_time = now
            if first < 0:
                records.append((seq, now, message_id, annotate(data, seq, now)))
            else:
                rows: list[bytes] = []
                unpack(data, rows)
                for row in range(first, len(rows)):
                    records.append(
                        (seq, now, row_id(message_id, row), annotate(rows[row], seq, now))
                    )
                    seq += 1
                seq -= 1
            written.tokens.append(token)
            written.last_seq = seq
        if not records:
            return
        written.appended = self.store.append(records)
        if self.on_stored is not None:
            self.on_stored([(record[0], record[3]) for record in records])
        self.on_written(written)
