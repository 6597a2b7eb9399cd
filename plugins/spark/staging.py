"""Exactly-once writes: a staging area per (sink, batch, partition, attempt), committed
atomically by the writer's driver.

A Spark task asks `$management` to STAGE its part of a batch and gets the address of a
staging queue (type `stream-staging`: it refuses consumers, so nobody sees what is
staged). It publishes there; the broker journals those messages like any others. The
driver's COMMIT names the (partition, attempt) pairs that succeeded: in one broker
transaction (one journal transaction) their messages are sent on to their addresses (the
message's `to`, else the sink's address) and taken out of staging, and a marker message
recording "sink S committed batch B" replaces the sink's previous marker in the durable
queue `MARKERS`. So after any crash either the whole batch and its marker are there or
neither is; a COMMIT of a batch at or below the sink's marker changes nothing. ABORT, a
commit (for the other attempts of its batch) and `staging-ttl` discard orphans.

COMMIT answers 202 as soon as the transaction is under way: a batch of more than
`COMMIT_SLICE` rows is routed a slice per pass of the loop (`Broker.commit`). READ lists
it under `committing` until it is durable, then as `committed-batch`, or under `failed`
with the reason when a slice failed, once the batch is back in staging (until then it is
`committing` and `rolling-back`).

A STAGE of a (sink, batch, partition, attempt) staged before starts it afresh: what is
there came from a task of a driver that died (a restarted query runs its batch again with
the same numbers), and committing it beside the new rows would write them twice. Staged
rows carry the `_AMQ_DUPL_ID` the connector gives them (see `configure`).

STAGE's answer offers packs (`pack-bytes`): a task may stage its rows several to a message
(`records.pack`), which a commit sends on as the rows they hold. Staging a row costs the
broker a transfer, a journal record and an acknowledgement; in packs, that is paid once
per pack rather than once per row.

A streaming query's STAGE and COMMIT name the query (Spark's query id, kept in its
checkpoint), and the marker records it. A batch at or below the marker from another query
is refused, not taken for a replay: that query's batch ids are not the ones the marker
counts (a new checkpoint numbers from 0 again), and ignoring its batches would drop its rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from scow.core.duplicates import id_key
from scow.core.large_messages import with_body
from scow.core.message import MessageRef
from scow.core.model import (
    BrokerError,
    InvalidField,
    NotAllowed,
    NotFound,
    ResourceLimitExceeded,
    RoutingType,
)
from scow.plugins.queues.standard import StandardQueue
from scow.plugins.spark.records import (
    DURABLE_HEADER,
    NO_ID,
    PACK_PREFIX,
    MalformedPack,
    id_value_at,
    is_pack,
    rows_in,
    spans,
    unpack,
)
from scow.protocols.amqp.codec import MessageInfo, encode_message, parse_header

if TYPE_CHECKING:
    from scow.core.address_settings import AddressSettingsRepository
    from scow.core.broker import Broker, Transaction
    from scow.core.interfaces import Consumer

log = structlog.get_logger("scow.spark")

STAGING_TYPE = "stream-staging"
STAGING_PREFIX = "$scow.staging."
MARKERS = "$scow.sinks"
#: Staged messages of a batch nobody committed or aborted are dropped after this (ms).
DEFAULT_STAGING_TTL = 3600 * 1000
#: The pack size STAGE offers: below the default `min-large-message-size` (100 KiB), so a
#: pack is staged as an ordinary message (under a lower threshold, as a large one, which a
#: commit reads back).
STAGED_PACK_BYTES = 32 << 10

#: The address settings pattern of every staging address.
STAGING_ADDRESSES = f"{STAGING_PREFIX}#"

STAGING_ARGUMENTS = {
    "to": "The address staged messages go to at commit when they name none themselves.",
}


class StagingQueue(StandardQueue):
    """A queue nobody consumes from: messages leave it only through `take`."""

    def __init__(self, spec: Any, broker: Broker) -> None:
        super().__init__(spec, broker)
        self.created = time.monotonic()

    def add_consumer(self, consumer: Consumer) -> None:
        raise NotAllowed(f"queue '{self.name}' is a staging area: it cannot be consumed")

    def acknowledge(self, ref: MessageRef) -> None:
        if ref.consumer is None:  # taken by a commit, never delivered
            self.memory_bytes -= len(ref.message.data)
            self.messages_acknowledged += 1
            return
        super().acknowledge(ref)


def configure(settings: AddressSettingsRepository) -> None:
    """Staging addresses keep no duplicate ids (unless the config sets them a cache).

    Staged rows carry the `_AMQ_DUPL_ID` of the address a commit sends them to, where it
    counts. A staging address is new for every task attempt, so its own cache would only
    journal ids nobody resends there, and keep them after the address has gone.
    """
    if settings.explicit(STAGING_ADDRESSES) is None:
        settings.add(STAGING_ADDRESSES, {"id-cache-size": 0})


def staging_name(sink: str, batch: int, partition: int, attempt: int) -> str:
    return f"{STAGING_PREFIX}{sink}.{batch}.{partition}.{attempt}"


def _int(name: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidField(f"{name} = {value!r}: expected an integer") from None
    if number < 0:
        raise InvalidField(f"{name} = {value!r}: expected 0 or more")
    return number


def _sink_name(sink: str) -> str:
    if not sink or "." in sink or any(c.isspace() for c in sink):
        raise InvalidField(f"sink {sink!r}: expected a non-empty name without dots or spaces")
    return sink


class Sinks:
    """Every sink's committed batch, and the commits in progress."""

    def __init__(self, broker: Broker, ttl_ms: int = DEFAULT_STAGING_TTL) -> None:
        self.broker = broker
        self.ttl_ms = ttl_ms
        self.committed: dict[str, int] = {}
        #: the query that committed each sink's last batch (None: a batch write, or a marker
        #: older than queries were recorded)
        self.owners: dict[str, str | None] = {}
        self.committing: set[tuple[str, int]] = set()
        #: why a commit failed after COMMIT answered (a large one is done in slices, see
        #: `Broker.commit`), by (sink, batch), for READ to tell the driver
        self.failed: dict[tuple[str, int], str] = {}
        #: the failed commits (also `committing`) whose messages are not all back yet
        self.rolling_back: set[tuple[str, int]] = set()
        self._loaded = False

    def load(self) -> None:
        """Create the markers queue if needed (at the first use of any sink, so brokers
        that never write through a sink do not get one) and read every sink's committed
        batch."""
        if self._loaded:
            return
        queue = self.broker.queues.get(MARKERS)
        if queue is None:
            queue = self.broker.declare_queue(
                MARKERS, routing_type="ANYCAST", arguments={"x-queue-type": STAGING_TYPE}
            )
        for entry in queue.waiting():
            marker = json.loads(MessageInfo(entry.message.data).application_properties["marker"])
            sink, batch = marker["sink"], marker["batch"]
            if batch >= self.committed.get(sink, -1):
                self.committed[sink] = batch
                self.owners[sink] = marker.get("query")
        self._loaded = True

    def _check_query(self, sink: str, batch: int, query: str | None) -> None:
        """Refuse a batch another query's marker would take for a replay of its own."""
        committed = self.committed.get(sink, -1)
        owner = self.owners.get(sink)
        if query is None or owner is None or owner == query or batch > committed:
            return
        raise NotAllowed(
            f"sink {sink!r} has committed batch {committed} (query {owner}); query {query} "
            f"writes batch {batch}, which would be dropped as already written: a query on a "
            "new checkpoint needs a new sinkId (or none: the sink is then named after the "
            "query), or restart it on its old checkpoint"
        )

    # ------------------------------------------------------------------ operations

    def stage(self, sink: str, properties: Mapping[str, Any]) -> dict[str, Any]:
        self.load()
        sink = _sink_name(sink)
        batch = _int("batch", properties.get("batch"))
        partition = _int("partition", properties.get("partition"))
        attempt = _int("attempt", properties.get("attempt", 0))
        to = str(properties.get("to") or "")
        self._check_query(sink, batch, _query(properties))
        name = staging_name(sink, batch, partition, attempt)
        if (sink, batch) in self.committing:
            raise NotAllowed(f"sink {sink!r}: batch {batch} is being committed")
        # Staged before: by a task of a driver that died (a restarted query runs its batch
        # again with the same partition and attempt numbers). What it left is not part of
        # this attempt, so it goes rather than being committed beside this one's rows.
        self.broker.delete_queue(name)
        self.broker.declare_queue(
            name,
            routing_type="ANYCAST",
            arguments={"x-queue-type": STAGING_TYPE, "to": to},
        )
        return {
            "address": name,
            "committed-batch": self.committed.get(sink, -1),
            "pack-bytes": STAGED_PACK_BYTES,
        }

    def read(self, sink: str) -> dict[str, Any]:
        self.load()
        return {
            "sink": sink,
            "committed-batch": self.committed.get(sink, -1),
            "query": self.owners.get(sink),
            "committing": sorted(b for s, b in self.committing if s == sink),
            "rolling-back": sorted(b for s, b in self.rolling_back if s == sink),
            "failed": {str(b): why for (s, b), why in self.failed.items() if s == sink},
        }

    def commit(self, sink: str, properties: Mapping[str, Any], parts: Any) -> tuple[int, str, Any]:
        """Start committing; 202 while the transaction is on its way to disk (READ shows
        the committed batch once it is), 200 when there was nothing left to do."""
        self.load()
        sink = _sink_name(sink)
        batch = _int("batch", properties.get("batch"))
        query = _query(properties)
        self._check_query(sink, batch, query)
        if batch <= self.committed.get(sink, -1):
            self._discard(sink, batch)
            return 200, "OK", {"committed-batch": self.committed[sink], "replayed": True}
        if (sink, batch) in self.committing:
            return 202, "Accepted", {"batch": batch}
        if not isinstance(parts, list):
            raise InvalidField(f"COMMIT of sink {sink!r}: the body must list [partition, attempt]s")
        broker = self.broker
        tx = broker.begin()
        try:
            for part in parts:
                if not isinstance(part, (list, tuple)) or len(part) != 2:
                    raise InvalidField(f"COMMIT part {part!r}: expected [partition, attempt]")
                name = staging_name(
                    sink, batch, _int("partition", part[0]), _int("attempt", part[1])
                )
                queue = broker.queues.get(name)
                if queue is None:
                    raise NotFound(f"sink {sink!r} batch {batch}: nothing staged as {name}")
                if queue.cursor is not None and queue.cursor.backlog:
                    raise ResourceLimitExceeded(
                        f"sink {sink!r} batch {batch}: {name} went to its address's pages "
                        "(more than fits in memory); write smaller batches (fewer rows per "
                        "partition or per trigger) or raise global-max-size"
                    )
                default_to = dict(queue.spec.arguments).get("to") or None
                refs = queue.take()
                tx.acks += refs  # from here a rollback puts them back
                for ref in refs:
                    message = ref.message
                    if message.data.__class__ is not bytes:
                        message.restore()  # flowed to disk meanwhile
                    data = message.data
                    if default_to and data.__class__ is bytes and _PROPERTIES_SECTION not in data:
                        # no row of it has a properties section, so none names its own `to`
                        if data.startswith(_STAGED_PACK):
                            staged = _StagedRows(data, message.format, default_to, name)
                            tx.packed[len(tx.sends)] = staged
                            tx.sends.append((data, default_to, message.format, None))
                        else:
                            tx.sends += [
                                (row, default_to, message.format, None)
                                for row in _rows(message, name)
                            ]
                        continue
                    rows = _rows(message, name)
                    for row in rows:
                        to = _to(row) or default_to
                        if not to:
                            raise InvalidField(
                                f"sink {sink!r}: a staged message names no address and the "
                                "sink has none (set the 'address' option or a 'to' column)"
                            )
                        tx.sends.append((row, to, message.format, None))
            markers = broker.queues[MARKERS]
            tx.acks += markers.take(lambda e: _marker_sink(e) == sink)
            marker = encode_message(
                b"",
                durable=True,
                application_properties={
                    "marker": json.dumps({"sink": sink, "batch": batch, "query": query})
                },
            )
            tx.sends.append((marker, MARKERS, broker.message_format, RoutingType.ANYCAST))
            self.committing.add((sink, batch))
            self.failed.pop((sink, batch), None)
            broker.commit(
                tx,
                lambda: self._committed(sink, batch, query),
                lambda exc: self._failed(sink, batch, tx, exc),
            )
        except BrokerError as exc:
            # what was taken (staged messages, the marker) goes back
            self._roll_back(sink, batch, tx, exc)
            raise
        return 202, "Accepted", {"batch": batch}

    def _committed(self, sink: str, batch: int, query: str | None) -> None:
        self.committing.discard((sink, batch))
        self.failed.pop((sink, batch), None)
        if batch > self.committed.get(sink, -1):
            self.committed[sink] = batch
            self.owners[sink] = query
        self._discard(sink, batch)

    def _failed(self, sink: str, batch: int, tx: Transaction, exc: BrokerError) -> None:
        """A commit failed after COMMIT answered (see `_roll_back`)."""
        log.warning("sink commit failed", sink=sink, batch=batch, error=exc.description)
        self._roll_back(sink, batch, tx, exc)

    def _roll_back(self, sink: str, batch: int, tx: Transaction, exc: BrokerError) -> None:
        """What the failed commit `tx` took goes back to staging, a slice at a time
        (`Broker.rollback`). Until all of it is back the batch stays `committing` (READ
        also lists it `rolling-back`): a COMMIT then answers 202 and changes nothing,
        since it would take only what is back, and its READs report the failure once all
        is. From then READ says why, until the batch is committed."""
        key = (sink, batch)
        self.committing.add(key)
        self.rolling_back.add(key)

        def rolled_back() -> None:
            self.rolling_back.discard(key)
            self.committing.discard(key)
            self.failed[key] = exc.description

        self.broker.rollback(tx, rolled_back)

    def abort(self, sink: str, properties: Mapping[str, Any]) -> int:
        """Discard everything staged for the batch; how many staging queues went."""
        sink = _sink_name(sink)
        return self._discard(sink, _int("batch", properties.get("batch")))

    def _discard(self, sink: str, batch: int) -> int:
        prefix = f"{STAGING_PREFIX}{sink}.{batch}."
        names = [n for n in self.broker.queues if n.startswith(prefix)]
        for name in names:
            self.broker.delete_queue(name)
        return len(names)

    def expire(self) -> int:
        """Drop staging queues older than the TTL (batches nobody committed)."""
        cutoff = time.monotonic() - self.ttl_ms / 1000
        names = [
            name
            for name, queue in self.broker.queues.items()
            if isinstance(queue, StagingQueue)
            and name.startswith(STAGING_PREFIX)
            and queue.created < cutoff
            and not any(name.startswith(f"{STAGING_PREFIX}{s}.{b}.") for s, b in self.committing)
        ]
        for name in names:
            self.broker.delete_queue(name)
        return len(names)


#: How a staged pack the sink commits whole begins: it is journaled like its rows.
_STAGED_PACK = DURABLE_HEADER + PACK_PREFIX
#: Its header's fields as `MessageFormat.inspect` gives them (`PackedSend.header`).
_STAGED_PACK_HEADER = (*parse_header(DURABLE_HEADER)[:2], 0, None)


class _StagedRows:
    """A staged pack committed whole (`Transaction.packed`): a stream appends its rows in
    one write, and the journal holds them as one record until it has."""

    __slots__ = ("address", "data", "format", "rows")

    header = _STAGED_PACK_HEADER

    def __init__(self, data: bytes, fmt: Any, address: str, staging: str) -> None:
        """InvalidField naming `staging` (the queue it was staged in) when its record
        count or sizes do not fit its bytes."""
        self.data = data
        self.format = fmt
        self.address = address
        try:
            self.rows = rows_in(data)
        except MalformedPack as exc:
            raise _malformed(staging, exc) from None

    def unpacked(self) -> list[bytes]:
        rows: list[bytes] = []
        unpack(self.data, rows)
        return rows

    def duplicate_keys(self) -> list[bytes]:
        """The cache keys of its rows' ids: read at a fixed place in the rows the
        connector writes (`records.id_value_at`: a durable header, then properties that
        are the id alone, a string), by the message format's parse in any other."""
        data, keys = self.data, []
        for start, end in spans(data):
            at = None
            if data.startswith(DURABLE_HEADER, start):
                at = id_value_at(data, start + len(DURABLE_HEADER))
            if at == NO_ID:
                continue
            if at is not None and at + 2 <= end and data[at] == _STR8:
                stop = at + 2 + data[at + 1]
                if at + 2 < stop <= end and data[at + 2 : stop].isascii():
                    # a string id's key is its str8 encoding, as it stands in the row
                    keys.append(data[at:stop])
                    continue
            found = self.format.inspect(data[start:end])[3]
            if found is not None:  # `inspect` gives the key of a valid id
                keys.append(found if found.__class__ is bytes else id_key(found, self.address))
        return keys


#: The constructor of a str8 (a string of up to 255 bytes).
_STR8 = 0xA1


def _rows(message: Any, staging: str) -> list[bytes]:
    """The rows a staged message holds: those of a pack, else the message itself;
    InvalidField naming `staging` (its queue) for a pack whose sizes do not fit it."""
    data = message.data
    rows: list[bytes] = []
    # a pack of `min-large-message-size` or more was stored as a large message: its file
    # is read here (on the loop, once, at commit; packs are STAGED_PACK_BYTES at most)
    try:
        if is_pack(data) and unpack(with_body(data, data), rows):
            return rows
    except MalformedPack as exc:
        raise _malformed(staging, exc) from None
    return [data]


def _malformed(staging: str, exc: MalformedPack) -> InvalidField:
    """What a COMMIT answers for a staged pack whose sizes do not fit its bytes."""
    return InvalidField(
        f"{staging}: a staged message is a malformed pack ({exc}); expected "
        "`records.pack`'s layout: each record after its length, filling its data section"
    )


_PROPERTIES_SECTION = b"\x00\x53\x73"


def _to(row: bytes) -> str | None:
    """A row's `to`. Most rows (the connector's body-only ones) have no properties
    section: found without scanning their sections."""
    return MessageInfo(row).to if _PROPERTIES_SECTION in row else None


def _query(properties: Mapping[str, Any]) -> str | None:
    query = properties.get("query")
    return str(query) if query else None


def _marker_sink(entry: Any) -> str | None:
    marker = MessageInfo(entry.message.data).application_properties.get("marker")
    return json.loads(marker)["sink"] if marker else None


def operations(
    sinks: Sinks,
) -> dict[str, Callable[[str, Any, Mapping[str, Any]], tuple[int, str, Any]]]:
    """The `stream-sink` management operations."""
    return {
        "STAGE": lambda name, _, props: (200, "OK", sinks.stage(name, props)),
        "COMMIT": lambda name, body, props: sinks.commit(name, props, body),
        "ABORT": lambda name, _, props: (200, "OK", {"discarded": sinks.abort(name, props)}),
        "READ": lambda name, _, __: (200, "OK", sinks.read(name)),
    }
