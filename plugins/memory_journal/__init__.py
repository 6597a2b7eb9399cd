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
    """Keeps live records in dicts; completions run at once (there is no disk)."""

    def __init__(self) -> None:
        self._records: dict[int, RecordInfo] = {}
        self._updates: dict[int, list[RecordInfo]] = {}
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
        records: list[RecordInfo] = []
        for record_id, add in sorted(self._records.items()):
            records.append(add)
            records.extend(self._updates.get(record_id, ()))
        prepared = []
        for tx_id, data in self._prepared.items():
            tx = PreparedTransaction(tx_id, data)
            for kind, item in self._tx.get(tx_id, ()):
                if kind == "delete":
                    tx.deletes.append(item)  # type: ignore[arg-type]
                else:
                    tx.records.append(item)  # type: ignore[arg-type]
            prepared.append(tx)
        return LoadResult(records, prepared, self._max_id)

    def _add(self, rec: RecordInfo) -> None:
        self._max_id = max(self._max_id, rec.id)
        self._records[rec.id] = rec
        self._updates.pop(rec.id, None)

    def _update(self, rec: RecordInfo, replaceable: bool = False) -> None:
        if rec.id not in self._records:
            raise ValueError(f"memory journal: update of record id {rec.id}: no live record")
        updates = self._updates.setdefault(rec.id, [])
        if replaceable:
            updates[:] = [u for u in updates if u.type != rec.type]
        updates.append(rec)

    def _delete(self, record_id: int) -> None:
        if record_id not in self._records:
            raise ValueError(f"memory journal: delete of record id {record_id}: no live record")
        self._records.pop(record_id, None)
        self._updates.pop(record_id, None)

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
        self._done(on_done)

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
        self._done(on_done)

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
        for kind, item in self._tx.pop(tx_id, ()):
            if kind == "add":
                self._add(item)  # type: ignore[arg-type]
            elif kind == "update":
                self._update(item)  # type: ignore[arg-type]
            else:
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
