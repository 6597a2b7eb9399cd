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
   "paged": true (only for messages that were in their address's pages)}
  {"type": "duplicate-id", "address": str, "id": "<base64 of the id's key: a tag byte,
   1 string (UTF-8) or 2 binary, then the id>"}
  {"type": "end", "addresses": n, "queues": n, "messages": n, "duplicate-ids": n}

Addresses come before queues, queues before messages: the journal's in journal order,
then the paged ones in page order. An import puts paged messages back into pages when
the importer can (the paging plugin's tools), otherwise into the journal.
The duplicate-id caches come last, each address's oldest id first, so that producers
resending to the imported broker are still deduplicated (an import keeps them whatever
its persist-id-cache; a broker with it false drops them at its start). A file without
them (written before they were exported) imports as one with empty caches.
Ids are not portable: an import gives everything new ids. The trailing "end" line lets an
import tell a complete file from a truncated one. Prepared (undecided) transactions are
not exported.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from scow.core.storage import Recovered, RecoveredMessage, StorageManager

FORMAT = "scow-export"
VERSION = 1


class ExportError(Exception):
    """The file is not an export this version can read, or it is incomplete."""


def export_lines(
    recovered: Recovered, paged: Iterable[RecoveredMessage] = ()
) -> Iterator[dict[str, Any]]:
    yield {"format": FORMAT, "version": VERSION, "created": int(time.time() * 1000)}
    for address in recovered.addresses:
        yield {"type": "address", **{k: v for k, v in address.items() if k != "id"}}
    names = {}
    for queue in recovered.queues:
        names[queue["id"]] = queue["name"]
        yield {"type": "queue", **{k: v for k, v in queue.items() if k != "id"}}
    exported = 0
    for message in itertools.chain(recovered.messages, paged):
        queues = {names[qid]: count for qid, count in message.queues.items() if qid in names}
        if not queues:
            continue
        exported += 1
        line = {
            "type": "message",
            "id": message.id,
            "address": message.address,
            "expiration": message.expiration,
            "priority": message.priority,
            "queues": queues,
            "data": base64.b64encode(message.data).decode("ascii"),
        }
        if message.paged:
            line["paged"] = True
        yield line
    for duplicate in recovered.duplicate_ids:
        yield {
            "type": "duplicate-id",
            "address": duplicate.address,
            "id": base64.b64encode(duplicate.key).decode("ascii"),
        }
    yield {
        "type": "end",
        "addresses": len(recovered.addresses),
        "queues": len(recovered.queues),
        "messages": exported,
        "duplicate-ids": len(recovered.duplicate_ids),
    }


def export(
    storage: StorageManager,
    out: IO[str],
    paged: Callable[[Recovered], Iterable[RecoveredMessage]] | None = None,
) -> dict[str, int]:
    """Write everything `storage` holds (and `paged(recovered)`) to `out`; returns counts."""
    end: dict[str, Any] = {}
    recovered = storage.load()
    for line in export_lines(recovered, paged(recovered) if paged else ()):
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
        end = line
    return {k: v for k, v in end.items() if k != "type"}


def import_(
    storage: StorageManager,
    source: IO[str],
    paged: Callable[[RecoveredMessage], None] | None = None,
) -> dict[str, int]:
    """Load an export into `storage`, which must be empty; returns the counts read.

    Paged messages go to `paged` when given (it writes them into pages), else to the
    journal like the others.
    """
    existing = storage.load()
    if existing.queues or existing.addresses or existing.messages or existing.duplicate_ids:
        raise ExportError("the target data dir is not empty: import needs a fresh one")
    header = _parse(source.readline(), 1)
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ExportError(
            f"not a {FORMAT} version {VERSION} file (found format={header.get('format')!r}, "
            f"version={header.get('version')!r})"
        )
    queue_ids: dict[str, int] = {}
    counts = {"addresses": 0, "queues": 0, "messages": 0, "duplicate-ids": 0}
    complete = False
    for number, text in enumerate(source, start=2):
        line = _parse(text, number)
        kind = line.pop("type", None)
        if kind == "address":
            storage.store_address(storage.next_id(), line)
            counts["addresses"] += 1
        elif kind == "queue":
            queue_ids[line["name"]] = record_id = storage.next_id()
            storage.store_queue(record_id, line)
            counts["queues"] += 1
        elif kind == "message":
            _import_message(storage, line, queue_ids, number, paged)
            counts["messages"] += 1
        elif kind == "duplicate-id":
            _import_duplicate_id(storage, line, number)
            counts["duplicate-ids"] += 1
        elif kind == "end":
            line.setdefault("duplicate-ids", 0)  # a file from before they were exported
            complete = line == counts
            if not complete:
                raise ExportError(f"line {number}: the file says {line} but holds {counts}")
        else:
            raise ExportError(f"line {number}: unknown record type {kind!r}")
    if not complete:
        raise ExportError("the file is truncated: its closing 'end' line is missing")
    storage.flush()
    return counts


def _import_message(
    storage: StorageManager,
    line: dict[str, Any],
    queue_ids: dict[str, int],
    number: int,
    paged: Callable[[RecoveredMessage], None] | None,
) -> None:
    try:
        qids = {queue_ids[name]: count for name, count in line["queues"].items()}
    except KeyError as exc:
        raise ExportError(f"line {number}: message names unknown queue {exc}") from None
    message_id = storage.next_id()
    if line.get("paged") and paged is not None:
        data = base64.b64decode(line["data"])
        address, expiration = line["address"], line["expiration"]
        priority = line.get("priority", 4)
        paged(RecoveredMessage(message_id, address, expiration, priority, data, qids, True))
        return
    storage.store_message(
        message_id,
        line["address"],
        line["expiration"],
        line.get("priority", 4),
        list(qids),
        base64.b64decode(line["data"]),
        None,
    )
    for qid, count in qids.items():
        if count:
            storage.update_delivery_count(message_id, qid, count)


def _import_duplicate_id(storage: StorageManager, line: dict[str, Any], number: int) -> None:
    try:
        address, key = line["address"], base64.b64decode(line["id"], validate=True)
    except (KeyError, ValueError) as exc:
        raise ExportError(f"line {number}: bad duplicate-id line ({exc})") from None
    if not isinstance(address, str) or not key:
        raise ExportError(f"line {number}: a duplicate-id needs an address and an id")
    storage.store_duplicate_id(storage.next_id(), address, key)


def _parse(text: str, number: int) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExportError(f"line {number}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ExportError(f"line {number}: expected a JSON object")
    return value
