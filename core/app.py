"""Assembling a broker from config and plugins, and running it."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import gc
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from scow.core import critical, hookimpl, systemd
from scow.core import logging as scow_logging
from scow.core.address_settings import ADDRESS_FULL_POLICIES
from scow.core.broker import Broker
from scow.core.config import (
    QUEUES_SECTION,
    Config,
    ConfigError,
    load_config,
    parse_host_port,
    read_plugin_list,
)
from scow.core.data_lock import DataDirLock, DataDirLocked
from scow.core.descriptors import JournalBackend
from scow.core.disk_monitor import DiskMonitor
from scow.core.ha import FileStoreLock, HaMember, StoreLock
from scow.core.interfaces import Completion, Journal, ProtocolServer, Service
from scow.core.large_message_files import configured_store
from scow.core.memory_trim import MemoryTrimmer
from scow.core.model import BrokerError, ConnectionInfo, MemoryLimits, host_port
from scow.core.plugins import PluginError, PluginManager
from scow.core.selector import compile_selector
from scow.core.storage import StorageManager
from scow.core.unfinished_import import UnfinishedImport, check_finished

log = structlog.get_logger("scow")

#: Allocations between young-generation collections (CPython's default is 700).
GC_THRESHOLD = 50_000
#: Seconds a thread running Python may keep the GIL while another waits (CPython's
#: default is 0.005). The loop's work releases the GIL at every proton call and socket
#: write; behind a busy helper thread (a stream's selector scan, a page read, an export)
#: each release cost it up to a whole interval, and a management reply, some hundred
#: releases, waited 0.1 s.
SWITCH_INTERVAL = 0.001
#: Seconds a broker stepping down (HA) waits for its store to close before it restarts.
STEP_DOWN_TIMEOUT = 10
#: Seconds into a stop after which the log says storage is what it waits for.
STOP_NOTICE = 5.0
#: `scow run`'s status when a second signal ends it before storage has written all.
EXIT_FORCED_STOP = 1


class StartupError(Exception):
    """The broker cannot start; the message says why and what would be accepted."""


def load(
    config_path: Path | None, overrides: Mapping[str, Mapping[str, object]] | None = None
) -> tuple[PluginManager, Config]:
    """Load the enabled plugins, then the config validated against their sections."""
    try:
        plugins = PluginManager()
        plugins.load(read_plugin_list(config_path))
        sections = plugins.collect("scow_config_sections")
        config = load_config(config_path, sections, _only_known(overrides, sections))
    except ConfigError as exc:
        raise StartupError(str(exc)) from exc
    except PluginError as exc:
        raise StartupError(f"{config_path or 'default config'}: {exc}") from exc
    return plugins, config


def _only_known(
    overrides: Mapping[str, Mapping[str, object]] | None, sections: list[Any]
) -> dict[str, dict[str, object]] | None:
    """Drop overrides aimed at plugin sections that are not loaded (e.g. --listen)."""
    if overrides is None:
        return None
    known = {s.name for s in sections} | {"broker", "plugins", "security"}
    return {k: dict(v) for k, v in overrides.items() if k in known}


def _run_all(completions: list[Completion]) -> None:
    for completion in completions:
        completion()


class _Backlog:
    """Tells the broker's limits that a journal fell behind its disk (producers get no
    more credit) or caught up. A journal falls behind as the event loop appends to it:
    then at once, since the loop may go on reading one producer's socket for many
    messages before it runs a callback, and on a fast link that is megabytes. It catches
    up on its own threads: then through the loop, where a change that a later one
    overtook (made at once) is dropped."""

    __slots__ = ("changes", "limits", "loop", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: MemoryLimits) -> None:
        self.loop, self.limits = loop, limits
        self.thread = threading.get_ident()
        self.changes: dict[str, int] = {}  # per reason: how many changes it had

    def __call__(self, reason: str, hold: bool) -> None:
        change = self.changes[reason] = self.changes.get(reason, 0) + 1
        if threading.get_ident() == self.thread:
            self._apply(reason, hold, change)
        else:
            self.loop.call_soon_threadsafe(self._apply, reason, hold, change)

    def _apply(self, reason: str, hold: bool, change: int) -> None:
        if self.changes[reason] == change:  # the last one
            (self.limits.block if hold else self.limits.unblock)(reason)


class _ConnectionRegistry:
    """Keeps `Broker.connections` from the connection hooks every protocol calls."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @hookimpl
    def scow_connection_opened(self, info: ConnectionInfo) -> None:
        self.broker.connections[info.id] = info

    @hookimpl
    def scow_connection_closed(self, info: ConnectionInfo) -> None:
        self.broker.connections.pop(info.id, None)


class Server:
    """A broker with its storage, services and protocol listeners."""

    def __init__(self, plugins: PluginManager, config: Config) -> None:
        self.plugins = plugins
        self.config = config
        self.broker: Broker | None = None
        self.protocols: dict[str, ProtocolServer] = {}
        self.services: list[Service] = []
        #: Held from start to stop: journal, pages and streams under the data dir are ours.
        self.data_lock = DataDirLock(Path(str(config.section("broker")["data-dir"])))
        self._stopped = asyncio.Event()
        try:
            self.queue_types = plugins.unique("scow_register_queue_types", "queue type")
            self.journals = plugins.unique("scow_register_journals", "journal backend")
            self.full_policies = plugins.unique("scow_register_full_policies", "full policy")
            self.page_stores = plugins.unique("scow_register_page_stores", "page store")
            self.stream_stores = plugins.unique("scow_register_stream_stores", "stream store")
            self.large_message_stores = plugins.unique(
                "scow_register_large_message_stores", "large message store"
            )
            self.protocol_types = plugins.unique("scow_register_protocols", "protocol")
        except PluginError as exc:
            raise StartupError(str(exc)) from exc
        if "standard" not in self.queue_types:
            raise StartupError(
                "no plugin provides the 'standard' queue type; enable 'standard-queues'"
            )
        self._check_full_policies()
        #: This broker's part in an HA pair ([ha] policy), or None.
        self.ha = self._ha_member()
        plugins.hook.scow_configure(config=config)

    def _ha_member(self) -> HaMember | None:
        settings = self.config.section("ha")
        if not settings["policy"]:
            return None
        broker_cfg = self.config.section("broker")
        if not broker_cfg["persistence-enabled"]:
            raise StartupError(
                f"[ha] policy = {settings['policy']!r} needs a store to share: "
                "[broker] persistence-enabled = false keeps nothing"
            )
        name, backend = journal_backend(self.journals, self.config)
        lock: StoreLock
        if backend.store_lock is not None:
            section = backend.config_section
            options = self.config.section(section) if section in self.config.section_names else {}
            try:
                lock = backend.store_lock(self.data_lock.data_dir, options)
            except Exception as exc:  # the backend's settings refused (a bad URL, ...)
                raise StartupError(f"[ha] policy = {settings['policy']!r}: {exc}") from exc
        elif not backend.persistent:
            raise StartupError(
                f"[ha] policy = {settings['policy']!r}: [broker] journal = {name!r} keeps "
                "nothing a backup could take over; use the file or the database journal"
            )
        else:
            lock = FileStoreLock(self.data_lock.data_dir, self.data_lock)
        return HaMember(settings, lock, str(broker_cfg["name"]), self._own_url(settings))

    def _own_url(self, settings: Mapping[str, Any]) -> str:
        """The AMQP URL this broker announces to its HA peer (clients fail over to it)."""
        if settings["url"]:
            return str(settings["url"])
        if "amqp" not in self.config.section_names:
            return ""
        listen = list(self.config.section("amqp")["listen"])
        if not listen:
            return ""
        host, port = parse_host_port(str(listen[0]))
        if host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()
        return f"amqp://{host_port(host, port)}"

    def _check_full_policies(self) -> None:
        """A limit needs its address-full-policy provided by an enabled plugin.

        An address's own max-size-bytes / max-size-messages, or an explicitly configured
        global-max-size / global-max-messages, refuse startup without it; the derived
        global-max-size only warns (it bounds what it can).
        """
        broker_cfg = self.config.section("broker")
        explicit_global = (
            broker_cfg["global-max-size"] != -1 or broker_cfg["global-max-messages"] != -1
        )
        for pattern in ["#", *self.config.address_settings.patterns()]:
            settings = self.config.address_settings.get(pattern)
            policy = settings.address_full_policy
            if policy in self.full_policies:
                continue
            if policy not in ADDRESS_FULL_POLICIES:  # not even a built-in name: a typo
                known = sorted({*ADDRESS_FULL_POLICIES, *self.full_policies})
                close = difflib.get_close_matches(policy, known, n=1)
                raise StartupError(
                    f'[address-settings."{pattern}"] address-full-policy = "{policy}": no '
                    f"enabled plugin provides it (known: {', '.join(known)})"
                    + (f"; did you mean '{close[0]}'?" if close else "")
                )
            limited = settings.max_size_bytes >= 0 or settings.max_size_messages >= 0
            provider = "; enable the 'paging' plugin" if policy == "PAGE" else ""
            available = ", ".join(sorted(self.full_policies)) or "none"
            if limited or explicit_global:
                limit = "a size limit" if limited else "global-max-size / global-max-messages"
                raise StartupError(
                    f'[address-settings."{pattern}"] address-full-policy = "{policy}" with '
                    f"{limit} needs a plugin that provides it{provider} "
                    f"(available: {available})"
                )
            if pattern == "#":
                log.warning(
                    "global-max-size does not bound addresses whose full policy is not enabled",
                    address_full_policy=policy,
                    hint=provider.lstrip("; ") or f"available: {available}",
                )

    def _storage(self) -> StorageManager:
        return open_storage(self.journals, self.config)

    async def start(
        self, stop: asyncio.Event | None = None, waiting: Callable[[], None] | None = None
    ) -> Broker | None:
        """Lock the store, recover and serve. An HA member first waits until the store is
        its to take (calling `waiting` if it is not free at once); it returns None if
        `stop` is set meanwhile."""
        ha = self.ha
        shared_data_dir = ha is not None and ha.lock.__class__ is FileStoreLock
        try:
            if not shared_data_dir:
                self.data_lock.acquire()
        except DataDirLocked as exc:
            raise StartupError(f"{exc}, or give this broker its own [broker] data-dir") from None
        except OSError as exc:  # a read-only volume, a file in the way, no permission
            raise StartupError(
                f"data dir {self.data_lock.data_dir} cannot be used: "
                f"{exc.strerror or exc} ({exc.filename or self.data_lock.path}); "
                "[broker] data-dir (or --data-dir) must be a directory this user can write"
            ) from None
        try:
            if self.config.section("broker")["persistence-enabled"]:
                journal = journal_backend(self.journals, self.config)[0]
                check_finished(self.data_lock.data_dir, journal)
        except (UnfinishedImport, StartupError) as exc:
            self._release_locks()
            raise StartupError(str(exc)) from None
        try:
            if ha is not None and not await ha.wait_for_store(stop or asyncio.Event(), waiting):
                self._release_locks()
                return None
            broker = await self._start()
            if ha is not None:
                self._announce_bound_url(ha)
                broker.ha = ha
                broker.stats_sections["ha"] = ha.status
                await ha.serving()
            return broker
        except BaseException:
            self._release_locks()
            raise

    def _announce_bound_url(self, ha: HaMember) -> None:
        """An announced URL with port 0 gets the port the AMQP listener was given."""
        server: Any = self.protocols.get("amqp")
        if ha.url.endswith(":0") and server is not None and server.bound:
            ha.url = f"{ha.url[: -len(':0')]}:{server.bound[0][1]}"

    def _release_locks(self) -> None:
        if self.ha is not None:
            self.ha.lock.release()
        self.data_lock.release()

    async def _start(self) -> Broker:
        loop = asyncio.get_running_loop()
        storage = self._storage()
        storage.set_dispatcher(lambda batch: loop.call_soon_threadsafe(_run_all, batch))
        try:
            recovered = await loop.run_in_executor(None, storage.load)
        except Exception as exc:
            await loop.run_in_executor(None, storage.stop)
            journal = self.config.section("broker")["journal"]
            raise StartupError(f"[broker] journal = {journal!r}: recovery failed: {exc}") from exc
        persistent = bool(storage.journals)
        journal = journal_backend(self.journals, self.config)[0] if persistent else ""
        broker = Broker(
            self.config,
            storage,
            queue_types=self.queue_types,
            full_policies=self.full_policies,
            persistent=persistent,
            selector_compiler=compile_selector,
            page_stores=self.page_stores,
            stream_stores=self.stream_stores,
            large_messages=configured_store(
                self.large_message_stores, self.config, journal, persistent=persistent
            ),
        )
        broker.hooks = self.plugins.hook
        limits = broker.limits
        storage.hold_producers(_Backlog(loop, limits))
        try:
            broker.load_persisted_settings()
        except BrokerError as exc:
            raise StartupError(exc.description) from None
        self.plugins.register(_ConnectionRegistry(broker), "scow.connections")
        self.broker = broker
        formats = [p.message_format for p in self.protocol_types.values() if p.message_format]
        if recovered.messages and not formats:
            raise StartupError("the journal holds messages but no protocol plugin can read them")
        try:
            await loop.run_in_executor(None, broker.large_messages.open)
        except Exception as exc:
            raise StartupError(f"large message store: {exc}") from exc
        restored = broker.recover(recovered, formats[0]) if formats else 0
        log.info(
            "broker recovered",
            addresses=len(broker.addresses),
            queues=len(broker.queues),
            messages=restored,
        )
        self._declare_configured_queues(broker)
        broker_cfg = self.config.section("broker")
        self.services = [
            ExpiryReaper(broker, broker_cfg),
            DiskMonitor(broker.limits, self._storage_paths(), broker_cfg),
            MemoryTrimmer(),
        ]
        self.services += self.plugins.collect("scow_services", broker=broker)
        # Services that answer clients (the management API) start last, once every other
        # one has recovered (paging reads its page files) and the listeners are up: they
        # would show, and act on, part of the queues (and say ready too soon).
        back = [s for s in self.services if not getattr(s, "serves_clients", False)]
        front = [s for s in self.services if s not in back]
        self.services = back + front  # stopped in reverse
        for service in back:
            await service.start()
        # every record that refers to a large message's body is known by now (the paging
        # plugin's service read its pages): bodies left by a crash go before anything arrives
        await loop.run_in_executor(None, broker.large_messages.remove_orphans)
        for name, protocol in self.protocol_types.items():
            settings = self.config.section(name) if name in self.config.section_names else {}
            server = protocol.factory(broker, settings)
            await server.start()
            self.protocols[name] = server
        for service in front:
            await service.start()
        self.plugins.hook.scow_broker_started(broker=broker)
        # Startup and recovered objects live as long as the broker: take them out of the
        # cyclic collector's sight, and collect the young generation less often (messages
        # and refs are acyclic; collection pauses show up as tail latency).
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, 50, 50)
        sys.setswitchinterval(SWITCH_INTERVAL)
        return broker

    def _declare_configured_queues(self, broker: Broker) -> None:
        """Create the `[queues."name"]` the broker does not have yet."""
        for name, described in self.config.section(QUEUES_SECTION).items():
            existing = broker.queues.get(name)
            if existing is not None:
                if existing.address != described["address"]:
                    log.warning(
                        "a configured queue exists on another address; kept as it is "
                        "(delete it to apply the config)",
                        queue=name,
                        address=existing.address,
                        configured=described["address"],
                    )
                continue  # created earlier: its messages, type and arguments stay
            try:
                broker.declare_queue(
                    name,
                    address=described["address"],
                    routing_type=described["routing-type"],
                    durable=described["durable"],
                    filter=described["filter"],
                    arguments=described["arguments"],
                    max_consumers=described["max-consumers"],
                    exclusive=described["exclusive"],
                    non_destructive=described["non-destructive"],
                )
            except BrokerError as exc:
                where = self.config.path or "config"
                raise StartupError(f'{where}: [queues."{name}"] {exc.description}') from None

    def _storage_paths(self) -> list[Path]:
        """The directories whose file systems the disk monitor watches."""
        data_dir = Path(str(self.config.section("broker")["data-dir"]))
        paths = [data_dir]
        for section, keys in (
            ("journal", ("journal-directory", "bindings-directory")),
            ("paging", ("paging-directory",)),
        ):
            if section in self.config.section_names:
                paths += [data_dir / str(self.config.section(section)[key]) for key in keys]
        return paths

    async def stop(self) -> None:
        if self.broker is not None:
            self.plugins.hook.scow_broker_stopping(broker=self.broker)
        for server in self.protocols.values():
            await server.stop()
        for service in reversed(self.services):
            await service.stop()
        if self.broker is not None:
            # closed connections left commits and rollbacks running a slice per loop pass:
            # slices left would journal while storage stops (an undone commit rolls back)
            await self.broker.finish_commits()
            self.broker.finish_rollbacks()
            self.broker.write_duplicate_ids()  # those of the last loop pass, if it has not
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self.broker.large_messages.close)
            await loop.run_in_executor(None, self.broker.storage.stop)
            if self.ha is not None:
                await self.ha.leave()  # while the store is still ours
        self._release_locks()
        self._stopped.set()

    async def run_forever(self) -> None:
        """Start, then serve until SIGINT, SIGTERM or SIGHUP (a closed terminal: stopped
        cleanly rather than killed, as a JVM broker's shutdown hooks do). An HA member
        that must hand the store over stops serving and starts afresh in this process,
        waiting (`os.execv`). Tells a supervisor each step (`systemd`)."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        signals: list[str] = []

        def stop_on(sig: signal.Signals) -> None:
            signals.append(sig.name)
            if stop.is_set():  # a second signal: the operator will not wait for the disk
                log.warning(
                    "stopping now, without waiting for storage: what clients were not "
                    "told is stored, they send again",
                    signal=sig.name,
                )
                critical.halt(EXIT_FORCED_STOP)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop_on, sig)
        supervisor = systemd.Supervisor()
        role = f" (HA {self.ha.role})" if self.ha is not None else ""
        if await self.start(stop, lambda: supervisor.ready(f"waiting for the store{role}")) is None:
            log.info("shutting down", signal=signals[0] if signals else None)
            return
        supervisor.ready(f"serving{role}")
        waits = [asyncio.ensure_future(stop.wait())]
        if self.ha is not None:
            waits.append(asyncio.ensure_future(self.ha.stepped_down.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        if self.ha is None or self.ha.step_down is None:
            supervisor.stopping()
            log.info("shutting down", signal=signals[0] if signals else None)
            stopping = asyncio.ensure_future(self.stop())
            done, _pending = await asyncio.wait([stopping], timeout=STOP_NOTICE)
            if not done:  # storage is still syncing (a stalled disk, a hung database)
                log.warning(
                    "still stopping: storage is still writing what it was given; "
                    "a second signal stops at once"
                )
            await stopping
            return
        # not stopping for the supervisor: this process (its main pid) waits again
        supervisor.status("handing the store over, then waiting for it")
        for server in self.protocols.values():  # clients go to the other member at once
            await server.stop()
        try:
            await asyncio.wait_for(self.stop(), STEP_DOWN_TIMEOUT)
        except TimeoutError:
            log.warning("ha: the store did not close in time; restarting anyway")
        restart_to_wait()


def restart_to_wait() -> None:
    """Replace this process by a fresh `scow run` with the same arguments (HA step-down).

    Nothing of the old broker survives: its sockets and locks are close-on-exec, and the new
    process waits for the store like a member that just started.
    """
    log.info("ha: restarting to wait for the store")
    scow_logging.drain()  # the log writer's thread does not survive the exec
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def journal_backend(
    journals: Mapping[str, JournalBackend], config: Config
) -> tuple[str, JournalBackend]:
    """The journal backend `[broker] journal` names (the one enabled when it is empty)."""
    name = config.section("broker")["journal"]
    if not name:
        if len(journals) != 1:
            raise StartupError(
                "[broker] journal: choose one of the enabled journal backends "
                f"({', '.join(sorted(journals)) or 'none: enable file-journal'})"
            )
        name = next(iter(journals))
    backend = journals.get(name)
    if backend is None:
        raise StartupError(
            f"[broker] journal = {name!r}: no enabled plugin provides it "
            f"(enabled journals: {', '.join(sorted(journals)) or 'none'})"
        )
    return name, backend


def open_storage(journals: Mapping[str, JournalBackend], config: Config) -> StorageManager:
    """The storage manager over the journal backend `[broker] journal` names (not loaded).

    A backend that cannot open (a bad directory, an unreachable database, a lock held by
    another broker) stops startup: StartupError naming the backend and the cause.
    """
    broker_cfg = config.section("broker")
    if not broker_cfg["persistence-enabled"]:
        return StorageManager(None, None)
    name, backend = journal_backend(journals, config)
    data_dir = Path(broker_cfg["data-dir"])
    section = backend.config_section
    settings = config.section(section) if section in config.section_names else {}
    opened: list[Journal] = []
    try:
        for kind in ("bindings", "messages"):
            opened.append(backend.factory(data_dir, kind, settings))
    except Exception as exc:
        for journal in opened:
            journal.stop()
        raise StartupError(f"[broker] journal = {name!r}: {exc}") from exc
    sync = bool(settings.get("journal-sync-non-transactional", True))
    return StorageManager(opened[0], opened[1], sync_non_transactional=sync)


class ExpiryReaper:
    """Moves expired messages out of queues every `message-expiry-scan-period` ms."""

    def __init__(self, broker: Broker, settings: Mapping[str, Any]) -> None:
        self.broker = broker
        self.period = int(settings["message-expiry-scan-period"]) / 1000
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.period > 0:
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.broker.expire_scan()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
