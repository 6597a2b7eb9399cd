"""`JournalSettings`: the file journal's configuration, with the Artemis setting names."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .format import ALIGNMENT, DATA_START, HEADER_SIZE

#: Defaults that depend on `journal-type` (NIO, AIO), as in Artemis.
TYPE_DEFAULTS: dict[str, dict[str, int]] = {
    "NIO": {"journal_buffer_timeout": 3_333_333, "journal_max_io": 1},
    "AIO": {"journal_buffer_timeout": 500_000, "journal_max_io": 500},
}
#: Accepted spellings of `journal-type`; Artemis calls AIO "ASYNCIO".
TYPE_ALIASES = {"NIO": "NIO", "AIO": "AIO", "ASYNCIO": "AIO"}


@dataclass(frozen=True, slots=True)
class JournalSettings:
    """Where and how the file journal stores records.

    Field names are the kebab-case setting names with `_` (`journal-file-size` is
    `journal_file_size`). `journal_buffer_timeout` and `journal_max_io` default to None,
    which means the default of the chosen `journal_type`; after construction they always
    hold the value in effect.
    """

    directory: str = "data/journal"
    prefix: str = "scow-data"
    extension: str = "scow"
    #: "NIO" (buffered writes + fdatasync) or "AIO" (O_DIRECT, aligned buffers).
    journal_type: str = "NIO"
    journal_file_size: int = 10_485_760
    journal_min_files: int = 2
    #: Recycled files kept for reuse at most (data + free + spare); -1 keeps them all.
    journal_pool_files: int = -1
    #: Compaction is considered from this many data files on; 0 disables it.
    journal_compact_min_files: int = 10
    #: Compact when live data is below this percentage of the data files.
    journal_compact_percentage: int = 30
    #: When false, prepare/commit/rollback never wait for the disk (overrides `sync`).
    journal_sync_transactional: bool = True
    #: When false, non-transactional records never wait for the disk (overrides `sync`).
    journal_sync_non_transactional: bool = True
    #: fdatasync when true, fsync when false.
    journal_datasync: bool = True
    #: Nanoseconds the writer waits to gather more records into one write + sync.
    journal_buffer_timeout: int | None = None
    #: Bytes gathered before a write starts without waiting for the timeout.
    journal_buffer_size: int = 501_760
    #: Write batches written but not yet synced and completed, at most.
    journal_max_io: int | None = None
    #: Extra keys are refused; kept so `from_mapping` can name them.
    _source: str = field(default="journal settings", repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = TYPE_ALIASES.get(str(self.journal_type).upper())
        if kind is None:
            raise ValueError(
                f"{self._source}: journal-type {self.journal_type!r} is not supported; "
                f"use one of {sorted(TYPE_ALIASES)}"
            )
        object.__setattr__(self, "journal_type", kind)
        for name, default in TYPE_DEFAULTS[kind].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        self._check()

    def _check(self) -> None:
        def fail(name: str, value: Any, accepted: str) -> None:
            raise ValueError(f"{self._source}: {name.replace('_', '-')} = {value!r}; {accepted}")

        size = self.journal_file_size
        if not isinstance(size, int) or size < 2 * DATA_START or size % ALIGNMENT:
            fail(
                "journal_file_size",
                size,
                f"expected a multiple of {ALIGNMENT} of at least {2 * DATA_START}",
            )
        if size >= 1 << 32:
            fail("journal_file_size", size, "expected less than 4 GiB")
        for name, low in (
            ("journal_min_files", 1),
            ("journal_compact_min_files", 0),
            ("journal_buffer_timeout", 0),
            ("journal_buffer_size", HEADER_SIZE),
            ("journal_max_io", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                fail(name, value, f"expected an integer >= {low}")
        pool = self.journal_pool_files
        if not isinstance(pool, int) or isinstance(pool, bool) or (pool < 1 and pool != -1):
            fail("journal_pool_files", pool, "expected -1 (unlimited) or an integer >= 1")
        pct = self.journal_compact_percentage
        if not isinstance(pct, int) or isinstance(pct, bool) or not 0 <= pct <= 100:
            fail("journal_compact_percentage", pct, "expected an integer from 0 to 100")
        for name in (
            "journal_sync_transactional",
            "journal_sync_non_transactional",
            "journal_datasync",
        ):
            if not isinstance(getattr(self, name), bool):
                fail(name, getattr(self, name), "expected true or false")
        for name in ("prefix", "extension"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or "/" in value or "\0" in value:
                fail(name, value, "expected a non-empty name without '/'")

    @classmethod
    def keys(cls) -> list[str]:
        """Every setting name `from_mapping` accepts."""
        return [
            f.name.replace("_", "-")
            for f in dataclasses.fields(cls)
            if f.init and not f.name.startswith("_")
        ]

    @classmethod
    def from_mapping(
        cls, d: Mapping[str, Any], *, source: str = "journal settings"
    ) -> JournalSettings:
        """Settings from kebab-case keys; an unknown key raises ValueError with a suggestion."""
        known = cls.keys()
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {known}"
                raise ValueError(f"{source}: unknown key {key!r}{hint}")
            kwargs[key.replace("-", "_")] = value
        return cls(**kwargs, _source=source)
