"""Export a broker's durable data to a portable file, and import it into a fresh one.

The export format (version 1) is JSON Lines, UTF-8, one object per line:

  {"format": "scow-export", "version": 1, "created": <ms since epoch>}
  {"type": "address", "name": str, "routing-types": ["ANYCAST"|"MULTICAST", ...],
   "auto-created": bool}
  {"type": "queue", "name": str, "address": str, "routing-type": str, "filter": str|null,
   "auto-created": bool, "queue-type": str, "max-consumers": int, "exclusive": bool,
   "arguments": {...}}
  {"type": "message", "id": int, "address": str, "expiration": int (ms, 0 = never),
   "priority": int, "queues": {"<queue name>": <delivery count>, ...},
   "data": "<base64 of the encoded message, exactly as the producer sent it>",
   "paged": true (only for messages that were in their address's pages),
   "packed": true (only for a transaction's pack the broker routed whole, `PackedRows`:
   a stream stores it as its rows; a file written before it was exported has none),
   "large": true, "head-size": n, "size": n (only for large messages: the data's first
   head-size bytes are the sections before the body; import writes it to a large message
   file; size is the message's bytes, which its data must hold)}
  {"type": "duplicate-id", "address": str, "id": "<base64 of the id's key: a tag byte,
   1 string (UTF-8) or 2 binary, then the id>"}
  {"type": "stream", "queue": str, "cursors": {"<name>": [<sequence>, <last used ms>]}}
  {"type": "stream-record", "queue": str, "sequence": int, "enqueued": int (ms),
   "data": "<base64 of the message as the stream delivers it>"}
  {"type": "end", "addresses": n, "queues": n, "messages": n, "duplicate-ids": n,
   "streams": n, "stream-records": n}

Addresses come before queues, queues before messages: the journal's in journal order,
then the paged ones in page order. An import puts paged messages back into pages when
the importer can (the paging plugin's tools), otherwise into the journal.
The duplicate-id caches come last, each address's oldest id first, so that producers
resending to the imported broker are still deduplicated (an import keeps them whatever
its persist-id-cache; a broker with it false drops them at its start). The ids of a
record an earlier version left partly pushed out of its cache come too; the importing
broker drops them again at its start, a generation at a time. A file without
them (written before they were exported) imports as one with empty caches.
Streams (queues of queue-type "stream", whose records live in their own store) come
after them, each with its cursors and then its records in sequence order; an import
appends them with their sequence numbers and enqueue times to the importer's stream
store, whichever it is (so export and import move streams between segment files and a
database). A journaled message that a stream's store already holds (a crash came between
the two) is exported once, as the stream's record: its message line leaves that stream
out of its queues, and goes when none is left. So is every row of a committed pack
("packed") that the store holds: a pack whose rows it holds all is left out so, and for a
stream that holds its first rows the line carries a pack of the other rows only (with
the pack's header), on a line of its own if another of its queues needs the whole pack.
A large message's line holds its whole message (its file's body after its head), so
export and import hold one such message in memory at a time. Its size lets an import
refuse a body cut short (a file written before it was exported is not checked so).
Ids are not portable: an import gives everything new ids. The trailing "end" line lets an
import tell a complete file from a truncated one. An import reads the file twice: first
to check every line that can be checked without writing (its counts against the "end"
line, each large message's size, the ids, the stream records), so that a bad file is
refused with nothing imported; then to write it. A write the target refuses stops the
import with an ExportError naming the line; `scow.core.unfinished_import` then empties
the target. Prepared (undecided) transactions are not exported.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any, Protocol

from scow.core.duplicates import current_key, split_keys
from scow.core.interfaces import StreamContents, StreamStore
from scow.core.large_messages import LargeBody, LargeHead, LargeMessageStore
from scow.core.message import PackedRows
from scow.core.storage import Recovered, RecoveredMessage, StorageManager
from scow.core.unfinished_import import first_line

FORMAT = "scow-export"
VERSION = 1


#: Records read from a stream's store per read while exporting, and appended per append
#: while importing.
STREAM_BATCH = 1000
STREAM_TYPE = "stream"


class OpenStream(Protocol):
    """How export and import reach the stores of stream queues (the spark plugin's
    `StreamOpener`)."""

    def __call__(self, queue: str, arguments: Mapping[str, Any]) -> StreamStore:
        """The (unopened) store of stream queue `queue` with its `arguments`."""
        ...

    def rows_left(self, recent_ids: set[int], pack_id: int, data: bytes) -> bytes | None:
        """What a stream's store (`recent_ids`: its `StreamContents.recent_ids`, from
        which the ids found may be taken out) lacks of the committed pack `data`
        (`PackedRows`) whose message id is `pack_id`: `data` when none of its rows, None
        when all of them, else a pack of the rows it lacks."""
        ...


#: `OpenStream.rows_left`, on its own.
RowsLeft = Callable[[set[int], int, bytes], bytes | None]


class ExportError(Exception):
    """The file is not an export this version can read, or it is incomplete."""


def _streams(recovered: Recovered, open_stream: OpenStream | None) -> list[StreamStore]:
    if open_stream is None:
        return []
    return [
        open_stream(queue["name"], queue.get("arguments", {}))
        for queue in recovered.queues
        if queue.get("queue-type") == STREAM_TYPE
    ]


def export_lines(
    recovered: Recovered,
    paged: Iterable[RecoveredMessage] = (),
    streams: Iterable[StreamStore] = (),
    large_messages: LargeMessageStore | None = None,
    rows_left: RowsLeft | None = None,
) -> Iterator[dict[str, Any]]:
    """The lines of an export (see the module docstring); `streams` are opened and read
    here (and closed by the caller); `large_messages` holds large messages' bodies;
    `rows_left` (`OpenStream.rows_left`) says what of a committed pack a stream's store
    lacks (without it, a pack goes whole to every queue it was routed to)."""
    yield {"format": FORMAT, "version": VERSION, "created": int(time.time() * 1000)}
    stored = {store.name: store.open() for store in streams}
    for address in recovered.addresses:
        yield {"type": "address", **{k: v for k, v in address.items() if k != "id"}}
    names = {}
    for queue in recovered.queues:
        names[queue["id"]] = queue["name"]
        yield {"type": "queue", **{k: v for k, v in queue.items() if k != "id"}}
    exported = 0
    for message in itertools.chain(recovered.messages, paged):
        for data, queues in _left(message, names, stored, rows_left):
            exported += 1
            yield _message_line(message, data, queues, large_messages)
    for duplicate in recovered.duplicate_ids:
        yield {
            "type": "duplicate-id",
            "address": duplicate.address,
            "id": base64.b64encode(duplicate.key).decode("ascii"),
        }
    records = 0
    for store in streams:
        yield {"type": "stream", "queue": store.name, "cursors": store.load_cursors()}
        for seq, enqueued, data in _stream_records(store, stored[store.name].next_seq):
            records += 1
            yield {
                "type": "stream-record",
                "queue": store.name,
                "sequence": seq,
                "enqueued": enqueued,
                "data": base64.b64encode(data).decode("ascii"),
            }
    yield {
        "type": "end",
        "addresses": len(recovered.addresses),
        "queues": len(recovered.queues),
        "messages": exported,
        "duplicate-ids": len(recovered.duplicate_ids),
        "streams": len(stored),
        "stream-records": records,
    }


def _left(
    message: RecoveredMessage,
    names: Mapping[int, str],
    stored: Mapping[str, StreamContents],
    rows_left: RowsLeft | None,
) -> list[tuple[bytes, dict[str, int]]]:
    """What of `message` its queues (name -> delivery count) still hold in the journal
    alone, as the data each needs: a stream's store that holds the message (a crash
    came between its append and the journal's delete) needs none of it, and one that
    holds the first rows of a committed pack needs a pack of the others (`rows_left`);
    queues that need the same data share it."""
    packed = message.data.__class__ is PackedRows
    left: dict[bytes, dict[str, int]] = {}
    for qid, count in message.queues.items():
        name = names.get(qid)
        if name is None:
            continue
        store = stored.get(name)
        data: bytes | None = message.data
        if store is not None and packed and rows_left is not None:
            data = rows_left(store.recent_ids, message.id, message.data)
        elif store is not None and message.id in store.recent_ids:
            data = None
        if data is not None:
            left.setdefault(data, {})[name] = count
    return list(left.items())


def _message_line(
    message: RecoveredMessage,
    data: bytes,
    queues: dict[str, int],
    large_messages: LargeMessageStore | None,
) -> dict[str, Any]:
    """The "message" line of `message` for `queues`, holding `data` (its own, or what a
    stream lacks of its pack)."""
    if message.large is not None:
        data = _whole_large_message(message, large_messages)
    line = {
        "type": "message",
        "id": message.id,
        "address": message.address,
        "expiration": message.expiration,
        "priority": message.priority,
        "queues": queues,
        "data": base64.b64encode(data).decode("ascii"),
    }
    if message.paged:
        line["paged"] = True
    if message.data.__class__ is PackedRows:
        line["packed"] = True
    if message.large is not None:
        line["large"] = True
        line["head-size"] = len(message.data)
        line["size"] = len(data)
    return line


def _whole_large_message(message: RecoveredMessage, store: LargeMessageStore | None) -> bytes:
    """A large message's head followed by the body its store holds."""
    assert message.large is not None
    file_id, head_size, length = message.large
    if store is None:
        raise ExportError(f"message {message.id} is large: where its body is is not known")
    try:
        body = b"".join(LargeBody(store, file_id, head_size, length).chunks())
    except OSError as exc:
        raise ExportError(
            f"message {message.id}: its body ({store.describe(file_id)}): {exc}"
        ) from None
    return message.data + body


def _stream_records(store: StreamStore, end: int) -> Iterator[tuple[int, int, bytes]]:
    seq = 0
    while seq < end:
        got, seq = store.read(seq, end, STREAM_BATCH)
        if not got:
            return
        yield from got


def export(
    storage: StorageManager,
    out: IO[str],
    paged: Callable[[Recovered], Iterable[RecoveredMessage]] | None = None,
    open_stream: OpenStream | None = None,
    large_messages: LargeMessageStore | None = None,
) -> dict[str, int]:
    """Write everything `storage` holds (and `paged(recovered)`, and the records of its
    streams, whose stores `open_stream` builds) to `out`; returns counts. `large_messages`
    holds the large messages' bodies."""
    end: dict[str, Any] = {}
    recovered = storage.load()
    streams = _streams(recovered, open_stream)
    try:
        for line in export_lines(
            recovered,
            paged(recovered) if paged else (),
            streams,
            large_messages,
            open_stream.rows_left if open_stream else None,
        ):
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
            end = line
    finally:
        for store in streams:
            store.close()
    return {k: v for k, v in end.items() if k != "type"}


def import_(
    storage: StorageManager,
    source: IO[str],
    paged: Callable[[RecoveredMessage], None] | None = None,
    open_stream: OpenStream | None = None,
    large_messages: LargeMessageStore | None = None,
    begin: Callable[[], None] | None = None,
) -> dict[str, int]:
    """Load an export into `storage`, which must be empty; returns the counts read.

    `source` is read twice (see the module's doc: a bad file is refused before anything
    is written), so it must be seekable. Paged messages go to `paged` when given (it
    writes them into pages), else to the journal like the others. Stream records go to
    the stores `open_stream` builds; a file that holds some needs it (ExportError
    otherwise). Large messages get their body in `large_messages`. `begin()` runs once
    the file passed its checks, before the first write (`scow.core.unfinished_import`
    undoes what follows it). A write the target refuses raises ExportError naming the line.
    """
    existing = storage.load()
    if (
        existing.queues
        or existing.addresses
        or existing.messages
        or existing.duplicate_ids
        or existing.prepared
    ):
        raise ExportError("the target data dir is not empty: import needs a fresh one")
    if not source.seekable():
        raise ExportError("an import reads its file twice: give a file, not a pipe")
    counts = _check(source)
    source.seek(0)
    if begin is not None:
        begin()
    streams = _StreamImporter(open_stream)
    try:
        _import(storage, source, paged, streams, large_messages)
    finally:
        streams.close()
    return counts


#: What each line type counts as in the "end" line.
_COUNTED = {
    "address": "addresses",
    "queue": "queues",
    "message": "messages",
    "duplicate-id": "duplicate-ids",
    "stream": "streams",
    "stream-record": "stream-records",
}


def _lines(source: IO[str]) -> Iterator[tuple[str, dict[str, Any], int]]:
    """(type, line without its type, line number) for each line after the header."""
    header = _parse(source.readline(), 1)
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ExportError(
            f"not a {FORMAT} version {VERSION} file (found format={header.get('format')!r}, "
            f"version={header.get('version')!r})"
        )
    for number, text in enumerate(source, start=2):
        line = _parse(text, number)
        kind = line.pop("type", None)
        if kind != "end" and kind not in _COUNTED:
            raise ExportError(f"line {number}: unknown record type {kind!r}")
        yield kind, line, number


def _check(source: IO[str]) -> dict[str, int]:
    """Read the whole file, checking what can be checked without writing; returns its
    counts. Raises ExportError on the first line found wrong."""
    counts = dict.fromkeys(_COUNTED.values(), 0)
    queues: dict[str, bool] = {}  # name -> a stream's
    last_sequence: dict[str, int] = {}
    complete = False
    for kind, line, number in _lines(source):
        if complete:
            raise ExportError(f"line {number}: a {kind!r} line after the 'end' line")
        if kind == "end":
            for added in ("duplicate-ids", "streams", "stream-records"):
                line.setdefault(added, 0)  # a file from before they were exported
            if line != counts:
                raise ExportError(f"line {number}: the file says {line} but holds {counts}")
            complete = True
            continue
        if kind == "queue":
            if not isinstance(line.get("name"), str):
                raise ExportError(f"line {number}: a queue needs a name")
            queues[line["name"]] = line.get("queue-type") == STREAM_TYPE
        elif kind == "message":
            missing = [key for key in ("address", "expiration", "queues") if key not in line]
            if missing or not isinstance(line["queues"], dict):
                raise ExportError(
                    f"line {number}: a message needs address, expiration and a queues object"
                )
            unknown = [name for name in line["queues"] if name not in queues]
            if unknown:
                raise ExportError(f"line {number}: message names unknown queue {unknown[0]!r}")
            _message_data(line, number)
        elif kind == "duplicate-id":
            _duplicate_id(line, number)
        elif kind == "stream":
            _stream_name(line, queues, number)
            _stream_cursors(line, number)
        elif kind == "stream-record":
            name = _stream_name(line, queues, number)
            sequence = _stream_record(line, number)[0]
            if name in last_sequence and sequence <= last_sequence[name]:
                raise ExportError(
                    f"line {number}: stream {name!r}: sequence {sequence} after "
                    f"{last_sequence[name]}: records must come in ascending order"
                )
            last_sequence[name] = sequence
        counts[_COUNTED[kind]] += 1
    if not complete:
        raise ExportError("the file is truncated: its closing 'end' line is missing")
    return counts


def _import(
    storage: StorageManager,
    source: IO[str],
    paged: Callable[[RecoveredMessage], None] | None,
    streams: _StreamImporter,
    large_messages: LargeMessageStore | None,
) -> None:
    """Write a file `_check` found whole into `storage`; ExportError naming the line at
    which the target refused a write. Stores that write on threads of their own (the
    journals) report a refusal with a later line: the one being written when it came."""
    queue_ids: dict[str, int] = {}
    number = 1
    try:
        for kind, line, number in _lines(source):
            _import_line(storage, kind, line, number, queue_ids, paged, streams, large_messages)
        streams.flush()
        storage.flush()
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"line {number}: not written: {first_line(exc)}") from exc


def _import_line(
    storage: StorageManager,
    kind: str,
    line: dict[str, Any],
    number: int,
    queue_ids: dict[str, int],
    paged: Callable[[RecoveredMessage], None] | None,
    streams: _StreamImporter,
    large_messages: LargeMessageStore | None,
) -> None:
    if kind == "address":
        storage.store_address(storage.next_id(), line)
    elif kind == "queue":
        queue_ids[line["name"]] = record_id = storage.next_id()
        storage.store_queue(record_id, line)
        streams.declared(line)
    elif kind == "message":
        _import_message(storage, line, queue_ids, number, paged, large_messages)
    elif kind == "duplicate-id":
        storage.store_duplicate_ids(
            storage.next_id(), line["address"], [_duplicate_id(line, number)]
        )
    elif kind == "stream":
        streams.cursors(line, number)
    elif kind == "stream-record":
        streams.record(line, number)


def _message_data(line: Mapping[str, Any], number: int) -> bytes:
    """A message line's data (`PackedRows` when it is marked packed); a large message's
    must hold its size, and its head-size must fall within it."""
    try:
        data = base64.b64decode(line["data"], validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(f"line {number}: message {line.get('id')}: bad data ({exc})") from None
    packed = line.get("packed", False)
    if packed is not False:
        if packed is not True or line.get("large") or line.get("paged"):
            raise ExportError(
                f"line {number}: message {line.get('id')}: packed must be true or absent, "
                f"and a packed message is neither large nor paged (found packed={packed!r}, "
                f"large={line.get('large')!r}, paged={line.get('paged')!r})"
            )
        return PackedRows(data)
    if not line.get("large"):
        return data
    size, head_size = line.get("size"), line.get("head-size")
    if size is not None and size != len(data):
        raise ExportError(
            f"line {number}: large message {line.get('id')}: its data holds {len(data)} "
            f"bytes, its size says {size}: the export was cut short or damaged"
        )
    if not isinstance(head_size, int) or not 0 <= head_size <= len(data):
        raise ExportError(
            f"line {number}: a large message needs a head-size between 0 and its "
            f"{len(data)} bytes, not {head_size!r}"
        )
    return data


def _import_message(
    storage: StorageManager,
    line: dict[str, Any],
    queue_ids: dict[str, int],
    number: int,
    paged: Callable[[RecoveredMessage], None] | None,
    large_messages: LargeMessageStore | None,
) -> None:
    qids = {queue_ids[name]: count for name, count in line["queues"].items()}
    message_id = storage.next_id()
    data = _message_data(line, number)
    if line.get("large"):
        data = _import_large(storage, line, data, number, large_messages)
    if line.get("paged") and paged is not None:
        address, expiration = line["address"], line["expiration"]
        priority = line.get("priority", 4)
        large = None
        if isinstance(data, LargeHead):
            body = data.body
            large = (body.file_id, body.head_size, body.length)
        paged(RecoveredMessage(message_id, address, expiration, priority, data, qids, True, large))
        return
    storage.store_message(
        message_id,
        line["address"],
        line["expiration"],
        line.get("priority", 4),
        list(qids),
        data,
        None,
    )
    for qid, count in qids.items():
        if count:
            storage.update_delivery_count(message_id, qid, count)


def _import_large(
    storage: StorageManager,
    line: Mapping[str, Any],
    data: bytes,
    number: int,
    store: LargeMessageStore | None,
) -> LargeHead:
    """Store an imported large message's body, checked whole by its store; its head,
    referring to it."""
    if store is None:
        raise ExportError(f"line {number}: a large message, and no store for its body")
    head_size = line["head-size"]
    view = memoryview(data)
    try:
        return store.write_whole(
            storage.next_id(), view[:head_size].tobytes(), view[head_size:], sync=True
        )
    except OSError as exc:
        raise ExportError(
            f"line {number}: large message {line.get('id')} of {len(data)} bytes not stored: {exc}"
        ) from None


def _stream_name(line: Mapping[str, Any], queues: Mapping[str, bool], number: int) -> str:
    """The stream queue a stream or stream-record line names (declared before it)."""
    name = line.get("queue")
    if not isinstance(name, str) or not queues.get(name):
        raise ExportError(f"line {number}: stream names unknown stream queue {name!r}")
    return name


def _stream_cursors(line: Mapping[str, Any], number: int) -> dict[str, tuple[int, int]]:
    try:
        return {str(n): (int(c[0]), int(c[1])) for n, c in line["cursors"].items()}
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ExportError(f"line {number}: bad stream line ({exc!r})") from None


def _stream_record(line: Mapping[str, Any], number: int) -> tuple[int, int, int, bytes]:
    """A stream-record line as the record its store appends."""
    try:
        return (
            int(line["sequence"]),
            int(line["enqueued"]),
            0,  # no broker message id: nothing in the journal to match it with
            base64.b64decode(line["data"], validate=True),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(f"line {number}: bad stream-record line ({exc!r})") from None


class _StreamImporter:
    """Appends the stream records of an import to the stores of their queues."""

    def __init__(self, open_stream: OpenStream | None) -> None:
        self.open_stream = open_stream
        self.arguments: dict[str, Mapping[str, Any]] = {}
        self.stores: dict[str, StreamStore] = {}
        self.pending: dict[str, list[tuple[int, int, int, bytes]]] = {}

    def declared(self, queue: Mapping[str, Any]) -> None:
        if queue.get("queue-type") == STREAM_TYPE:
            self.arguments[queue["name"]] = queue.get("arguments", {})

    def _store(self, line: Mapping[str, Any], number: int) -> StreamStore:
        name = line["queue"]
        store = self.stores.get(name)
        if store is not None:
            return store
        if self.open_stream is None:
            raise ExportError(
                f"line {number}: the file holds streams, and no stream store is enabled to "
                "import them into (enable the spark plugin)"
            )
        store = self.stores[name] = self.open_stream(name, self.arguments[name])
        store.open()
        return store

    def cursors(self, line: dict[str, Any], number: int) -> None:
        self._store(line, number).save_cursors(_stream_cursors(line, number))

    def record(self, line: dict[str, Any], number: int) -> None:
        name = self._store(line, number).name
        batch = self.pending.setdefault(name, [])
        batch.append(_stream_record(line, number))
        if len(batch) >= STREAM_BATCH:
            self._flush(name)

    def _flush(self, name: str) -> None:
        batch = self.pending.pop(name, [])
        if batch:
            self.stores[name].append(batch)

    def flush(self) -> None:
        """Append the records still held back."""
        for name in list(self.pending):
            self._flush(name)

    def close(self) -> None:
        for store in self.stores.values():
            store.close()


def _duplicate_id(line: Mapping[str, Any], number: int) -> bytes:
    """A duplicate-id line's key, in its current encoding."""
    try:
        address, key = line["address"], base64.b64decode(line["id"], validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(f"line {number}: bad duplicate-id line ({exc})") from None
    if not isinstance(address, str) or not key:
        raise ExportError(f"line {number}: a duplicate-id needs an address and an id")
    key = current_key(key)  # an export of an earlier version holds keys as they were then
    try:
        whole = split_keys(key) == [key]
    except ValueError:
        whole = False
    if not whole:
        raise ExportError(
            f"line {number}: id {line['id']!r} is not a duplicate-id key (an id's AMQP "
            f"encoding as str8, str32, vbin8 or vbin32)"
        )
    return key


def _parse(text: str, number: int) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExportError(f"line {number}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ExportError(f"line {number}: expected a JSON object")
    return value
