"""The waiting lists of queue types: what a queue holds undelivered, in delivery order.

A queue type is the standard queue's dispatch over one of these lists. Each keeps the
entries (messages, or refs that came back) and answers four questions the queue asks:
which comes next (`popleft`), where a released ref goes back (`put_back`), what a
browser has not seen (`newer_than`, in arrival order), and which entries a predicate
takes (`remove_if`). `append` and `put_back` may return an entry the list no longer
holds because a newer one supersedes it (last-value queues); the queue drops it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from scow.core.message import Entry, Message, MessageRef


class Waiting(Protocol):
    #: Whether a new entry can be superseded before it waits (`superseded`).
    may_supersede: bool

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Entry]:
        """In delivery order."""

    def append(self, entry: Entry) -> Entry | None: ...

    def popleft(self) -> Entry: ...

    def put_back(self, ref: MessageRef) -> Entry | None:
        """Return `ref` (released unsettled) to its place; returns an entry it makes
        superfluous (last-value: `ref` itself or an older value of its key), or None."""

    def newer_than(self, message_id: int) -> Iterable[Entry]:
        """Entries that arrived after `message_id`, in arrival order (callers iterate,
        and may stop early: a paged list yields them lazily)."""

    def remove_if(
        self, predicate: Callable[[Entry], bool], stop: Callable[[], bool] | None = None
    ) -> list[Entry]:
        """Remove and return, in delivery order, the entries `predicate` accepts; stop
        early (keeping the rest) once `stop()` is true."""

    def clear(self) -> None: ...

    def superseded(self, entry: Entry) -> bool:
        """Whether a newer message already replaced `entry` (it must not be delivered)."""

    def paged(self, message: Message) -> Entry | None:
        """A message for this queue went to pages; returns a waiting entry it supersedes."""

    def wanted_from_pages(self, highest_paged_priority: int) -> Callable[[Message], bool] | None:
        """Which paged messages should overtake the queue's position in its pages (they
        go out before what waits in memory), given the highest priority in its pages;
        None when none should."""


def _insert_by_id(entries: deque[Entry], ref: MessageRef) -> None:
    """Put `ref` back before the first entry that arrived after it."""
    message_id = ref.message.id
    for index, waiting in enumerate(entries):  # released refs sit near the head
        if waiting.message.id > message_id:
            entries.insert(index, ref)
            return
    entries.append(ref)


def _remove_if(
    entries: deque[Entry], predicate: Callable[[Entry], bool], stop: Callable[[], bool] | None
) -> tuple[list[Entry], deque[Entry]]:
    """The entries `predicate` takes and a deque of the others, in order."""
    taken: list[Entry] = []
    keep: deque[Entry] = deque()
    rest = iter(entries)
    for entry in rest:
        if stop is not None and stop():
            keep.append(entry)
            break
        (taken if predicate(entry) else keep).append(entry)
    keep.extend(rest)
    return taken, keep


class Unaware:
    """The `Waiting` answers of a list that neither supersedes messages nor wants any out
    of its address's pages ahead of its turn (lists that do override them)."""

    may_supersede = False

    def superseded(self, entry: Entry) -> bool:
        return False

    def paged(self, message: Message) -> Entry | None:
        return None

    def wanted_from_pages(self, highest_paged_priority: int) -> Callable[[Message], bool] | None:
        return None


class Fifo(Unaware, deque[Entry]):
    """Arrival order (message id order): the standard queue's list."""

    def put_back(self, ref: MessageRef) -> Entry | None:
        _insert_by_id(self, ref)
        return None

    def newer_than(self, message_id: int) -> list[Entry]:
        unseen = []
        for entry in reversed(self):  # sorted by id
            if entry.message.id <= message_id:
                break
            unseen.append(entry)
        unseen.reverse()
        return unseen

    def remove_if(
        self, predicate: Callable[[Entry], bool], stop: Callable[[], bool] | None = None
    ) -> list[Entry]:
        taken, keep = _remove_if(self, predicate, stop)
        self.clear()
        self.extend(keep)
        return taken


class ByPriority(Unaware):
    """Highest priority first, arrival order within a priority (Qpid's priority queue).

    `levels` distinct levels take the top priorities: with 10 every AMQP priority
    (0-9) is its own level; with k, priorities 0..10-k share the lowest level (as
    qpidd maps them). With `fairshare` > 0, a level hands out at most that many
    messages in a row while a lower level has some waiting, instead of strict order.
    """

    def __init__(self, levels: int = 10, fairshare: int = 0) -> None:
        self.levels = [Fifo() for _ in range(levels)]
        self._lowest = 10 - levels
        self.fairshare = fairshare
        self._streak = 0  # messages the current level handed out in a row
        self._streak_level = -1
        self._size = 0

    def level_of(self, entry: Entry) -> int:
        return self._level(entry.message.priority)

    def _level(self, priority: int) -> int:
        return max(min(max(priority, 0), 9) - self._lowest, 0)

    def wanted_from_pages(self, highest_paged_priority: int) -> Callable[[Message], bool] | None:
        """Paged messages of a level above the lowest one waiting: they go out before it
        (a high priority paged behind low ones is delivered first)."""
        lowest = next((i for i, level in enumerate(self.levels) if level), None)
        if lowest is None or self._level(highest_paged_priority) <= lowest:
            return None
        return lambda message: self._level(message.priority) > lowest

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Entry]:
        return itertools.chain.from_iterable(reversed(self.levels))

    def append(self, entry: Entry) -> Entry | None:
        self.levels[self.level_of(entry)].append(entry)
        self._size += 1
        return None

    def popleft(self) -> Entry:
        waiting = [i for i in range(len(self.levels) - 1, -1, -1) if self.levels[i]]
        if not waiting:
            raise IndexError("pop from an empty queue")
        level = waiting[0]
        if (
            self.fairshare
            and len(waiting) > 1
            and self._streak_level == level
            and self._streak >= self.fairshare
        ):
            level = waiting[1]  # the lower level's turn
        if level != self._streak_level:
            self._streak_level, self._streak = level, 0
        self._streak += 1
        self._size -= 1
        return self.levels[level].popleft()

    def put_back(self, ref: MessageRef) -> Entry | None:
        _insert_by_id(self.levels[self.level_of(ref)], ref)
        self._size += 1
        return None

    def newer_than(self, message_id: int) -> list[Entry]:
        per_level = [level.newer_than(message_id) for level in self.levels]
        return list(heapq.merge(*per_level, key=lambda e: e.message.id))

    def remove_if(
        self, predicate: Callable[[Entry], bool], stop: Callable[[], bool] | None = None
    ) -> list[Entry]:
        taken: list[Entry] = []
        for level in reversed(self.levels):
            if stop is not None and stop():
                break
            taken += level.remove_if(predicate, stop)
        self._size -= len(taken)
        return taken

    def clear(self) -> None:
        for level in self.levels:
            level.clear()
        self._size = 0


class LastValue:
    """Arrival order, holding one waiting message per value of a key (a last-value queue).

    `key_of(entry)` reads the key (e.g. an application property); a message with a key
    replaces the waiting one with the same key, which `append` returns for the queue to
    acknowledge. Messages without the key are kept like in a FIFO queue.
    """

    may_supersede = True

    def __init__(self, key_of: Callable[[Entry], object]) -> None:
        self.key_of = key_of
        self._entries: OrderedDict[object, Entry] = OrderedDict()
        self._unique = itertools.count()
        #: key -> id of the newest message with it that went to pages: an older one
        #: read from pages later is superseded before anyone sees it.
        self._newest_paged: dict[object, int] = {}

    def _key(self, entry: Entry) -> object:
        key = self.key_of(entry)
        return ("no key", next(self._unique)) if key is None else ("key", key)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def superseded(self, entry: Entry) -> bool:
        return self._newest_paged.get(self._key(entry), -1) > entry.message.id

    def append(self, entry: Entry) -> Entry | None:
        key = self._key(entry)
        if self._newest_paged.get(key, -1) > entry.message.id:
            return entry  # a newer value is in pages already
        replaced = self._entries.pop(key, None)
        self._entries[key] = entry
        return replaced

    def popleft(self) -> Entry:
        key, entry = self._entries.popitem(last=False)
        if self._newest_paged.get(key) == entry.message.id:
            del self._newest_paged[key]  # every older one was read before it
        return entry

    def paged(self, message: Message) -> Entry | None:
        key = self._key(message)
        self._newest_paged[key] = message.id
        return self._entries.pop(key, None)

    def wanted_from_pages(self, highest_paged_priority: int) -> Callable[[Message], bool] | None:
        return None

    def put_back(self, ref: MessageRef) -> Entry | None:
        """Back at its place, unless a newer value waits or went to pages meanwhile: then
        `ref` is dropped. An older value waiting (released before it) is dropped instead."""
        key = self._key(ref)
        if self._newest_paged.get(key, -1) > ref.message.id:
            return ref
        waiting = self._entries.get(key)
        if waiting is not None and waiting.message.id > ref.message.id:
            return ref
        self._entries[key] = ref
        for later_key in [k for k, e in self._entries.items() if e.message.id > ref.message.id]:
            self._entries.move_to_end(later_key)  # keep arrival order
        return waiting

    def newer_than(self, message_id: int) -> list[Entry]:
        return [e for e in self._entries.values() if e.message.id > message_id]

    def remove_if(
        self, predicate: Callable[[Entry], bool], stop: Callable[[], bool] | None = None
    ) -> list[Entry]:
        taken: list[Entry] = []
        for key, entry in list(self._entries.items()):
            if stop is not None and stop():
                break
            if predicate(entry):
                del self._entries[key]
                taken.append(entry)
        return taken

    def clear(self) -> None:
        self._entries.clear()
