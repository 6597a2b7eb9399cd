"""`scow data print|export|import|compact` and `scow perf journal`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from scow.core import app
from scow.core.cli import command_group
from scow.core.data_lock import DataDirLocked, offline
from scow.core.export import ExportError, OpenStream, export, import_
from scow.core.large_message_files import FileLargeMessageStore
from scow.core.large_messages import DEFAULT_DIRECTORY as LARGE_MESSAGES_DIRECTORY
from scow.core.storage import (
    ACK_REF,
    ADDRESS,
    CURSOR_ACK,
    CURSOR_COUNT,
    CURSOR_PAGE,
    DELIVERY_COUNT,
    DUPLICATE_ID,
    DUPLICATE_IDS,
    DUPLICATE_KEYS,
    ID_BLOCK,
    LARGE_MESSAGE,
    MESSAGE,
    PACKED_ROWS,
    PAGE_TX,
    QUEUE,
    StorageManager,
)
from scow.core.unfinished_import import (
    ImportUndone,
    UnfinishedImport,
    all_or_nothing,
    check_finished,
    stopping,
)
from scow.plugins.file_journal import configured
from scow.plugins.file_journal.journal import FileJournal
from scow.plugins.file_journal.plugin import discard as discard_journals
from scow.plugins.file_journal.plugin import journal_settings
from scow.plugins.file_journal.tools import compact_offline, iter_records, measure_sync_rate
from scow.plugins.paging import tools as page_tools

Handler = Callable[[argparse.Namespace], int]
#: The journal `--data-dir` works on (the file journal backend's name).
FILES = "file"

RECORD_TYPES = {
    MESSAGE: "MESSAGE",
    LARGE_MESSAGE: "LARGE_MESSAGE",
    PACKED_ROWS: "PACKED_ROWS",
    ACK_REF: "ACK_REF",
    DELIVERY_COUNT: "DELIVERY_COUNT",
    ADDRESS: "ADDRESS",
    QUEUE: "QUEUE",
    ID_BLOCK: "ID_BLOCK",
    CURSOR_PAGE: "CURSOR_PAGE",
    CURSOR_ACK: "CURSOR_ACK",
    CURSOR_COUNT: "CURSOR_COUNT",
    PAGE_TX: "PAGE_TX",
    DUPLICATE_ID: "DUPLICATE_ID",
    DUPLICATE_IDS: "DUPLICATE_IDS",
    DUPLICATE_KEYS: "DUPLICATE_KEYS",
}


def _data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="default: ./data")


def _configurable(parser: argparse.ArgumentParser, files: Handler, configured: Handler) -> None:
    """`--data-dir` reads the file journal there; `--config F` opens the storage F selects
    (any journal and page store plugin, e.g. the database store)."""
    parser.add_argument("--data-dir", type=Path, help="default: ./data, or [broker] data-dir")
    parser.add_argument("--config", type=Path, help="use the journal and page store F selects")

    def run(args: argparse.Namespace) -> int:
        try:
            if args.config is not None:
                return configured(args)
            args.data_dir = args.data_dir or Path("data")
            return files(args)
        except (app.StartupError, DataDirLocked, UnfinishedImport) as exc:
            print(f"scow: {exc}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            raise  # our reader went away (`scow data print | head`): the CLI ends quietly
        # a bad or unreadable import file, or a write its target refused
        except (ExportError, ImportUndone, ValueError, OSError) as exc:
            print(f"scow: {getattr(args, 'input', None) or 'data'}: {exc}", file=sys.stderr)
            return 2

    parser.set_defaults(handler=run)


def _storage(data_dir: Path) -> StorageManager:
    return StorageManager(
        FileJournal(journal_settings(data_dir, "bindings", {})),
        FileJournal(journal_settings(data_dir, "messages", {})),
    )


def cmd_print(args: argparse.Namespace) -> int:
    for kind in ("bindings", "messages"):
        settings = journal_settings(args.data_dir, kind, {})
        print(f"# {kind} journal: {settings.directory}")
        for rec in iter_records(settings.directory, settings.prefix, settings.extension):
            rtype = RECORD_TYPES.get(rec.record_type, str(rec.record_type))
            state = "ok" if rec.valid else f"INVALID ({rec.reason})"
            print(
                f"{rec.file}@{rec.offset} {rec.kind} id={rec.record_id} type={rtype} "
                f"tx={rec.tx_id} len={rec.data_length} epoch={rec.epoch} {state}"
            )
    storage = _storage(args.data_dir)
    try:
        recovered = storage.load()
    finally:
        storage.stop()
    for line in page_tools.describe(args.data_dir, recovered):
        print(line)
    for line in configured.describe_duplicate_ids(recovered):
        print(line)
    if args.bodies:
        print("# live messages")
        for message in recovered.messages:
            print(f"message {message.id} to {message.address!r} queues={message.queues}")
            print(f"    {message.data!r}")
    return 0


def _file_streams(data_dir: Path) -> OpenStream:
    """What builds the stores of a data dir's streams: segment files (spark's file store)."""
    from scow.plugins.spark import segments
    from scow.plugins.spark.plugin import opener

    return opener(segments.BACKEND, data_dir, {})


def cmd_export(args: argparse.Namespace) -> int:
    check_finished(args.data_dir, FILES)  # half an import is no broker's data
    storage = _storage(args.data_dir)
    try:
        with open(args.output, "w", encoding="utf-8") as out:
            counts = export(
                storage,
                out,
                lambda r: page_tools.paged_messages(args.data_dir, r),
                _file_streams(args.data_dir),
                large_messages=_large_messages(args.data_dir),
            )
    finally:
        storage.stop()
    print(f"exported {counts} to {args.output}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Import into the files of a data dir, all or nothing (its lock held meanwhile)."""
    data_dir = args.data_dir
    with (
        offline(data_dir),
        all_or_nothing(data_dir, FILES, args.input, lambda: _discard(data_dir)) as begin,
    ):
        storage = _storage(data_dir)
        pages = page_tools.PageImporter(data_dir, storage)
        with (
            stopping(pages.close, storage.stop),
            open(args.input, encoding="utf-8") as source,
        ):
            counts = import_(
                storage,
                source,
                pages.add,
                _file_streams(data_dir),
                large_messages=_large_messages(data_dir),
                begin=begin,
            )
    print(f"imported {counts} into {data_dir}")
    return 0


def _large_messages(data_dir: Path) -> FileLargeMessageStore:
    return FileLargeMessageStore(data_dir / LARGE_MESSAGES_DIRECTORY, sync=True)


def _discard(data_dir: Path) -> None:
    """Remove the journals, pages, large message bodies and streams of a data dir (a
    failed import's undo)."""
    from scow.plugins.spark import segments

    discard_journals(data_dir, {})
    page_tools.discard(data_dir)
    _large_messages(data_dir).delete_all()
    segments.discard(data_dir, {})


def cmd_compact(args: argparse.Namespace) -> int:
    try:
        with offline(args.data_dir):
            for kind in ("bindings", "messages"):
                settings = journal_settings(args.data_dir, kind, {})
                result = compact_offline(settings.directory, dataclasses.replace(settings))
                print(f"{kind}: {result}")
    except DataDirLocked as exc:
        print(f"scow: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_perf_journal(args: argparse.Namespace) -> int:
    directory = args.data_dir / "journal"
    rate, timeout_ns = measure_sync_rate(str(directory), args.seconds)
    print(f"syncs per second on {directory}: {rate:,.0f}")
    print(f"suggested journal-buffer-timeout = {timeout_ns}  # ns, one sync per timeout")
    print("(put it in the [journal] section; scow run otherwise uses the journal-type default:")
    print(" NIO 3333333 ns, AIO 500000 ns)")
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    data = command_group(subparsers, "data", "inspect, export, import and compact a data dir")
    p = data.add_parser("print", help="list every journal record (broker stopped)")
    _configurable(p, cmd_print, configured.cmd_print)
    p.add_argument("--bodies", action="store_true", help="also print live message bodies")
    p = data.add_parser("export", help="write topology and messages to a portable file")
    _configurable(p, cmd_export, configured.cmd_export)
    p.add_argument("--output", required=True, type=Path)
    p = data.add_parser("import", help="load an export into empty storage")
    _configurable(p, cmd_import, configured.cmd_import)
    p.add_argument("--input", required=True, type=Path)
    p = data.add_parser("compact", help="compact the journals (broker stopped)")
    _data_dir(p)
    p.set_defaults(handler=cmd_compact)

    perf = command_group(subparsers, "perf", "load generators and measurements")
    p = perf.add_parser("journal", help="measure the disk's sync rate for journal settings")
    _data_dir(p)
    p.add_argument("--seconds", type=float, default=3.0)
    p.set_defaults(handler=cmd_perf_journal)
