"""The `scow` PySpark data source: batch and streaming reads of stream queues, batch and
exactly-once streaming writes.

Installed, it needs no setup: Spark finds it as `pyspark_scow.DefaultSource` (see
`pyspark_scow`); `spark.dataSource.register(ScowDataSource)` registers it explicitly::

    df = spark.read.format("scow").option("url", "amqp://host:5672").option("queues", "q").load()

Offsets are sequence numbers per stream queue (`{"orders": 1200}`: the next message to
read), per (broker, queue) when `url` lists several brokers (`{"host:5672/orders": 1200}`).
Reads are positioned, so a micro-batch replayed after a failure reads exactly the same
messages; `commit` moves the broker cursor named by the `cursor` option. Writes go through
each broker's staging area (see `scow.plugins.spark.staging`): nothing is visible until
the driver commits, a batch id already committed is ignored, and every row carries a
duplicate id so that a replay past the staging area is kept once too.

Connections are opened lazily where they are used (the driver's one connection is kept
for the query's life; executors keep one per worker process) and are never pickled: the
objects Spark ships hold only the parsed options.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from scow.plugins.spark.client import SEND_WINDOW, Client, ClientError, Endpoint, Sender
from scow.plugins.spark.records import MAX_PACK_RECORDS, grouped, pack
from scow.plugins.spark.schema import SCHEMA_DDL, check_write_schema, messages_of, to_batch

NAME = "scow"

#: Every option, with what it means (the error for an unknown one lists them).
OPTIONS = {
    "url": "amqp://host:port or amqps://host:port of the broker; comma-separated for several",
    "host": "the broker's host (instead of url)",
    "port": "the broker's port (instead of url)",
    "username": "SASL PLAIN user",
    "password": "SASL PLAIN password",
    "passwordFile": "a file holding the password",
    "tls": "true: connect with TLS",
    "caFile": "PEM file of the CAs that sign the broker's certificate",
    "certFile": "PEM client certificate (with keyFile)",
    "keyFile": "PEM private key of certFile",
    "timeout": "seconds to wait for the broker (default 30)",
    "queues": "comma-separated stream queues to read",
    "startingOffsets": 'earliest, latest, cursor, or JSON {"queue": sequence}',
    "endingOffsets": 'latest, or JSON {"queue": sequence} (batch reads; exclusive)',
    "startingTimestamp": "ms since the epoch: start at the first message enqueued then or later",
    "selector": "a JMS selector the broker applies",
    "maxMessagesPerPartition": "messages per Spark partition at most",
    "minPartitions": "split a read (a micro-batch: default 2) into at least this many partitions",
    "maxMessagesPerTrigger": "messages per micro-batch at most",
    "maxBytesPerTrigger": "bytes per micro-batch at most (estimated from the stream's mean)",
    "failOnDataLoss": "true (default): fail when retention removed messages not yet read",
    "cursor": "the broker cursor a streaming query moves (default: the query's own)",
    "address": "where written messages go when a row has no 'to'",
    "keyColumn": "writing to several brokers: rows with equal values in it go to one broker",
    "sinkId": "the sink's name for exactly-once writes (default: from the streaming query)",
    "batchId": "batch writes (e.g. in foreachBatch): commit as this batch of sinkId, once",
}
_BY_LOWER = {name.lower(): name for name in OPTIONS}
#: Options Spark itself passes to every source and sink; not ours to check.
SPARK_OPTIONS = frozenset({"checkpointlocation", "path"})
DEFAULT_PARTITION_SIZE = 250_000
#: A micro-batch is split into at least this many partitions unless minPartitions says
#: otherwise (so that two executor cores read it)...
STREAM_MIN_PARTITIONS = 2
#: ...but not into partitions of fewer messages than this (a small micro-batch is one
#: task: a task costs more than reading a few thousand messages).
STREAM_MIN_SPLIT = 10_000
#: Packs a task lets out unsettled (each up to the broker's `pack-bytes`): about 2 MiB.
PACK_WINDOW = 64
COMMIT_WAIT = 60.0


class ScowOptionError(ValueError):
    """An option is unknown or its value is not accepted."""


# --------------------------------------------------------------------------- options


def _flag(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ScowOptionError(f"option {name} = {value!r}: expected true or false")


def _batch_id(value: str | None, sink: str | None) -> int | None:
    if value is None:
        return None
    if not sink:
        raise ScowOptionError("option batchId needs sinkId (the sink whose batches it numbers)")
    if not value.strip().isdigit():
        raise ScowOptionError(f"option batchId = {value!r}: expected an integer of 0 or more")
    return int(value)


def _count(name: str, value: str | None, default: int | None) -> int | None:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ScowOptionError(f"option {name} = {value!r}: expected a positive integer")
    return number


@dataclass(frozen=True)
class Options:
    """The parsed options: plain values only, so Spark can ship them to executors."""

    #: one per broker of `url`, in its order
    endpoints: tuple[Endpoint, ...]
    password_file: str | None
    queues: tuple[str, ...]
    starting: str | None
    ending: str | None
    starting_timestamp: int | None
    selector: str | None
    partition_size: int | None
    min_partitions: int | None
    max_messages_per_trigger: int | None
    max_bytes_per_trigger: int | None
    fail_on_data_loss: bool
    cursor: str | None
    address: str | None
    sink_id: str | None
    batch_id: int | None
    key_column: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        given: dict[str, str] = {}
        for key, value in options.items():
            if key.lower() in SPARK_OPTIONS:
                continue
            name = _BY_LOWER.get(key.lower())
            if name is None:
                raise ScowOptionError(
                    f"unknown option {key!r} for format scow (valid: {', '.join(OPTIONS)})"
                )
            given[name] = value
        port = _count("port", given.get("port"), None)
        timeout = _count("timeout", given.get("timeout"), 30)
        shared = {
            "username": given.get("username"),
            "password": given.get("password"),
            "tls": _flag("tls", given.get("tls"), False) or None,
            "ca_file": given.get("caFile"),
            "cert_file": given.get("certFile"),
            "key_file": given.get("keyFile"),
            "timeout": float(timeout or 30),
        }
        urls = [u.strip() for u in (given.get("url") or "").split(",") if u.strip()]
        if len(urls) > 1 and (given.get("host") or port):
            raise ScowOptionError(
                "options host and port name one broker: with several in url, give each as "
                "amqp://host:port there"
            )
        endpoints = tuple(
            Endpoint.parse(url, host=given.get("host"), port=port, **shared)
            for url in urls or [None]
        )
        labels = [broker_label(e) for e in endpoints]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise ScowOptionError(f"option url names broker {twice[0]} twice")
        queues = tuple(q.strip() for q in given.get("queues", "").split(",") if q.strip())
        stamp = given.get("startingTimestamp")
        return cls(
            endpoints=endpoints,
            password_file=given.get("passwordFile"),
            queues=queues,
            starting=given.get("startingOffsets"),
            ending=given.get("endingOffsets"),
            starting_timestamp=_count("startingTimestamp", stamp, None) if stamp else None,
            selector=given.get("selector") or None,
            partition_size=_count(
                "maxMessagesPerPartition", given.get("maxMessagesPerPartition"), None
            ),
            min_partitions=_count("minPartitions", given.get("minPartitions"), None),
            max_messages_per_trigger=_count(
                "maxMessagesPerTrigger", given.get("maxMessagesPerTrigger"), None
            ),
            max_bytes_per_trigger=_count(
                "maxBytesPerTrigger", given.get("maxBytesPerTrigger"), None
            ),
            fail_on_data_loss=_flag("failOnDataLoss", given.get("failOnDataLoss"), True),
            cursor=given.get("cursor") or None,
            address=given.get("address"),
            sink_id=given.get("sinkId"),
            batch_id=_batch_id(given.get("batchId"), given.get("sinkId")),
            key_column=given.get("keyColumn") or None,
        )

    def need_queues(self) -> tuple[str, ...]:
        if not self.queues:
            raise ScowOptionError(
                "option queues is required to read (comma-separated stream queues)"
            )
        return self.queues

    def connect_endpoint(self, broker: int = 0) -> Endpoint:
        """Broker `broker`'s endpoint with the password file read (where the connection is
        made)."""
        endpoint = self.endpoints[broker]
        if self.password_file and endpoint.password is None:
            with open(self.password_file) as f:
                password = f.read().strip()
            return Endpoint(**{**endpoint.__dict__, "password": password})
        return endpoint

    def offset_key(self, broker: int, queue: str) -> str:
        """The offset key of a (broker, stream queue) pair: the queue's name with one broker
        (as before several were possible, so old checkpoints go on), `host:port/queue`
        with several."""
        if len(self.endpoints) == 1:
            return queue
        return f"{broker_label(self.endpoints[broker])}/{queue}"

    def streams(self) -> dict[str, tuple[int, str]]:
        """Every (broker, queue) pair to read, by offset key."""
        queues = self.need_queues()
        return {self.offset_key(b, q): (b, q) for b in range(len(self.endpoints)) for q in queues}


def broker_label(endpoint: Endpoint) -> str:
    return f"{endpoint.host}:{endpoint.port}"


# --------------------------------------------------------------------------- connections

_POOL: dict[Endpoint, Client] = {}
_POOL_PID = os.getpid()


def pooled(options: Options, broker: int = 0) -> Client:
    """This worker's connection to broker `broker` of `url`, opened on first use."""
    global _POOL_PID
    if os.getpid() != _POOL_PID:  # a forked worker: the parent's sockets are not ours
        _POOL.clear()
        _POOL_PID = os.getpid()
    endpoint = options.connect_endpoint(broker)
    client = _POOL.get(endpoint)
    if client is None or not client.usable():
        client = _POOL[endpoint] = Client(endpoint)
    return client


def _drop(client: Client) -> None:
    """A failed connection leaves the pool (the task's retry connects afresh)."""
    client.close()
    for key, value in list(_POOL.items()):
        if value is client:
            del _POOL[key]


# --------------------------------------------------------------------------- reading


class ScowPartition(InputPartition):
    """Messages `start` to `end` (exclusive) of one stream queue of broker `broker` (its
    place in `url`).

    `committed`: set on the first partition of each (broker, queue) in a micro-batch, the
    position the query has committed up to (the batch's start); its task moves the query's
    own cursor there.
    """

    def __init__(
        self,
        broker: int,
        queue: str,
        address: str,
        start: int,
        end: int,
        committed: int | None = None,
    ) -> None:
        super().__init__((broker, queue, start, end))
        self.broker = broker
        self.queue = queue
        self.address = address
        self.start = start
        self.end = end
        self.committed = committed


def _stream_state(client: Client, queue: str) -> dict[str, Any]:
    return dict(client.call("stream", queue, "READ"))


def _offsets(option: str, value: str, keys: Iterable[str]) -> dict[str, int]:
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(isinstance(v, int) for v in parsed.values()):
        raise ScowOptionError(
            f'option {option} = {value!r}: expected earliest, latest or JSON {{"queue": sequence}}'
        )
    known = list(keys)
    unknown = sorted(set(parsed) - set(known))
    if unknown:
        raise ScowOptionError(
            f"option {option}: {unknown[0]!r} is not a stream read (keys: {', '.join(known)})"
        )
    return parsed


def _resolve(
    options: Options,
    clients: Sequence[Client],
    states: dict[str, dict[str, Any]],
    spec: str | None,
    default: str,
    option: str,
) -> dict[str, int]:
    """Sequence numbers per offset key for an offsets option (earliest, latest, cursor,
    JSON)."""
    streams = options.streams()
    out: dict[str, int] = {}
    if option == "startingOffsets" and spec is None and options.starting_timestamp is not None:
        for key in states:
            broker, queue = streams[key]
            props = {"timestamp": options.starting_timestamp}
            out[key] = int(clients[broker].call("stream", queue, "SEEK", props)["sequence"])
        return out
    spec = spec or default
    explicit = _offsets(option, spec, states) if spec.strip().startswith("{") else {}
    for key, state in states.items():
        broker, queue = streams[key]
        if key in explicit:
            out[key] = explicit[key]
        elif spec == "earliest" or (explicit and option == "startingOffsets"):
            out[key] = int(state["first-sequence"])
        elif spec == "latest" or explicit:
            out[key] = int(state["next-sequence"])
        elif spec == "cursor":
            if options.cursor is None:
                raise ScowOptionError(
                    f"option {option} = cursor needs the cursor option (the broker cursor to "
                    "start from; a streaming query's own cursor is named after its query id, "
                    "which a source cannot see when it starts)"
                )
            status, _text, answer = clients[broker].request(
                "stream", queue, "CURSOR-READ", {"cursor": options.cursor}
            )
            out[key] = int(answer["sequence"]) if status == 200 else int(state["first-sequence"])
        else:
            raise ScowOptionError(
                f"option {option} = {spec!r}: expected earliest, latest, cursor or JSON "
                '{"queue": sequence}'
            )
    return out


def _partition_size(options: Options, total: int, streaming: bool) -> int:
    """Messages per partition for a read of `total` messages: maxMessagesPerPartition
    (default DEFAULT_PARTITION_SIZE), smaller if minPartitions asks for more partitions
    (a micro-batch: STREAM_MIN_PARTITIONS unless set, in parts of STREAM_MIN_SPLIT or
    more)."""
    size = options.partition_size or DEFAULT_PARTITION_SIZE
    parts = options.min_partitions
    if parts:
        return min(size, max(math.ceil(total / parts), 1))
    if streaming:
        return min(size, max(math.ceil(total / STREAM_MIN_PARTITIONS), STREAM_MIN_SPLIT))
    return size


def _split(
    broker: int, queue: str, address: str, start: int, end: int, size: int
) -> list[ScowPartition]:
    return [
        ScowPartition(broker, queue, address, s, min(s + size, end))
        for s in range(start, end, size)
    ]


def _interleaved(ranges: list[list[ScowPartition]]) -> list[ScowPartition]:
    """Each (broker, stream)'s ranges, taken in turn: Spark starts tasks in partition
    order, so the tasks that run at once read different brokers (one after the other, every
    executor core would read the first broker while the second waits)."""
    return [part for turn in itertools.zip_longest(*ranges) for part in turn if part is not None]


def _check_loss(options: Options, key: str, expected: int, first: int) -> int:
    """Where to read from, given that the stream keeps messages from `first` on."""
    if first <= expected:
        return expected
    if options.fail_on_data_loss:
        raise RuntimeError(
            f"scow: messages {expected} to {first - 1} of queue '{key}' are gone (retention "
            "removed them before they were read); set failOnDataLoss=false to skip them"
        )
    return first


def query_cursor(query: str) -> str:
    """The broker cursor a streaming query has when the `cursor` option names none."""
    return f"query-{query}"


def _move_query_cursor(client: Client, options: Options, partition: ScowPartition) -> None:
    """Move the query's own cursor to what it has committed (from a task: only tasks learn
    the query's id, which its checkpoint keeps; the driver's reader is given none).

    Spark plans micro-batch N+1 after batch N is in the commit log, so the start of N+1 is
    committed; the cursor trails the query by the batch in flight, and keeps those messages
    from `retention-cursors` until the next batch.
    """
    if partition.committed is None or options.cursor is not None:
        return
    query = _task().query
    if query:
        client.call(
            "stream",
            partition.queue,
            "CURSOR-MOVE",
            {"cursor": query_cursor(query), "sequence": partition.committed},
        )


def read_partition(options: Options, partition: ScowPartition) -> Iterator[pa.RecordBatch]:
    """The messages of one partition as record batches (runs on an executor)."""
    client = pooled(options, partition.broker)
    first = True
    try:
        _move_query_cursor(client, options, partition)
        for messages in client.read(
            partition.queue,
            partition.start,
            partition.end,
            address=partition.address,
            selector=options.selector,
        ):
            batch = to_batch(partition.queue, messages)
            if first and options.selector is None:
                key = options.offset_key(partition.broker, partition.queue)
                _check_loss(options, key, partition.start, batch.column(3)[0].as_py())
            first = False
            yield batch
    except ClientError:
        _drop(client)
        raise


def _connect_all(options: Options) -> list[Client]:
    """A connection to each broker of `url` (all closed again if one fails)."""
    clients: list[Client] = []
    try:
        for broker in range(len(options.endpoints)):
            clients.append(Client(options.connect_endpoint(broker)))
    except ClientError:
        for client in clients:
            client.close()
        raise
    return clients


class ScowBatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> list[ScowPartition]:
        options = self.options
        streams = options.streams()
        clients = _connect_all(options)
        try:
            states = {k: _stream_state(clients[b], q) for k, (b, q) in streams.items()}
            starts = _resolve(
                options, clients, states, options.starting, "earliest", "startingOffsets"
            )
            ends = _resolve(options, clients, states, options.ending, "latest", "endingOffsets")
        finally:
            for client in clients:
                client.close()
        ranges: list[list[ScowPartition]] = []
        total = sum(max(ends[k] - starts[k], 0) for k in states)
        size = _partition_size(options, total, streaming=False)
        for key, state in states.items():
            broker, queue = streams[key]
            start = _check_loss(options, key, starts[key], int(state["first-sequence"]))
            ranges.append(_split(broker, queue, state["address"], start, ends[key], size))
        parts = _interleaved(ranges)
        return parts or [ScowPartition(0, options.queues[0], options.queues[0], 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ScowPartition)
        if partition.end > partition.start:
            yield from read_partition(self.options, partition)


class ScowStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches by sequence number, offsets keyed by (broker, queue) (see
    `Options.offset_key`); the driver keeps one connection per broker for the query."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.streams = options.streams()
        self._clients: dict[int, Client] = {}
        self._target: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Ship the options, never the driver's connections."""
        return {**self.__dict__, "_clients": {}}

    def _driver(self, broker: int) -> Client:
        client = self._clients.get(broker)
        if client is None or not client.usable():
            client = self._clients[broker] = Client(self.options.connect_endpoint(broker))
        return client

    def _states(self) -> dict[str, dict[str, Any]]:
        states = {}
        for key, (broker, queue) in self.streams.items():
            client = self._driver(broker)
            try:
                states[key] = _stream_state(client, queue)
            except ClientError:
                client.close()  # the next call connects again (the broker may have restarted)
                raise
        return states

    def initialOffset(self) -> dict[str, int]:
        states = self._states()
        clients = [self._driver(b) for b in range(len(self.options.endpoints))]
        return _resolve(
            self.options, clients, states, self.options.starting, "latest", "startingOffsets"
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        if self.options.max_bytes_per_trigger:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: int(s["next-sequence"]) for k, s in self._states().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        states = self._states()
        latest = {k: int(s["next-sequence"]) for k, s in states.items()}
        if self._target is not None:
            latest = {k: min(latest[k], self._target.get(k, latest[k])) for k in latest}
        begin = {k: max(int(start.get(k, 0)), int(states[k]["first-sequence"])) for k in latest}
        budget: int | None = None
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        elif isinstance(limit, ReadMaxBytes):
            per = max(
                (s["stored-bytes"] / max(s["message-count"], 1) for s in states.values()), default=1
            )
            budget = max(int(limit.max_bytes // max(per, 1)), 1)
        if budget is None:
            return {k: max(latest[k], int(start.get(k, 0))) for k in latest}
        out = {}
        share = max(budget // len(latest), 1)
        for key in latest:
            out[key] = max(min(latest[key], begin[key] + share), int(start.get(key, 0)))
        return out

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[ScowPartition]:
        states = self._states()
        begins = {}
        for key, state in states.items():
            first = int(state["first-sequence"])
            begins[key] = _check_loss(self.options, key, int(start.get(key, first)), first)
        total = sum(max(int(end.get(k, b)) - b, 0) for k, b in begins.items())
        size = _partition_size(self.options, total, streaming=True)
        ranges: list[list[ScowPartition]] = []
        for key, state in states.items():
            broker, queue = self.streams[key]
            begin = begins[key]
            stream_parts = _split(
                broker, queue, state["address"], begin, int(end.get(key, begin)), size
            )
            if stream_parts:
                stream_parts[0].committed = begin
            ranges.append(stream_parts)
        return _interleaved(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ScowPartition)
        if partition.end > partition.start:
            yield from read_partition(self.options, partition)

    def commit(self, end: dict[str, int]) -> None:
        if self.options.cursor is None:
            return  # the query's own cursor: its read tasks move it (_move_query_cursor)
        for key, sequence in end.items():
            if key not in self.streams:
                continue  # a stream this query no longer reads
            broker, queue = self.streams[key]
            self._driver(broker).call(
                "stream",
                queue,
                "CURSOR-MOVE",
                {"cursor": self.options.cursor, "sequence": sequence},
            )

    def stop(self) -> None:
        for client in self._clients.values():
            client.close()


# --------------------------------------------------------------------------- writing


@dataclass
class ScowCommit(WriterCommitMessage):
    """What a task staged: its partition and attempt, under which sink, for which query."""

    partition: int
    attempt: int
    sink: str = ""
    query: str | None = None
    #: the brokers (places in `url`) it staged rows on
    brokers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Task:
    partition: int
    attempt: int
    batch: int | None
    #: Spark's id of the streaming query: kept in its checkpoint, so the same across
    #: restarts from that checkpoint and new with a new one
    query: str | None


def _task() -> Task:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return Task(0, 0, None, None)
    batch = context.getLocalProperty("streaming.sql.batchId")
    query = context.getLocalProperty("sql.streaming.queryId") or None
    number = int(batch) if batch else None
    return Task(context.partitionId(), context.attemptNumber(), number, query)


def sink_of(options: Options, query: str | None) -> str:
    """A streaming sink's name: `sinkId`, else the query's (its checkpoint's) id.

    Never the address alone: two queries writing to one address, or one query restarted on
    a new checkpoint, number their batches independently, and sharing a sink would make
    one's batches look like replays of the other's.
    """
    if options.sink_id:
        return options.sink_id
    if not query:
        raise RuntimeError("scow: a streaming write task does not know its query's id")
    return f"query-{query}"


def duplicate_ids(sink: str, batch: int, partition: int) -> str:
    """The prefix of the `_AMQ_DUPL_ID` of a task's rows (the row's number follows): the
    same in every attempt and every replay of the batch, so a broker keeps each row once
    even when a replay gets past the sink's marker."""
    return f"{sink}:{batch}:{partition}:"


def _by_key(column: pa.Array, brokers: int) -> list[int]:
    """The broker of each row from its key (crc32: the same in every process)."""
    out = []
    for value in column.to_pylist():
        if value is None:
            out.append(0)
            continue
        data = value if isinstance(value, bytes) else str(value).encode()
        out.append(zlib.crc32(data) % brokers)
    return out


class _Staging:
    """A task's staging areas, one per broker it writes to, each opened at its first row.

    Rows go in packs where the broker offers them (STAGE's `pack-bytes`), one message
    each elsewhere.
    """

    def __init__(self, options: Options, sink: str, batch: int, properties: dict[str, Any]):
        self.options = options
        self.sink = sink
        self.batch = batch
        self.properties = properties
        #: broker -> its sender, or None where the batch is committed already (a replay)
        self.senders: dict[int, Sender | None] = {}
        #: broker -> the pack size it offers (0: rows one to a message)
        self.pack_bytes: dict[int, int] = {}
        self.clients: list[Client] = []

    def put(self, broker: int, messages: Iterable[bytes]) -> None:
        if broker not in self.senders:
            client = pooled(self.options, broker)
            self.clients.append(client)
            answer = client.call("stream-sink", self.sink, "STAGE", self.properties)
            replay = answer["committed-batch"] >= self.batch
            size = self.pack_bytes[broker] = int(answer.get("pack-bytes", 0))
            window = PACK_WINDOW if size else SEND_WINDOW
            self.senders[broker] = None if replay else client.sender(answer["address"], window)
        sender = self.senders[broker]
        if sender is None:
            return
        size = self.pack_bytes[broker]
        if size:
            # durable, as the rows it holds: journaled, so a broker's crash keeps it
            packs = grouped(messages, MAX_PACK_RECORDS, size)
            messages = (pack(rows, durable=True) for rows in packs)
        sender.put(messages)

    def finish(self) -> tuple[int, ...]:
        """Wait until every broker has every row; the brokers staged on."""
        for sender in self.senders.values():
            if sender is not None:
                sender.finish()
        return tuple(b for b, s in self.senders.items() if s is not None)

    def detach(self, failed: bool) -> None:
        if failed:  # the task's retry connects afresh
            for client in self.clients:
                _drop(client)
            return
        for sender in self.senders.values():
            if sender is not None:
                sender.detach()


def stage(
    options: Options,
    sink: str,
    batch: int,
    rows: Iterator[pa.RecordBatch],
    query: str | None = None,
    *,
    identified: bool = True,
) -> ScowCommit:
    """Publish a task's rows into its staging areas (runs on an executor).

    With one broker every row goes to it; with several, a row goes to the broker its
    `keyColumn` value hashes to, or, without a key column, every row of the task to one
    broker, taking turns by partition and batch. `identified`: the write has an identity
    a replay shares (a streaming query's batch, a `batchId`), so rows carry duplicate ids.
    """
    task = _task()
    properties: dict[str, Any] = {
        "batch": batch,
        "partition": task.partition,
        "attempt": task.attempt,
        "to": options.address or "",
    }
    if query:
        properties["query"] = query
    brokers = len(options.endpoints)
    key = options.key_column if brokers > 1 else None
    ids = duplicate_ids(sink, batch, task.partition) if identified else None
    staging = _Staging(options, sink, batch, properties)
    failed = True
    try:
        row = 0
        for record_batch in rows:
            messages = messages_of(record_batch, ids, row)
            if key is None:
                staging.put((task.partition + batch) % brokers, messages)
            else:
                targets = _by_key(record_batch.column(key), brokers)
                listed = list(messages)
                for broker in sorted(set(targets)):
                    chosen = [m for m, t in zip(listed, targets, strict=True) if t == broker]
                    staging.put(broker, chosen)
            row += record_batch.num_rows
        staged = staging.finish()
        failed = False
    finally:
        staging.detach(failed)
    return ScowCommit(task.partition, task.attempt, sink, query, staged)


def commit(
    options: Options,
    sink: str,
    batch: int,
    messages: list[Any],
    query: str | None = None,
    *,
    every_broker: bool = True,
) -> None:
    """Make a batch visible (driver) and wait until each broker has it on disk.

    Each broker commits the parts staged on it, atomically with its own marker; with
    `every_broker` also brokers nothing was staged on, so that every broker's marker
    counts the batch (a replay finds it committed everywhere).
    """
    staged = [m for m in messages if isinstance(m, ScowCommit)]
    properties: dict[str, Any] = {"batch": batch}
    if query:
        properties["query"] = query
    committing = []
    try:
        for broker in range(len(options.endpoints)):
            parts = [[m.partition, m.attempt] for m in staged if broker in m.brokers]
            if parts or every_broker:
                client = Client(options.connect_endpoint(broker))
                committing.append(client)
                client.call("stream-sink", sink, "COMMIT", properties, parts)
        deadline = time.monotonic() + COMMIT_WAIT
        for client in committing:
            while (answer := client.call("stream-sink", sink, "READ"))["committed-batch"] < batch:
                failed = answer.get("failed", {}).get(str(batch))
                if failed is not None:  # .get: brokers before sliced commits have none
                    raise ClientError(
                        f"sink {sink!r}: batch {batch} not committed on "
                        f"{broker_label(client.endpoint)}: {failed}"
                    )
                if time.monotonic() > deadline:
                    raise ClientError(
                        f"sink {sink!r}: batch {batch} not committed after {COMMIT_WAIT} s "
                        f"on {broker_label(client.endpoint)}"
                    )
                time.sleep(0.01)
    finally:
        for client in committing:
            client.close()


def abort(options: Options, sink: str, batch: int) -> None:
    """Discard what was staged for the batch, on every broker."""
    for broker in range(len(options.endpoints)):
        client = Client(options.connect_endpoint(broker))
        try:
            client.call("stream-sink", sink, "ABORT", {"batch": batch})
        finally:
            client.close()


class ScowBatchWriter(DataSourceArrowWriter):
    """A batch write: one staged batch, committed at once by the driver.

    With `sinkId` and `batchId` (a foreachBatch's id), committing a batch id the sink
    committed before changes nothing: a replayed micro-batch writes once.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        self.identified = options.batch_id is not None
        self.sink = options.sink_id if self.identified else f"batch-{uuid.uuid4().hex}"
        self.batch = options.batch_id or 0

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ScowCommit:
        return stage(self.options, str(self.sink), self.batch, iterator, identified=self.identified)

    def commit(self, messages: list[Any]) -> None:
        # a write of its own (no batchId) has nothing to replay: no marker where no row went
        commit(self.options, str(self.sink), self.batch, messages, every_broker=self.identified)

    def abort(self, messages: list[Any]) -> None:
        abort(self.options, str(self.sink), self.batch)


class ScowStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once streaming writes: staged per batch, committed by batch id.

    The sink is named after the query (see `sink_of`). Only the tasks learn the query's id
    (Spark hands the driver's commit nothing but the tasks' messages and the batch id), so
    each task's commit message carries the sink and the query.
    """

    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ScowCommit:
        task = _task()
        if task.batch is None:
            raise RuntimeError("scow: a streaming write task does not know its batch id")
        sink = sink_of(self.options, task.query)
        return stage(self.options, sink, task.batch, iterator, task.query)

    def _sink(self, messages: list[Any]) -> tuple[str | None, str | None]:
        staged = {(m.sink, m.query) for m in messages if isinstance(m, ScowCommit)}
        if len(staged) > 1:
            raise RuntimeError(f"scow: one batch staged under several sinks: {sorted(staged)}")
        return staged.pop() if staged else (None, None)

    def commit(self, messages: list[Any], batchId: int) -> None:
        sink, query = self._sink(messages)
        if sink is None:
            return  # no task ran: nothing was staged, and a replay of nothing is nothing
        commit(self.options, sink, batchId, messages, query)

    def abort(self, messages: list[Any], batchId: int) -> None:
        sink, _query = self._sink(messages)
        if sink is not None:  # else the staging TTL drops what failed tasks left
            abort(self.options, sink, batchId)


# --------------------------------------------------------------------------- the source


class ScowDataSource(DataSource):
    """`format("scow")`: stream queues of a Scow broker (see the module docstring)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(dict(options))
        self.parsed = Options.parse(options)

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> ScowBatchReader:
        self.parsed.need_queues()
        return ScowBatchReader(self.parsed)

    def streamReader(self, schema: StructType) -> ScowStreamReader:
        return ScowStreamReader(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> ScowBatchWriter:
        check_write_schema(schema.fieldNames(), self.parsed.key_column)
        return ScowBatchWriter(self.parsed)

    def streamWriter(self, schema: StructType, overwrite: bool) -> ScowStreamWriter:
        check_write_schema(schema.fieldNames(), self.parsed.key_column)
        return ScowStreamWriter(self.parsed)
