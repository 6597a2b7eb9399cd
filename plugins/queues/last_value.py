"""Last-value queues: one waiting message per value of a key property.

A message whose key property (`last-value-key`, Artemis; `qpid.last_value_queue_key`,
Qpid) has the value of a waiting message replaces it; the replaced message is
acknowledged (its journal record goes) and never delivered. Messages without the
property are queued as in a FIFO queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scow.core import hookimpl
from scow.core.descriptors import QueueType
from scow.core.message import Entry
from scow.plugins.queues.standard import StandardQueue
from scow.plugins.queues.waiting import LastValue

ARGUMENTS = {
    "last-value-key": "Message property whose value identifies the message to replace.",
    "qpid.last_value_queue_key": "Alias of last-value-key (Qpid).",
}


def check(arguments: Mapping[str, Any]) -> dict[str, Any]:
    checked = dict(arguments)
    alias = checked.pop("qpid.last_value_queue_key", None)
    if alias is not None:
        checked.setdefault("last-value-key", alias)
    key = checked["last-value-key"]
    if not isinstance(key, str) or not key:
        raise ValueError(f"last-value-key = {key!r}: expected the name of a message property")
    return checked


def _queue(spec: Any, broker: Any) -> StandardQueue:
    key = dict(spec.arguments)["last-value-key"]

    def key_of(entry: Entry) -> object:
        return entry.message.lookup()(key)

    return StandardQueue(spec, broker, waiting=LastValue(key_of))


@hookimpl
def scow_register_queue_types() -> list[QueueType]:
    return [
        QueueType(
            "last-value",
            _queue,
            "One waiting message per value of a key property; newer ones replace older",
            selected_by=("last-value-key", "qpid.last_value_queue_key"),
            arguments=ARGUMENTS,
            check=check,
        )
    ]
