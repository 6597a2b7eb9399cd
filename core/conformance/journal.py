"""The conformance suite every `Journal` backend passes (built-in and third-party).

Subclass `JournalConformance` in a test module and provide a `make_journal` fixture: a
callable that takes a directory (a `pathlib.Path`) and returns a *new, not yet loaded*
journal stored there. Calling it again with the same path after `stop()` must give a
journal that recovers what the first one stored, which is how reloads are tested. A
journal with no disk can keep a registry keyed by path.

    class TestMyJournal(JournalConformance):
        @pytest.fixture
        def make_journal(self):
            return lambda path: MyJournal(path)
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scow.core.interfaces import Journal, LoadResult, RecordInfo

MakeJournal = Callable[[Path], Journal]
WAIT = 10.0  # seconds: generous, only reached when something is broken


class Model:
    """What a journal must hold after a sequence of operations (the reference semantics)."""

    def __init__(self) -> None:
        #: [id, type, data, is_update, replaceable] per entry in journal order; None = dead
        self.entries: list[list[Any] | None] = []
        self.index: dict[int, list[int]] = {}
        self.txs: dict[int, list[tuple[Any, ...]]] = {}
        self.prepared: dict[int, bytes] = {}

    def add(self, rid: int, rtype: int, data: bytes) -> None:
        assert rid not in self.index
        self.index[rid] = [len(self.entries)]
        self.entries.append([rid, rtype, data, False, False])

    def update(self, rid: int, rtype: int, data: bytes, replaceable: bool = False) -> None:
        idxs = self.index.get(rid)
        if idxs is None:
            return
        if replaceable:
            for i in idxs:
                e = self.entries[i]
                if e is not None and e[3] and e[4] and e[1] == rtype:
                    self.entries[i] = None
        idxs.append(len(self.entries))
        self.entries.append([rid, rtype, data, True, replaceable])

    def delete(self, rid: int) -> None:
        for i in self.index.pop(rid, []):
            self.entries[i] = None

    def tx(self, tx_id: int, *op: Any) -> None:
        self.txs.setdefault(tx_id, []).append(op)

    def commit(self, tx_id: int) -> None:
        self.prepared.pop(tx_id, None)
        for op in self.txs.pop(tx_id, []):
            if op[0] == "add":
                if op[1] not in self.index:
                    self.add(*op[1:])
            elif op[0] == "update":
                self.update(*op[1:])
            else:
                self.delete(op[1])

    def rollback(self, tx_id: int) -> None:
        self.prepared.pop(tx_id, None)
        self.txs.pop(tx_id, None)

    def restart(self) -> None:
        """Open transactions that were not prepared are lost on reload."""
        for tx_id in list(self.txs):
            if tx_id not in self.prepared:
                del self.txs[tx_id]

    def records(self) -> list[RecordInfo]:
        return [RecordInfo(e[0], e[1], e[2], e[3]) for e in self.entries if e is not None]

    def live_ids(self) -> set[int]:
        return set(self.index)


class Completions:
    """Counts completions and lets a test wait for a number of them."""

    def __init__(self) -> None:
        self.order: list[Any] = []
        self._cond = threading.Condition()

    def __call__(self, tag: Any) -> Callable[[], None]:
        def done() -> None:
            with self._cond:
                self.order.append(tag)
                self._cond.notify_all()

        return done

    def wait_for(self, n: int, timeout: float = WAIT) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.order) >= n, timeout)
        assert ok, f"only {len(self.order)} of {n} completions ran within {timeout}s"


class JournalConformance:
    """Behaviour every journal backend shares; needs a `make_journal` fixture."""

    # ------------------------------------------------------------------ helpers

    @contextmanager
    def opened(self, make_journal: MakeJournal, path: Path) -> Iterator[tuple[Journal, LoadResult]]:
        journal = make_journal(path)
        result = journal.load()
        try:
            yield journal, result
        finally:
            journal.stop()

    def reload(self, make_journal: MakeJournal, path: Path) -> LoadResult:
        with self.opened(make_journal, path) as (_j, result):
            return result

    # ------------------------------------------------------------------ basics

    def test_journal_satisfies_the_protocol(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (journal, result):
            assert isinstance(journal, Journal)
            assert result.records == [] and result.prepared == [] and result.max_id == 0

    def test_added_records_survive_reload_in_order(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            for i in range(1, 51):
                j.append_add(i, i % 7, f"record {i}".encode(), sync=i % 2 == 0)
            j.append_add(100, 255, b"", sync=True)
        result = self.reload(make_journal, tmp_path)
        expected = [RecordInfo(i, i % 7, f"record {i}".encode()) for i in range(1, 51)]
        assert result.records == [*expected, RecordInfo(100, 255, b"")]

    def test_updates_follow_in_journal_order(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"a", sync=True)
            j.append_add(2, 1, b"b", sync=True)
            j.append_update(1, 2, b"a-ref-q1", sync=True)
            j.append_update(2, 2, b"b-ref-q1", sync=True)
            j.append_update(1, 2, b"a-ref-q2", sync=True)
        assert self.reload(make_journal, tmp_path).records == [
            RecordInfo(1, 1, b"a"),
            RecordInfo(2, 1, b"b"),
            RecordInfo(1, 2, b"a-ref-q1", True),
            RecordInfo(2, 2, b"b-ref-q1", True),
            RecordInfo(1, 2, b"a-ref-q2", True),
        ]

    def test_delete_removes_the_record_and_its_updates(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"a", sync=True)
            j.append_add(2, 1, b"b", sync=True)
            j.append_update(1, 2, b"u", sync=True)
            j.append_update(1, 3, b"r", sync=True, replaceable=True)
            j.append_delete(1, sync=True)
        assert self.reload(make_journal, tmp_path).records == [RecordInfo(2, 1, b"b")]

    def test_replaceable_updates_collapse_to_the_latest(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"msg", sync=True)
            for n in range(5):
                j.append_update(1, 34, f"count={n}".encode(), sync=True, replaceable=True)
                j.append_update(1, 36, f"when={n}".encode(), sync=True, replaceable=True)
            j.append_update(1, 32, b"ref-1", sync=True)
            j.append_update(1, 32, b"ref-2", sync=True)
        assert self.reload(make_journal, tmp_path).records == [
            RecordInfo(1, 1, b"msg"),
            RecordInfo(1, 34, b"count=4", True),
            RecordInfo(1, 36, b"when=4", True),
            RecordInfo(1, 32, b"ref-1", True),
            RecordInfo(1, 32, b"ref-2", True),
        ]

    def test_max_id_is_the_highest_id_seen(self, make_journal: MakeJournal, tmp_path: Path) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(7, 1, b"", sync=True)
            j.append_add(2**40, 1, b"", sync=True)
            j.append_add(3, 1, b"", sync=True)
        assert self.reload(make_journal, tmp_path).max_id == 2**40

    def test_appends_continue_across_reloads(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        model = Model()
        for round_ in range(3):
            with self.opened(make_journal, tmp_path) as (j, result):
                assert result.records == model.records()
                base = round_ * 100
                for i in range(base + 1, base + 21):
                    j.append_add(i, 1, b"x" * i, sync=True)
                    model.add(i, 1, b"x" * i)
                for i in range(base + 1, base + 21, 3):
                    j.append_delete(i, sync=True)
                    model.delete(i)
        assert self.reload(make_journal, tmp_path).records == model.records()

    def test_stop_is_idempotent(self, make_journal: MakeJournal, tmp_path: Path) -> None:
        journal = make_journal(tmp_path)
        journal.load()
        journal.append_add(1, 1, b"x", sync=True)
        journal.stop()
        journal.stop()
        assert self.reload(make_journal, tmp_path).records == [RecordInfo(1, 1, b"x")]

    # ------------------------------------------------------------------ transactions

    def test_transaction_applies_at_its_commit(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"old", sync=True)
            j.append_add_tx(10, 2, 1, b"new")
            j.append_update_tx(10, 1, 2, b"ack")
            j.append_add(3, 1, b"between", sync=True)
            j.append_delete_tx(10, 1)
            j.commit(10, sync=True)
        assert self.reload(make_journal, tmp_path).records == [
            RecordInfo(3, 1, b"between"),
            RecordInfo(2, 1, b"new"),
        ]

    def test_transactional_update_is_attached_at_commit(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"m", sync=True)
            j.append_update_tx(5, 1, 33, b"q")
            j.commit(5, sync=True)
        assert self.reload(make_journal, tmp_path).records == [
            RecordInfo(1, 1, b"m"),
            RecordInfo(1, 33, b"q", True),
        ]

    def test_rolled_back_transaction_leaves_no_trace(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"keep", sync=True)
            j.append_add_tx(10, 2, 1, b"gone")
            j.append_delete_tx(10, 1)
            j.rollback(10, sync=True)
        assert self.reload(make_journal, tmp_path).records == [RecordInfo(1, 1, b"keep")]

    def test_transaction_without_commit_is_discarded_on_reload(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"keep", sync=True)
            j.append_add_tx(10, 2, 1, b"never committed")
            j.append_delete_tx(10, 1)
        result = self.reload(make_journal, tmp_path)
        assert result.records == [RecordInfo(1, 1, b"keep")]
        assert result.prepared == []
        # The id can be used again for a new transaction without reviving the old one.
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add_tx(10, 3, 1, b"second life")
            j.commit(10, sync=True)
        assert self.reload(make_journal, tmp_path).records == [
            RecordInfo(1, 1, b"keep"),
            RecordInfo(3, 1, b"second life"),
        ]

    def test_prepared_transaction_survives_reload_and_commits_later(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"acked later", sync=True)
            j.append_add_tx(10, 2, 4, b"sent in tx")
            j.append_update_tx(10, 1, 33, b"ack")
            j.append_delete_tx(10, 1)
            j.prepare(10, b"xid-10", sync=True)
        with self.opened(make_journal, tmp_path) as (j, result):
            assert result.records == [RecordInfo(1, 1, b"acked later")]
            assert len(result.prepared) == 1
            tx = result.prepared[0]
            assert (tx.tx_id, tx.data) == (10, b"xid-10")
            assert tx.records == [RecordInfo(2, 4, b"sent in tx"), RecordInfo(1, 33, b"ack", True)]
            assert tx.deletes == [1]
            j.commit(10, sync=True)
        result = self.reload(make_journal, tmp_path)
        assert result.records == [RecordInfo(2, 4, b"sent in tx")]
        assert result.prepared == []

    def test_prepared_transaction_rolled_back_after_reload(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add_tx(10, 2, 4, b"x")
            j.prepare(10, b"xid", sync=True)
        with self.opened(make_journal, tmp_path) as (j, result):
            assert [t.tx_id for t in result.prepared] == [10]
            j.rollback(10, sync=True)
        result = self.reload(make_journal, tmp_path)
        assert result.records == [] and result.prepared == []

    def test_prepared_empty_transaction_survives_reload(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        with self.opened(make_journal, tmp_path) as (j, _):
            j.prepare(77, b"empty", sync=True)
        result = self.reload(make_journal, tmp_path)
        assert [(t.tx_id, t.data, t.records, t.deletes) for t in result.prepared] == [
            (77, b"empty", [], [])
        ]

    # ------------------------------------------------------------------ completions

    def test_every_completion_runs_once_in_append_order(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        done = Completions()
        with self.opened(make_journal, tmp_path) as (j, _):
            j.append_add(1, 1, b"a", sync=True, on_done=done("add"))
            j.append_add(2, 1, b"b", sync=False, on_done=done("add-nosync"))
            j.append_update(1, 2, b"u", sync=True, on_done=done("update"))
            j.append_update(1, 3, b"r", sync=False, on_done=done("update-r"), replaceable=True)
            j.append_delete(2, sync=True, on_done=done("delete"))
            j.append_add_tx(5, 3, 1, b"t")
            j.prepare(5, b"x", sync=True, on_done=done("prepare"))
            j.commit(5, sync=True, on_done=done("commit"))
            j.append_add_tx(6, 4, 1, b"t")
            j.rollback(6, sync=False, on_done=done("rollback"))
            done.wait_for(8)
            j.flush()
        assert done.order == [
            "add",
            "add-nosync",
            "update",
            "update-r",
            "delete",
            "prepare",
            "commit",
            "rollback",
        ]

    def test_flush_returns_after_all_completions_ran(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        done = Completions()
        with self.opened(make_journal, tmp_path) as (j, _):
            for i in range(1, 201):
                j.append_add(i, 1, b"x" * 50, sync=i % 3 == 0, on_done=done(i))
            j.flush()
            assert sorted(done.order) == list(range(1, 201))

    def test_dispatcher_receives_completions_in_batches(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        batches: list[int] = []
        done = Completions()

        def dispatch(completions: list[Callable[[], None]]) -> None:
            batches.append(len(completions))
            for c in completions:
                c()

        journal = make_journal(tmp_path)
        journal.set_dispatcher(dispatch)
        journal.load()
        try:
            for i in range(1, 101):
                journal.append_add(i, 1, b"x", sync=True, on_done=done(i))
            done.wait_for(100)
        finally:
            journal.stop()
        assert sum(batches) == 100
        assert done.order == list(range(1, 101))

    # ------------------------------------------------------------------ a longer story

    def test_random_operations_match_the_model(
        self, make_journal: MakeJournal, tmp_path: Path
    ) -> None:
        rng = random.Random(20240611)
        model = Model()
        next_id = 1
        next_tx = 1
        for _round in range(3):
            with self.opened(make_journal, tmp_path) as (j, result):
                assert result.records == model.records()
                assert sorted(t.tx_id for t in result.prepared) == sorted(model.prepared)
                for _ in range(600):
                    live = sorted(model.live_ids())
                    op = rng.random()
                    if op < 0.40 or not live:
                        data = rng.randbytes(rng.randrange(0, 300))
                        j.append_add(next_id, 1, data, sync=rng.random() < 0.5)
                        model.add(next_id, 1, data)
                        next_id += 1
                    elif op < 0.60:
                        rid = rng.choice(live)
                        repl = rng.random() < 0.5
                        rtype = rng.choice((2, 3))
                        data = rng.randbytes(rng.randrange(0, 40))
                        j.append_update(rid, rtype, data, sync=False, replaceable=repl)
                        model.update(rid, rtype, data, repl)
                    elif op < 0.80:
                        rid = rng.choice(live)
                        j.append_delete(rid, sync=rng.random() < 0.5)
                        model.delete(rid)
                    else:
                        tx = next_tx
                        next_tx += 1
                        pending = set()
                        for _k in range(rng.randrange(1, 5)):
                            choice = rng.random()
                            candidates = [r for r in live if r not in pending]
                            if choice < 0.5 or not candidates:
                                data = rng.randbytes(rng.randrange(0, 100))
                                j.append_add_tx(tx, next_id, 5, data)
                                model.tx(tx, "add", next_id, 5, data)
                                next_id += 1
                            elif choice < 0.75:
                                rid = rng.choice(candidates)
                                j.append_update_tx(tx, rid, 6, b"tx-update")
                                model.tx(tx, "update", rid, 6, b"tx-update")
                            else:
                                rid = rng.choice(candidates)
                                pending.add(rid)
                                j.append_delete_tx(tx, rid)
                                model.tx(tx, "delete", rid)
                        fate = rng.random()
                        if fate < 0.6:
                            j.commit(tx, sync=True)
                            model.commit(tx)
                        elif fate < 0.75:
                            j.rollback(tx, sync=True)
                            model.rollback(tx)
                        elif fate < 0.9:
                            j.prepare(tx, b"xid", sync=True)
                            model.prepared[tx] = b"xid"
                        # else: left open, lost at restart
                # resolve some prepared transactions from earlier rounds
                for tx in sorted(model.prepared)[:2]:
                    j.commit(tx, sync=True)
                    model.commit(tx)
            model.restart()
        result = self.reload(make_journal, tmp_path)
        assert result.records == model.records()
