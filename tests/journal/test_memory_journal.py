"""The in-memory journal passes the same conformance suite as the file journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from scow.core.conformance.journal import JournalConformance
from scow.plugins.memory_journal import MemoryJournal


class TestMemoryJournalConformance(JournalConformance):
    @pytest.fixture
    def make_journal(self):
        # no disk: a journal "reopened" on the same path is the same object, as a process
        # that never restarted would see it
        journals: dict[Path, MemoryJournal] = {}
        return lambda path: journals.setdefault(path, MemoryJournal())
