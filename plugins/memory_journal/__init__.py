"""The in-memory journal: the Journal interface with nothing on disk.

Used when persistence is not wanted, and as the reference the journal conformance
suite is checked against. Records live as long as the process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scow.core import hookimpl
from scow.core.descriptors import JournalBackend
from scow.core.interfaces import Completion, LoadResult, PreparedTransaction, RecordInfo


class MemoryJournal:
    """Keeps live records in append order; completions run at once (there is no disk)."""

    def __init__(self) -> None:
        self._log: dict[int, RecordInfo] = {}  # append sequence -> live entry, in order
        self._entries: dict[int, list[int]] = {}  # record id -> its sequences (add first)
        self._seq = 0
        self._replaceable: set[int] = set()  # sequences of replaceable updates
        self._tx: dict[int, list[tuple[str, RecordInfo | int]]] = {}
        self._prepared: dict[int, bytes] = {}
        self._max_id = 0
        self._dispatch: Callable[[list[Completion]], None] = _run_all

    def set_dispatcher(self, dispatch: Callable[[list[Completion]], None]) -> None:
        self._dispatch = dispatch

    def _done(self, on_done: Completion | None) -> None:
        if on_done is not None:
            self._dispatch([on_done])

    def load(self) -> LoadResult:
        # what a restart would see: undecided transactions that were never prepared are gone
        self._tx = {tx: ops for tx, ops in self._tx.items() if tx in self._prepared}
        prepared = []
        for tx_id, data in self._prepared.items():
            tx = PreparedTransaction(tx_id, data)
            for kind, item in self._tx.get(tx_id, ()):
                if kind == "delete":
                    tx.deletes.append(item)  # type: ignore[arg-type]
                else:
                    tx.records.append(item)  # type: ignore[arg-type]
            prepared.append(tx)
        return LoadResult(list(self._log.values()), prepared, self._max_id)

    def _append(self, rec: RecordInfo) -> None:
        self._seq += 1
        self._log[self._seq] = rec
        self._entries.setdefault(rec.id, []).append(self._seq)

    def _add(self, rec: RecordInfo) -> None:
        if rec.id in self._entries:
            raise ValueError(f"memory journal: add of record id {rec.id}: it is already live")
        self._max_id = max(self._max_id, rec.id)
        self._append(rec)

    def _update(self, rec: RecordInfo, replaceable: bool = False) -> None:
        seqs = self._entries.get(rec.id)
        if not seqs:
            raise ValueError(f"memory journal: update of record id {rec.id}: no live record")
        if replaceable:
            for seq in [
                s for s in seqs if s in self._replaceable and self._log[s].type == rec.type
            ]:
                seqs.remove(seq)
                self._replaceable.discard(seq)
                del self._log[seq]
        self._append(rec)
        if replaceable:
            self._replaceable.add(self._seq)

    def _delete(self, record_id: int) -> None:
        seqs = self._entries.pop(record_id, None)
        if seqs is None:
            raise ValueError(f"memory journal: delete of record id {record_id}: no live record")
        for seq in seqs:
            del self._log[seq]
            self._replaceable.discard(seq)

    def append_add(
        self,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        sync: bool,
        on_done: Completion | None = None,
    ) -> None:
        self._add(RecordInfo(record_id, record_type, bytes(data)))
        if on_done is not None:  # `_done`, inlined: a record per message with a duplicate id
            self._dispatch([on_done])

    def append_update(
        self,
        record_id: int,
        record_type: int,
        data: bytes,
        *,
        sync: bool,
        on_done: Completion | None = None,
        replaceable: bool = False,
    ) -> None:
        self._update(RecordInfo(record_id, record_type, bytes(data), True), replaceable)
        self._done(on_done)

    def append_delete(
        self, record_id: int, *, sync: bool, on_done: Completion | None = None
    ) -> None:
        self._delete(record_id)
        if on_done is not None:
            self._dispatch([on_done])

    def append_add_tx(self, tx_id: int, record_id: int, record_type: int, data: bytes) -> None:
        self._tx.setdefault(tx_id, []).append(("add", RecordInfo(record_id, record_type, data)))

    def append_update_tx(self, tx_id: int, record_id: int, record_type: int, data: bytes) -> None:
        rec = RecordInfo(record_id, record_type, data, True)
        self._tx.setdefault(tx_id, []).append(("update", rec))

    def append_delete_tx(self, tx_id: int, record_id: int) -> None:
        self._tx.setdefault(tx_id, []).append(("delete", record_id))

    def prepare(
        self, tx_id: int, data: bytes, *, sync: bool, on_done: Completion | None = None
    ) -> None:
        self._prepared[tx_id] = bytes(data)
        self._tx.setdefault(tx_id, [])
        self._done(on_done)

    def commit(self, tx_id: int, *, sync: bool, on_done: Completion | None = None) -> None:
        # as on disk: a transaction's update or delete of a record that died meanwhile
        # has nothing left to apply to
        for kind, item in self._tx.pop(tx_id, ()):
            if kind == "add":
                self._add(item)  # type: ignore[arg-type]
            elif kind == "update" and item.id in self._entries:  # type: ignore[union-attr]
                self._update(item)  # type: ignore[arg-type]
            elif kind == "delete" and item in self._entries:
                self._delete(item)  # type: ignore[arg-type]
        self._prepared.pop(tx_id, None)
        self._done(on_done)

    def rollback(self, tx_id: int, *, sync: bool, on_done: Completion | None = None) -> None:
        self._tx.pop(tx_id, None)
        self._prepared.pop(tx_id, None)
        self._done(on_done)

    def flush(self) -> None:
        pass

    def stop(self) -> None:
        pass


def _run_all(completions: list[Completion]) -> None:
    for completion in completions:
        completion()


def _factory(directory: Path, kind: str, settings: Mapping[str, Any]) -> MemoryJournal:
    return MemoryJournal()


@hookimpl
def scow_register_journals() -> list[JournalBackend]:
    return [
        JournalBackend(
            "memory",
            _factory,
            "keeps records in memory; nothing survives a restart",
            persistent=False,
        )
    ]
