"""Compaction: what it keeps, that appends go on meanwhile, and a crash at every stage."""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from scow.core.conformance.journal import Model
from scow.plugins.file_journal import COMPACTION_STAGES, ControlFileError, FileJournal

from .helpers import load, open_journal, run_child, settings, valid_records, wait_until
from .scripted import Op, apply, during, history


@pytest.fixture(params=["NIO", "AIO"])
def journal_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def assert_bookkeeping_consistent(j: FileJournal, model: Model) -> None:
    """Delete everything left; then reclaim must free every sealed file but the last."""
    for rid in sorted(model.live_ids()):
        j.append_delete(rid, sync=False)
        model.delete(rid)
    for tx in list(model.prepared):
        j.rollback(tx, sync=False)
        model.rollback(tx)
    for rolls in range(2):
        current = j.data_files()[-1]
        n = 0
        while j.data_files()[-1] == current:
            j.append_add(800_000 + rolls * 10_000 + n, 9, b"f" * 3000, sync=False)
            j.append_delete(800_000 + rolls * 10_000 + n, sync=False)
            n += 1
    j.reclaim()
    assert len(j.data_files()) <= 2, j.data_files()


# ---------------------------------------------------------------------------- in process


def test_compaction_keeps_live_records_and_frees_files(tmp_path: Path, journal_type: str) -> None:
    model = Model()
    j = open_journal(tmp_path, journal_type, journal_compact_min_files=0)
    try:
        apply(j, model, history())
        j.reclaim()
        before = len(j.data_files())
        assert before >= 6  # long-lived records pin files reclaim cannot free
        assert j.compact()
        assert len(j.data_files()) < before / 2
        apply(j, model, [["commit", 8]])
    finally:
        j.stop()
    model.restart()
    result = load(tmp_path, journal_type)
    assert result.records == model.records()
    assert sorted(t.tx_id for t in result.prepared) == [7, 10]
    # on disk, each replaceable update exists once: only the latest was copied
    repl = [v for v in valid_records(tmp_path) if v.record_type == 34 and v.kind == "UPDATE"]
    assert len(repl) == len({v.record_id for v in repl})


def test_prepared_transaction_survives_compaction_and_commits_after(tmp_path: Path) -> None:
    model = Model()
    j = open_journal(tmp_path, journal_compact_min_files=0)
    apply(j, model, history())
    assert j.compact()
    j.stop()
    model.restart()
    j = open_journal(tmp_path)
    apply(j, model, [["commit", 7], ["rollback", 10]])
    j.stop()
    result = load(tmp_path)
    assert result.records == model.records() and result.prepared == []


@pytest.mark.parametrize("stage", COMPACTION_STAGES)
def test_changes_made_at_each_stage_are_kept(tmp_path: Path, stage: str) -> None:
    model = Model()
    j: FileJournal

    def hook(name: str) -> None:
        if name == stage:
            apply(j, model, during())

    j = FileJournal(settings(tmp_path, journal_compact_min_files=0), compaction_hook=hook)
    j.load()
    try:
        apply(j, model, history())
        assert j.compact()
        snapshot_model = model.records()
        assert load_live(j) == snapshot_model
        assert_bookkeeping_consistent(j, model)
    finally:
        j.stop()
    model.restart()
    assert load(tmp_path).records == model.records()


def load_live(j: FileJournal) -> list[Any]:
    """What a restart would find right now (a flushed crash image of the live journal)."""
    import shutil
    import tempfile

    j.flush()
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "image"
        shutil.copytree(j.directory, image, ignore=shutil.ignore_patterns("*.tmp"))
        return load(image).records


def test_compaction_starts_by_itself_when_live_data_is_low(tmp_path: Path) -> None:
    model = Model()
    j = open_journal(tmp_path, journal_compact_min_files=4, journal_compact_percentage=30)
    try:
        ops: list[Op] = []
        for i in range(1, 400):
            ops.append(["add", i, 1, "y" * 900])
        for i in range(1, 400):
            if i % 50 != 0:
                ops.append(["delete", i])
        apply(j, model, ops)
        n = 100_000
        while j.counters.compactions == 0 and n < 100_400:
            apply(j, model, [["add", n, 2, "z" * 3000], ["delete", n]])
            n += 1
        wait_until(lambda: j.counters.compactions >= 1, what="an automatic compaction")
    finally:
        j.stop()
    assert load(tmp_path).records == model.records()


def test_compaction_while_another_thread_keeps_appending(tmp_path: Path, journal_type: str) -> None:
    model = Model()
    j = open_journal(tmp_path, journal_type, journal_compact_min_files=0)
    stop = threading.Event()
    failures: list[BaseException] = []
    rng = random.Random(7)

    def worker() -> None:
        next_id, next_tx = 1, 1
        try:
            while not stop.is_set():
                live = sorted(model.live_ids())
                r = rng.random()
                if r < 0.45 or len(live) < 50:
                    apply(j, model, [["add", next_id, 1, "w" * rng.randrange(200, 1200)]])
                    next_id += 1
                elif r < 0.55:
                    apply(j, model, [["update", rng.choice(live), 34, str(next_id), True]])
                elif r < 0.6:
                    apply(j, model, [["update", rng.choice(live), 32, "ref", False]])
                elif r < 0.95:
                    apply(j, model, [["delete", rng.choice(live)]])
                else:
                    victim = rng.choice(live)
                    apply(
                        j,
                        model,
                        [
                            ["add_tx", next_tx, next_id, 2, "t"],
                            ["delete_tx", next_tx, victim],
                            ["commit", next_tx],
                        ],
                    )
                    next_id += 1
                    next_tx += 1
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        done = 0
        while done < 3:
            wait_until(lambda: len(j.data_files()) >= 4 or bool(failures), what="some files")
            if j.compact():
                done += 1
    finally:
        stop.set()
        thread.join()
        j.stop()
    assert not failures, failures
    assert j.counters.compactions >= 3
    loaded, expected = load(tmp_path, journal_type).records, model.records()
    assert loaded == expected, describe_difference(loaded, expected)


def describe_difference(loaded: list[Any], expected: list[Any]) -> str:
    """Which entries are missing, extra or out of order (for a readable failure)."""
    short = [(r.id, r.type, r.is_update, r.data[:12]) for r in loaded]
    want = [(r.id, r.type, r.is_update, r.data[:12]) for r in expected]
    missing = [e for e in want if e not in short]
    extra = [e for e in short if e not in want]
    first = next((i for i, (a, b) in enumerate(zip(short, want, strict=False)) if a != b), None)
    return (
        f"{len(loaded)} loaded, {len(expected)} expected; missing {missing[:10]}; "
        f"extra {extra[:10]}; first difference at {first}: "
        f"{short[first : first + 3] if first is not None else None} vs "
        f"{want[first : first + 3] if first is not None else None}"
    )


def test_a_damaged_control_file_stops_the_load(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append_add(1, 1, b"x", sync=True)
    j.stop()
    (tmp_path / "scow-data-rename-control.ctr").write_bytes(b"\0\0\0\0{not json")
    with pytest.raises(ControlFileError, match="CRC mismatch"):
        load(tmp_path)


# ---------------------------------------------------------------------------- crash at each stage

CHILD = r"""
import json, os, sys
sys.path[:0] = json.loads(sys.argv[4])
from scow.plugins.file_journal import FileJournal, JournalSettings
from scripted import apply, during, history

directory, stage, journal_type = sys.argv[1], sys.argv[2], sys.argv[3]
ops = history()
journal = None

def hook(name):
    if name == stage:
        apply(journal, None, during())
        journal.flush()  # acknowledged before the crash: must survive it
        os._exit(0)

journal = FileJournal(JournalSettings(directory=directory, journal_file_size=65536,
                                      journal_type=journal_type,
                                      journal_compact_min_files=0), compaction_hook=hook)
journal.load()
apply(journal, None, ops)
journal.flush()
journal.compact()
os._exit(3)
"""


@pytest.mark.parametrize("stage", COMPACTION_STAGES)
def test_crash_at_each_compaction_stage_recovers_the_same_data(tmp_path: Path, stage: str) -> None:
    _crash_and_check(tmp_path, stage, "NIO")


@pytest.mark.parametrize("stage", ["cmp-written", "control-written", "renaming"])
def test_crash_during_compaction_with_aio(tmp_path: Path, stage: str) -> None:
    _crash_and_check(tmp_path, stage, "AIO")


def _crash_and_check(tmp_path: Path, stage: str, journal_type: str) -> None:
    directory = tmp_path / "journal"
    ops, extra = history(), during()
    proc = run_child(
        CHILD, str(directory), stage, journal_type, json.dumps([str(Path(__file__).parent)])
    )
    assert proc.returncode == 0, f"child did not crash at {stage!r}: {proc.stderr[-2000:]}"

    model = Model()

    class Null:
        def __getattr__(self, _name: str) -> Any:
            return lambda *a, **k: None

    apply(Null(), model, ops + extra)
    model.restart()
    result = load(directory, journal_type)
    assert result.records == model.records()
    assert sorted(t.tx_id for t in result.prepared) == sorted(model.prepared)
    leftovers = [n for n in os.listdir(directory) if n.endswith((".cmp", ".ctr", ".tmp"))]
    assert leftovers == []
    # recovery is complete and stable
    assert load(directory, journal_type).records == model.records()


def test_delete_in_a_transaction_committed_during_compaction_outlives_its_target(
    tmp_path: Path,
) -> None:
    """The copied DELETE_TX must keep the file of the copied record it deletes alive."""
    model = Model()
    j: FileJournal

    def hook(name: str) -> None:
        if name == "cmp-written":
            apply(j, model, [["commit", 1]])

    j = FileJournal(settings(tmp_path, journal_compact_min_files=0), compaction_hook=hook)
    j.load()
    try:
        ops: list[Op] = [["add", i, 1, "v" * 1000] for i in range(1, 101)]
        ops += [["add", i, 2, "dead" * 200] for i in range(1000, 1100)]
        ops += [["delete", i] for i in range(1000, 1100)]
        ops += [["delete_tx", 1, 1]]  # record 1 goes to the first compacted file
        apply(j, model, ops)
        assert j.compact()
        # Kill everything in the last compacted file (where the DELETE_TX copy sits), keep
        # the first one alive, and let reclaim run.
        *compacted, _current = j.data_files()
        assert len(compacted) >= 2
        last = os.path.basename(compacted[-1])
        on_disk = valid_records(tmp_path)
        in_last = {v.record_id for v in on_disk if v.file == last and v.kind == "ADD"}
        assert 1 not in in_last
        assert any(v.kind == "DELETE_TX" and v.file == last for v in on_disk)
        for rid in sorted(in_last & model.live_ids()):
            apply(j, model, [["delete", rid]])
        for rolls in range(2):
            current = j.data_files()[-1]
            n = 0
            while j.data_files()[-1] == current:
                rid = 50_000 + rolls * 1000 + n
                apply(j, model, [["add", rid, 9, "f" * 3000], ["delete", rid]])
                n += 1
        j.reclaim()
    finally:
        j.stop()
    loaded, expected = load(tmp_path).records, model.records()
    assert loaded == expected, describe_difference(loaded, expected)
