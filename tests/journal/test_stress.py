"""Random histories with compactions and reclaims, checked against the model throughout.

At random points the journal is flushed and copied (a crash image) and the copy must load
to exactly what the model holds. Changes are also made from inside the compaction hook,
at a random stage of each compaction. The short run is part of the suite; the long one
is marked slow.
"""

from __future__ import annotations

import copy
import random
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from scow.core.conformance.journal import Model
from scow.plugins.file_journal import COMPACTION_STAGES, FileJournal

from .helpers import load, settings
from .scripted import Op, apply


class RandomHistory:
    """Generates valid operations from the model's current state."""

    def __init__(self, rng: random.Random, model: Model) -> None:
        self.rng = rng
        self.model = model
        self.next_id = 1
        self.next_tx = 1
        self.open: list[int] = []  # transactions with records, not yet decided

    def ops(self) -> list[Op]:
        rng, model = self.rng, self.model
        live = sorted(model.live_ids())
        r = rng.random()
        if r < 0.35 or len(live) < 20:
            self.next_id += 1
            return [["add", self.next_id, 1, "a" * rng.randrange(0, 1500)]]
        if r < 0.45:
            return [["update", rng.choice(live), rng.choice((34, 36)), str(rng.random()), True]]
        if r < 0.5:
            return [["update", rng.choice(live), 32, "ref", False]]
        if r < 0.8:
            return [["delete", rng.choice(live)]]
        if r < 0.9 or not self.open:
            tx = self.next_tx
            self.next_tx += 1
            self.next_id += 1
            ops: list[Op] = [["add_tx", tx, self.next_id, 2, "t" * rng.randrange(0, 500)]]
            taken = set()
            for _ in range(rng.randrange(0, 3)):
                victim = rng.choice(live)
                if victim in taken:
                    continue
                taken.add(victim)
                if rng.random() < 0.5:
                    ops.append(["delete_tx", tx, victim])
                else:
                    ops.append(["update_tx", tx, victim, 33, "tx-upd"])
            if rng.random() < 0.3:
                ops.append(["prepare", tx, f"xid-{tx}"])
            self.open.append(tx)
            return ops
        tx = self.open.pop(rng.randrange(len(self.open)))
        return [["commit" if rng.random() < 0.7 else "rollback", tx]]


def check_image(j: FileJournal, model: Model, scratch: Path) -> None:
    """A flushed copy of the live journal must load to the model (open txs dropped)."""
    j.flush()
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(j.directory, scratch, ignore=shutil.ignore_patterns("*.tmp"))
    expected = copy.deepcopy(model)
    expected.restart()
    result = load(scratch, j.settings.journal_type)
    assert result.records == expected.records()
    assert sorted(t.tx_id for t in result.prepared) == sorted(expected.prepared)
    shutil.rmtree(scratch)


def run(tmp_path: Path, seed: int, steps: int, journal_type: str) -> None:
    rng = random.Random(seed)
    model = Model()
    history = RandomHistory(rng, model)
    main = threading.current_thread()
    j: FileJournal
    plan: dict[str, Any] = {"stage": None}

    def hook(stage: str) -> None:
        # Only the compactions this thread runs: the maintenance thread's own compactions
        # must not touch the model behind this thread's back.
        if threading.current_thread() is main and stage == plan["stage"]:
            for _ in range(rng.randrange(1, 20)):
                apply(j, model, history.ops())

    j = FileJournal(
        settings(
            tmp_path / "journal",
            journal_type,
            journal_compact_min_files=4,
            journal_compact_percentage=40,
        ),
        compaction_hook=hook,
    )
    j.load()
    try:
        for step in range(steps):
            apply(j, model, history.ops())
            if step % 500 == 499:
                plan["stage"] = rng.choice(COMPACTION_STAGES)
                j.compact()
            if step % 700 == 350:
                j.reclaim()
            if step % 900 == 600:
                check_image(j, model, tmp_path / "image")
        check_image(j, model, tmp_path / "image")
        # restart in the middle of it all, then go on
        j.stop()
        model.restart()
        history.open = [tx for tx in history.open if tx in model.prepared]
        j = FileJournal(settings(tmp_path / "journal", journal_type), compaction_hook=hook)
        result = j.load()
        assert result.records == model.records()
        for _ in range(steps // 4):
            apply(j, model, history.ops())
        plan["stage"] = rng.choice(COMPACTION_STAGES)
        j.compact()
        check_image(j, model, tmp_path / "image")
    finally:
        j.stop()


@pytest.mark.parametrize("journal_type", ["NIO", "AIO"])
def test_random_history_with_compactions_matches_the_model(
    tmp_path: Path, journal_type: str
) -> None:
    run(tmp_path, seed=11, steps=3000, journal_type=journal_type)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("journal_type", ["NIO", "AIO"])
def test_long_random_histories(tmp_path: Path, seed: int, journal_type: str) -> None:
    run(tmp_path, seed=seed, steps=12000, journal_type=journal_type)
