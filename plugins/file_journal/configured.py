"""`scow data print|export|import --config F`: the storage a broker's config selects.

They open the journal, page store and stream store the config selects (`[broker]
journal`, `[paging] store`, `[spark] stream-store`), whichever plugin provides them, so
`scow data export` from a broker on files and `scow data import --config db.toml` move it
into a database, and back the other way.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from scow.core import app
from scow.core.config import Config
from scow.core.data_lock import offline
from scow.core.descriptors import JournalBackend
from scow.core.duplicates import describe_id
from scow.core.export import OpenStream, export, import_
from scow.core.interfaces import PageStore
from scow.core.large_message_files import configured_store
from scow.core.large_messages import LargeMessageStore
from scow.core.plugins import PluginError, PluginManager
from scow.core.storage import Recovered, StorageManager
from scow.core.unfinished_import import all_or_nothing, check_finished, stopping
from scow.plugins.paging import tools as page_tools


def _load(args: argparse.Namespace) -> tuple[PluginManager, Config]:
    """The plugins and config of `--config`, with `--data-dir` over its data-dir."""
    overrides: dict[str, dict[str, object]] = {"broker": {}}
    if args.data_dir is not None:
        overrides["broker"]["data-dir"] = str(args.data_dir)
    return app.load(args.config, overrides)


def _journals(plugins: PluginManager) -> dict[str, JournalBackend]:
    try:
        return plugins.unique("scow_register_journals", "journal backend")
    except PluginError as exc:
        raise app.StartupError(str(exc)) from exc


@contextlib.contextmanager
def _opened(args: argparse.Namespace) -> Iterator[tuple[PluginManager, Config, StorageManager]]:
    """The storage the config selects, for reading."""
    plugins, config = _load(args)
    storage = app.open_storage(_journals(plugins), config)
    try:
        yield plugins, config, storage
    finally:
        storage.stop()


def _page_stores(plugins: PluginManager, config: Config) -> Iterator[PageStore] | None:
    """The configured page store's stores, or None without paging."""
    if "paging" not in config.section_names:
        return None
    paging = config.section("paging")
    backend = plugins.unique("scow_register_page_stores", "page store").get(str(paging["store"]))
    if backend is None:
        return None
    data_dir = Path(str(config.section("broker")["data-dir"]))
    directory = data_dir / str(paging["paging-directory"])
    section = backend.config_section
    settings = {**(config.section(section) if section else {}), "data-dir": str(data_dir)}

    def stores() -> Iterator[PageStore]:
        for address in backend.discover(directory, settings):
            yield backend.factory(directory, address, settings)

    return stores()


def _stream_opener(plugins: PluginManager, config: Config) -> OpenStream | None:
    """What builds the stores of the streams, on the stream store the config selects;
    None without the spark plugin (no streams)."""
    stores = plugins.unique("scow_register_stream_stores", "stream store")
    if not stores:
        return None
    from scow.plugins.spark.plugin import stream_store_opener

    try:
        return stream_store_opener(stores, config)
    except ValueError as exc:
        raise app.StartupError(str(exc)) from None


def _data_dir(config: Config) -> Path:
    return Path(str(config.section("broker")["data-dir"]))


def cmd_print(args: argparse.Namespace) -> int:
    with _opened(args) as (plugins, config, storage):
        recovered = storage.load()
        print(f"# {config.section('broker')['journal'] or 'journal'}: {_counts(recovered)}")
        for address in recovered.addresses:
            print(f"address {address['name']!r} id={address['id']}")
        for queue in recovered.queues:
            print(f"queue {queue['name']!r} on {queue['address']!r} id={queue['id']}")
        for message in recovered.messages:
            print(f"message {message.id} to {message.address!r} queues={message.queues}")
            if args.bodies:
                print(f"    {message.data!r}")
        for line in page_tools.describe(
            _data_dir(config), recovered, _page_stores(plugins, config)
        ):
            print(line)
        for line in describe_duplicate_ids(recovered):
            print(line)
    return 0


def describe_duplicate_ids(recovered: Recovered) -> Iterator[str]:
    """How many duplicate ids each address's records hold (a record an earlier version
    left partly pushed out of its cache counts whole: the broker drops those ids at its
    start), and the newest."""
    by_address: dict[str, list[bytes]] = {}
    for rec in recovered.duplicate_ids:
        by_address.setdefault(rec.address, []).append(rec.key)
    if by_address:
        yield "# duplicate-id caches"
    for address, keys in by_address.items():
        yield f"address {address!r}: {len(keys)} ids, newest {describe_id(keys[-1])}"


def _counts(recovered: Recovered) -> str:
    return (
        f"{len(recovered.addresses)} addresses, {len(recovered.queues)} queues, "
        f"{len(recovered.messages)} messages in the journal, "
        f"{len(recovered.prepared)} prepared transactions, "
        f"{len(recovered.duplicate_ids)} duplicate ids"
    )


@contextlib.contextmanager
def _large_messages(plugins: PluginManager, config: Config) -> Iterator[LargeMessageStore]:
    """The store of the broker's large message bodies the config selects, open."""
    backends = plugins.unique("scow_register_large_message_stores", "large message store")
    journals = plugins.unique("scow_register_journals", "journal backend")
    store = configured_store(
        backends, config, app.journal_backend(journals, config)[0], persistent=True
    )
    try:
        store.open()
    except Exception as exc:
        raise app.StartupError(f"large message store: {exc}") from exc
    try:
        yield store
    finally:
        store.close()


def cmd_export(args: argparse.Namespace) -> int:
    with _opened(args) as (plugins, config, storage):
        # half an import is no broker's data
        check_finished(_data_dir(config), app.journal_backend(_journals(plugins), config)[0])
        stores = _page_stores(plugins, config)
        with (
            _large_messages(plugins, config) as large,
            open(args.output, "w", encoding="utf-8") as out,
        ):
            counts = export(
                storage,
                out,
                lambda r: page_tools.paged_messages(_data_dir(config), r, stores),
                _stream_opener(plugins, config),
                large_messages=large,
            )
    print(f"exported {counts} to {args.output}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Import into the storage the config selects, all or nothing (the data dir's lock
    held meanwhile: a running broker refuses the command)."""
    plugins, config = _load(args)
    data_dir = _data_dir(config)
    journal = app.journal_backend(_journals(plugins), config)[0]
    with (
        offline(data_dir),
        all_or_nothing(data_dir, journal, args.input, lambda: _discard(plugins, config)) as begin,
    ):
        storage = app.open_storage(_journals(plugins), config)
        with (
            stopping(storage.stop),
            _large_messages(plugins, config) as large,
            open(args.input, encoding="utf-8") as f,
        ):
            # paged messages go to the journal: the broker pages them again if needed
            counts = import_(
                storage,
                f,
                open_stream=_stream_opener(plugins, config),
                large_messages=large,
                begin=begin,
            )
    print(f"imported {counts}")
    return 0


def _discard(plugins: PluginManager, config: Config) -> None:
    """Empty the storage the config selects (a failed import's undo): the journals' store
    (a database's every table), the streams' store and the large message bodies."""
    data_dir = _data_dir(config)
    journal = app.journal_backend(_journals(plugins), config)[1]
    discards = [(journal.discard, _backend_settings(config, journal.config_section))]
    streams = plugins.unique("scow_register_stream_stores", "stream store")
    if streams:
        from scow.plugins.spark.plugin import stream_store_backend

        backend, settings = stream_store_backend(streams, config)
        discards.append((backend.discard, settings))
    done: set[Callable[[Path, Mapping[str, Any]], None]] = set()
    for discard, settings in discards:
        if discard is not None and discard not in done:
            discard(data_dir, settings)
            done.add(discard)
    with _large_messages(plugins, config) as large:
        large.delete_all()


def _backend_settings(config: Config, section: str | None) -> Mapping[str, Any]:
    """A backend's own config section, or nothing."""
    return config.section(section) if section in config.section_names else {}
