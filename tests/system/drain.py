"""The final drain: after a schedule, take every message every queue still holds.

What it takes is recorded as `drained` events (like a consumer's `delivered`), so the
checker sees one history. A stream queue is read from `first` (reading removes nothing); a
subscription queue is reached by its fully qualified name `address::queue`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proton import Timeout, symbol
from proton.reactor import Filter
from proton.utils import BlockingConnection

from tests.system.broker import SystemBroker
from tests.system.records import EventLog
from tests.system.topology import body_digest

STREAM_OFFSET = symbol("scow:stream-offset")
#: Drained last: expiry and dead-lettering during the drain still feed them.
LAST = ("ExpiryQueue", "DLA")


def _queues(broker: SystemBroker) -> list[dict[str, Any]]:
    return [q for q in broker.api("/api/queues") if not q.get("temporary")]


def _record(log: EventLog, queue: dict[str, Any], message: Any) -> None:
    props = message.properties or {}
    annotations = message.annotations or {}
    orig = annotations.get(symbol("x-opt-ORIG-QUEUE"))
    fields: dict[str, Any] = {
        "lane": props.get("lane"),
        "queue": queue["name"],
        "id": str(message.id),
        "producer": props.get("producer"),
        "seq": props.get("seq"),
        "count": message.delivery_count,
    }
    if orig is not None:
        fields["orig_queue"] = str(orig)
    if "k" in props:
        fields["k"] = props["k"]
    if queue.get("queue-type") == "stream":
        fields["sequence"] = annotations.get(symbol("x-opt-sequence-number"))
    if "sha" in props:
        fields["intact"] = body_digest(message.body) == props["sha"]
    log.write("drained", **fields)


def _drain_queue(
    conn: BlockingConnection,
    broker: SystemBroker,
    queue: dict,
    log: EventLog,
    stuck: dict[str, int],
) -> int:
    name = queue["name"]
    stream = queue.get("queue-type") == "stream"
    if stream:
        receiver = conn.create_receiver(
            name, name=f"drain-{name}", credit=200, options=Filter({STREAM_OFFSET: "first"})
        )
        want = int(queue.get("message-count", 0))
    else:
        address = f"{queue['address']}::{name}" if queue["address"] != name else name
        receiver = conn.create_receiver(address, name=f"drain-{name}", credit=200)
        want = -1
    got = 0
    quiet_since = time.monotonic()
    try:
        while True:
            try:
                message = receiver.receive(timeout=0.3)
            except Timeout:
                if stream:
                    # the stream says it holds `want`; what cannot be read in 3 s is not there
                    if got >= want:
                        break
                    if time.monotonic() - quiet_since > 3:
                        stuck[name] = want - got
                        break
                    continue
                left = broker.api(f"/api/queues/{name}").get("message-count")
                if not left:
                    break
                if time.monotonic() - quiet_since > 10:
                    stuck[name] = left  # held, yet nothing comes: a finding of its own
                    break
                continue
            _record(log, queue, message)
            receiver.accept()
            got += 1
            quiet_since = time.monotonic()
    finally:
        with contextlib.suppress(Exception):
            receiver.close() if not stream else receiver.link.detach()
    return got


@dataclass
class Drained:
    #: Messages taken per queue.
    taken: dict[str, int] = field(default_factory=dict)
    #: Queues that reported messages none of which could be received (how many).
    stuck: dict[str, int] = field(default_factory=dict)


def _pending(queue: dict[str, Any], drained: dict[str, int], streams: bool) -> bool:
    name = queue["name"]
    if queue.get("queue-type") == "stream":
        return streams and name not in drained
    return bool(queue.get("message-count")) and (name not in drained or name in LAST)


def drain_all(
    broker: SystemBroker, log_path: Path, timeout: float = 300, *, streams: bool = True
) -> Drained:
    """Take every message of every queue, and read every stream from `first` (unless
    `streams` is false: a stream read twice would hand out its messages twice)."""
    log = EventLog(log_path, "drain")
    result = Drained()
    drained = result.taken
    deadline = time.monotonic() + timeout
    conn = BlockingConnection(broker.url, timeout=30, container_id="system-drain")
    try:
        for _ in range(4):  # expiry and dead letters may refill the last queues
            queues = sorted(_queues(broker), key=lambda q: (q["name"] in LAST, q["name"]))
            pending = [q for q in queues if _pending(q, drained, streams)]
            if not pending:
                break
            for queue in pending:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the final drain took longer than {timeout}s")
                if queue["name"] in result.stuck:
                    continue
                drained[queue["name"]] = drained.get(queue["name"], 0) + _drain_queue(
                    conn, broker, queue, log, result.stuck
                )
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        log.close()
    return result
