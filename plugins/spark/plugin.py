"""The spark plugin's broker side: its queue types, `$management` operations and service.

One `Streams` per broker holds its stream queues and the sinks of exactly-once writes,
and runs the periodic work: time retention, cursor TTL, staging TTL. Nothing here
imports pyspark: the data source is `scow.plugins.spark.source`.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scow.core.config import ConfigError, ConfigSection, Setting
from scow.core.model import InvalidField, NotFound
from scow.plugins.spark import staging
from scow.plugins.spark.cursors import now_ms
from scow.plugins.spark.records import MalformedPack, rows_after, rows_in
from scow.plugins.spark.stream import DEFAULT_SEGMENT_BYTES, StreamQueue, stored_rows

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.config import Config
    from scow.core.descriptors import StreamStoreBackend
    from scow.core.interfaces import StreamStore
    from scow.core.management import ManagementOperation
    from scow.core.model import QueueSpec

SECTION = ConfigSection(
    "spark",
    (
        Setting(
            "staging-ttl",
            int,
            staging.DEFAULT_STAGING_TTL,
            "Staged messages of an exactly-once write that nobody committed or aborted "
            "are dropped after this long (ms): the tasks of a job that died.",
            kind="duration-ms",
            minimum=1,
        ),
        Setting(
            "stream-store",
            str,
            "",
            "Where stream queues keep their records, by stream store name (file, database, "
            "or a plugin's); empty: the store of [broker] journal (the database journal "
            "keeps streams in the database), else file.",
        ),
        Setting(
            "housekeeping-period",
            int,
            1000,
            "How often (ms) time retention, cursor TTL and staging TTL run.",
            kind="duration-ms",
            minimum=1,
        ),
    ),
    "The spark plugin: stream queues and the exactly-once sinks of the Spark connector.",
)

_STREAMS: weakref.WeakKeyDictionary[Any, Streams] = weakref.WeakKeyDictionary()
#: Threads reading streams for consumers (reads mostly wait on a disk or a database).
READERS = 4


def stream_store_opener(stores: Mapping[str, StreamStoreBackend], config: Config) -> StreamOpener:
    """What builds the store of a stream queue (name, arguments) on the stream store
    `[spark] stream-store` names, by default the one named like `[broker] journal` (else
    file); ConfigError naming the setting and the stores available."""
    backend, settings = stream_store_backend(stores, config)
    return opener(backend, Path(str(config.section("broker")["data-dir"])), settings)


def stream_store_backend(
    stores: Mapping[str, StreamStoreBackend], config: Config
) -> tuple[StreamStoreBackend, Mapping[str, Any]]:
    """The stream store backend the config selects (see `stream_store_opener`) and its
    settings."""
    name = config.section("spark")["stream-store"] if "spark" in config.section_names else ""
    if not name:
        journal = str(config.section("broker")["journal"])
        name = journal if journal in stores else "file"
    backend = stores.get(name)
    if backend is None:
        available = ", ".join(sorted(stores)) or "none"
        raise ConfigError(
            f"[spark] stream-store = {name!r}: no enabled plugin provides it "
            f"(available: {available})",
            path=config.path,
            section="spark",
            key="stream-store",
        )
    section = backend.config_section
    settings = config.section(section) if section in config.section_names else {}
    return backend, settings


def opener(
    backend: StreamStoreBackend, data_dir: Path, settings: Mapping[str, Any]
) -> StreamOpener:
    """What builds the store of a stream queue (name, arguments) on `backend`."""
    return StreamOpener(backend, data_dir, settings)


class StreamOpener:
    """Builds the store of a stream queue (name, arguments) on a backend: the broker's
    streams and `scow data export`/`import` reach stream stores through it
    (`scow.core.export.OpenStream`), and an export also asks it what of a committed pack
    a store lacks (`rows_left`)."""

    def __init__(
        self, backend: StreamStoreBackend, data_dir: Path, settings: Mapping[str, Any]
    ) -> None:
        self.backend = backend
        self.data_dir = data_dir
        self.settings = settings

    def __call__(self, queue: str, arguments: Mapping[str, Any]) -> StreamStore:
        segment_bytes = int(arguments.get("segment-bytes", DEFAULT_SEGMENT_BYTES))
        return self.backend.factory(self.data_dir, queue, segment_bytes, self.settings)

    @staticmethod
    def rows_left(recent_ids: set[int], pack_id: int, data: bytes) -> bytes | None:
        """The rows of the committed pack `data` (journal message `pack_id`) a stream's
        store lacks, by the rule its recovery appends them by (`stored_rows`, which takes
        the ids it finds out of `recent_ids`): `data` itself when it holds none, None when
        it holds them all, else a pack of the rest. A malformed pack comes back whole:
        the stream of the broker that imports it refuses it, as its own would have."""
        try:
            rows = rows_in(data)
        except MalformedPack:
            return data
        first = stored_rows(recent_ids, pack_id, rows)
        if first == rows:
            return None
        return data if first == 0 else rows_after(data, first)


class Streams:
    """The stream queues of one broker and what they share."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.data_dir = Path(str(broker.config.section("broker")["data-dir"]))
        self.queues: dict[str, StreamQueue] = {}
        settings = broker.config.section("spark") if "spark" in broker.config.section_names else {}
        self.period = int(settings.get("housekeeping-period", 1000)) / 1000
        ttl = int(settings.get("staging-ttl", staging.DEFAULT_STAGING_TTL))
        self.sinks = staging.Sinks(broker, ttl)
        self.open_store = stream_store_opener(broker.stream_stores, broker.config)
        #: Reads and seeks of every stream run here, off the loop.
        self.reads = ThreadPoolExecutor(READERS, thread_name_prefix="scow-stream-reader")
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, broker: Broker) -> Streams:
        streams = _STREAMS.get(broker)
        if streams is None:
            streams = _STREAMS[broker] = cls(broker)
        return streams

    def new_queue(self, spec: QueueSpec) -> StreamQueue:
        store = self.open_store(spec.name, dict(spec.arguments))
        place = self.data_dir / "streams"
        queue = StreamQueue(spec, self.broker, store, place, self.reads, self._forget)
        self.queues[spec.name] = queue
        return queue

    def _forget(self, queue: StreamQueue) -> None:
        name = queue.name
        if self.queues.get(name) is queue:
            del self.queues[name]

    def stream(self, name: str) -> StreamQueue:
        queue = self.queues.get(name)
        if queue is None:
            known = ", ".join(sorted(self.queues)) or "none"
            raise NotFound(f"stream '{name}' does not exist (streams: {known})")
        return queue

    def housekeeping(self) -> None:
        now = now_ms()
        for queue in list(self.queues.values()):
            queue.cursors.expire(now)
            queue.apply_retention(now)
        self.sinks.expire()

    # ------------------------------------------------------------------ Service

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def broker_started(self) -> None:
        """Every service ran its recovery (the paging plugin's included): streams may
        forget what let them skip messages stored before a crash."""
        for queue in self.queues.values():
            queue.recovered()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.housekeeping()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        loop = asyncio.get_running_loop()
        for queue in list(self.queues.values()):
            await loop.run_in_executor(None, queue.stop)
        await asyncio.sleep(0)  # the writers' last completions run
        self.reads.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ management

    def operations(self) -> dict[str, dict[str, ManagementOperation]]:
        return {"stream": self._stream_operations(), "stream-sink": staging.operations(self.sinks)}

    def _stream_operations(self) -> dict[str, ManagementOperation]:
        def read(name: str, _body: Any, _props: Mapping[str, Any]) -> tuple[int, str, Any]:
            queue = self.stream(name)
            return 200, "OK", {**queue.stats(), "cursor-positions": queue.cursors.describe()}

        async def seek(name: str, _body: Any, props: Mapping[str, Any]) -> tuple[int, str, Any]:
            queue, when = self.stream(name), _number(props, "timestamp")
            # a read of the store (the first of an old segment reads all of it): off the loop
            loop = asyncio.get_running_loop()
            return 200, "OK", {"sequence": await loop.run_in_executor(self.reads, queue.seek, when)}

        def cursor_read(name: str, _body: Any, props: Mapping[str, Any]) -> tuple[int, str, Any]:
            queue = self.stream(name)
            cursor = _cursor(props)
            sequence = queue.cursors.get(cursor)
            if sequence is None:
                raise NotFound(f"stream '{name}': no cursor '{cursor}'")
            return 200, "OK", {"cursor": cursor, "sequence": sequence}

        def cursor_move(name: str, _body: Any, props: Mapping[str, Any]) -> tuple[int, str, Any]:
            queue = self.stream(name)
            cursor = _cursor(props)
            sequence = queue.cursors.move(cursor, _number(props, "sequence"))
            queue.apply_retention()
            return 200, "OK", {"cursor": cursor, "sequence": sequence}

        def cursor_delete(name: str, _body: Any, props: Mapping[str, Any]) -> tuple[int, str, Any]:
            queue = self.stream(name)
            cursor = _cursor(props)
            if not queue.cursors.delete(cursor):
                raise NotFound(f"stream '{name}': no cursor '{cursor}'")
            return 204, "No Content", None

        return {
            "READ": read,
            "SEEK": seek,
            "CURSOR-READ": cursor_read,
            "CURSOR-MOVE": cursor_move,
            "CURSOR-DELETE": cursor_delete,
        }


def _cursor(props: Mapping[str, Any]) -> str:
    cursor = props.get("cursor")
    if not isinstance(cursor, str) or not cursor:
        raise InvalidField(f"cursor = {cursor!r}: expected the cursor's name (a string)")
    return cursor


def _number(props: Mapping[str, Any], key: str) -> int:
    value = props.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidField(f"{key} = {value!r}: expected an integer of 0 or more")
    return int(value)
