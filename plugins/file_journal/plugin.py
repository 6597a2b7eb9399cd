"""The file journal plugin: `[journal]` settings, the `file` backend and `scow data` tools."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from scow.core import hookimpl
from scow.core.config import ConfigSection, Setting
from scow.core.descriptors import JournalBackend
from scow.plugins.file_journal.files import fsync_dir
from scow.plugins.file_journal.journal import FileJournal
from scow.plugins.file_journal.settings import JournalSettings

log = structlog.get_logger("scow.journal")

#: The bindings journal is small and low-traffic: always NIO, small files (as in Artemis).
BINDINGS_FILE_SIZE = 1_048_576

SECTION = ConfigSection(
    "journal",
    (
        Setting(
            "journal-directory",
            str,
            "journal",
            "Message journal directory; relative paths are under [broker] data-dir.",
        ),
        Setting(
            "bindings-directory",
            str,
            "bindings",
            "Bindings journal directory (addresses, queues, ids); relative to data-dir.",
        ),
        Setting("create-journal-dir", bool, True, "Create journal-directory when missing."),
        Setting("create-bindings-dir", bool, True, "Create bindings-directory when missing."),
        Setting(
            "journal-type",
            str,
            "NIO",
            "NIO (buffered writes + fdatasync) or AIO (O_DIRECT, aligned buffers; falls back "
            "to NIO with a log line where the file system refuses O_DIRECT).",
            choices=("NIO", "AIO", "ASYNCIO"),
        ),
        Setting("journal-file-size", int, 10_485_760, "Size of each journal file.", kind="size"),
        Setting("journal-min-files", int, 2, "Files created up front.", minimum=1),
        Setting(
            "journal-pool-files",
            int,
            -1,
            "Reclaimed files kept for reuse; -1 keeps them all, the rest are deleted.",
            minimum=-1,
        ),
        Setting(
            "journal-max-io",
            int,
            0,
            "Write batches in flight at once; 0 means the type's default (NIO 1, AIO 500).",
            minimum=0,
        ),
        Setting(
            "journal-buffer-timeout",
            int,
            0,
            "Nanoseconds records wait to share one write and sync; 0 means the type's "
            "default (NIO 3333333, AIO 500000). `scow perf journal` suggests a value.",
            minimum=0,
        ),
        Setting(
            "journal-buffer-size",
            int,
            501_760,
            "Bytes gathered before a write starts without waiting for the timeout.",
            kind="size",
        ),
        Setting(
            "journal-compact-min-files",
            int,
            10,
            "Data files needed before compaction is considered; 0 disables compaction.",
            minimum=0,
        ),
        Setting(
            "journal-compact-percentage",
            int,
            30,
            "Compact when live data is below this percentage of the data files.",
            minimum=0,
        ),
        Setting(
            "journal-sync-transactional",
            bool,
            True,
            "Wait for the disk at prepare, commit and rollback.",
        ),
        Setting(
            "journal-sync-non-transactional",
            bool,
            True,
            "Wait for the disk before confirming non-transactional sends and acks.",
        ),
        Setting("journal-datasync", bool, True, "fdatasync (true) or fsync (false)."),
    ),
    "The file journal (plugin file-journal).",
)


def journal_settings(data_dir: Path, kind: str, config: Mapping[str, Any]) -> JournalSettings:
    """JournalSettings for the bindings or message journal from the `[journal]` section."""
    section = {s.name: s.default for s in SECTION.settings} | dict(config)
    bindings = kind == "bindings"
    directory = Path(section["bindings-directory" if bindings else "journal-directory"])
    if not directory.is_absolute():
        directory = data_dir / directory
    create = section["create-bindings-dir" if bindings else "create-journal-dir"]
    if not directory.exists():
        if not create:
            raise ValueError(
                f"journal directory {directory} does not exist and "
                f"{'create-bindings-dir' if bindings else 'create-journal-dir'} is false"
            )
        directory.mkdir(parents=True, exist_ok=True)
    return JournalSettings(
        directory=str(directory),
        prefix="scow-bindings" if bindings else "scow-data",
        extension="bindings" if bindings else "scow",
        journal_type="NIO" if bindings else section["journal-type"],
        journal_file_size=BINDINGS_FILE_SIZE if bindings else section["journal-file-size"],
        journal_min_files=section["journal-min-files"],
        journal_pool_files=section["journal-pool-files"],
        journal_compact_min_files=section["journal-compact-min-files"],
        journal_compact_percentage=section["journal-compact-percentage"],
        journal_sync_transactional=section["journal-sync-transactional"],
        journal_sync_non_transactional=section["journal-sync-non-transactional"],
        journal_datasync=section["journal-datasync"],
        journal_buffer_timeout=section["journal-buffer-timeout"] or None,
        journal_buffer_size=section["journal-buffer-size"],
        journal_max_io=section["journal-max-io"] or None,
    )


def _factory(data_dir: Path, kind: str, config: Mapping[str, Any]) -> FileJournal:
    return FileJournal(journal_settings(data_dir, kind, config))


def discard(data_dir: Path, config: Mapping[str, Any]) -> None:
    """Remove both journals' files (their spares and compaction files too), leaving any
    other file in their directories."""
    for kind in ("bindings", "messages"):
        settings = journal_settings(data_dir, kind, config)
        directory = Path(settings.directory)
        for path in directory.glob(f"{settings.prefix}-*"):
            path.unlink()
        fsync_dir(str(directory))


@hookimpl
def scow_config_sections() -> list[ConfigSection]:
    return [SECTION]


@hookimpl
def scow_register_journals() -> list[JournalBackend]:
    return [
        JournalBackend(
            "file",
            _factory,
            "append-only journal files with CRCs, group commit, reclaim and compaction",
            config_section=SECTION.name,
            discard=discard,
        )
    ]


@hookimpl
def scow_add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from scow.plugins.file_journal import commands

    commands.add_commands(subparsers)
