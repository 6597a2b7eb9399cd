"""Last-value queues: one waiting message per value of a key property.

A message whose key property (`last-value-key`, Artemis; `qpid.last_value_queue_key`,
Qpid) has the value of a waiting message replaces it; the replaced message is
acknowledged (its journal record goes) and never delivered. Messages without the
property are queued as in a FIFO queue.

On an address that pages, the queue learns at page time which value of each key is the
newest (`Waiting.paged`), so an older one is dropped before anyone sees it. That
knowledge lives in memory only: at a restart the paging recovery, which reads every
record of the pages anyway, asks the queue for each paged message's key (`page_key`,
off the event loop) and hands it the newest id per key (`recovered_paged`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from scow.core import hookimpl
from scow.core.descriptors import QueueType
from scow.core.message import Entry, Message
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


class _Waiting(LastValue):
    def recovered_paged(self, key: object, message_id: int) -> Entry | None:
        """At recovery: `message_id` is the newest paged message with `key` (not None);
        returns an older waiting entry of the key, which it supersedes."""
        slot = ("key", key)
        if self._newest_paged.get(slot, -1) < message_id:
            self._newest_paged[slot] = message_id
        waiting = self._entries.get(slot)
        if waiting is not None and waiting.message.id < message_id:
            return self._entries.pop(slot)
        return None


class LastValueQueue(StandardQueue):
    """A standard queue over a `LastValue` list that relearns, after a restart, which
    values its address's pages hold (see the module's doc)."""

    _messages: _Waiting

    def __init__(self, spec: Any, broker: Any, key_of: Callable[[Entry], object]) -> None:
        super().__init__(spec, broker, waiting=_Waiting(key_of))
        self._key_of = key_of

    def page_key(self, message: Message) -> object:
        """The key of a message read from pages (None: it has none). Reads only the
        message's bytes: safe off the event loop."""
        return self._key_of(message)

    def recovered_paged(self, newest: Mapping[object, int]) -> None:
        """At recovery, before the cursor reads: key -> id of the newest message with it in
        the pages (acknowledged or not). Older values, waiting or read later, are dropped."""
        for key, message_id in newest.items():
            superseded = self._messages.recovered_paged(key, message_id)
            if superseded is not None:
                self._drop(superseded)


def _queue(spec: Any, broker: Any) -> StandardQueue:
    key = dict(spec.arguments)["last-value-key"]

    def key_of(entry: Entry) -> object:
        return entry.message.lookup()(key)

    return LastValueQueue(spec, broker, key_of)


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
