"""The waiting lists of queue types: what a queue holds undelivered, in delivery order.

A queue type is the standard queue's dispatch over one of these lists. Each keeps the
entries (messages, or refs that came back) and answers four questions the queue asks:
which comes next (`popleft`), where a released ref goes back (`put_back`; many at once:
`put_back_all`), what a browser has not seen (`newer_than`, in arrival order), and which
entries a predicate takes (`remove_if`). `append` and `put_back` may return an entry the
list no longer holds because a newer one supersedes it (last-value queues); the queue
drops it.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from scow.core.message import Entry, Message, MessageKind, MessageRef, expired_by


class Waiting(Protocol):
    #: Whether a new entry can be superseded before it waits (`superseded`).
    may_supersede: bool
    #: How many lists in message id order the entries are in, one after another in
    #: delivery order (a FIFO: 1, a priority queue: its levels), for `remove_if_in`.
    parts: int

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

    def remove_if_in(
        self,
        part: int,
        predicate: Callable[[Entry], bool],
        stop: Callable[[], bool] | None,
        after: int,
    ) -> list[Entry]:
        """`remove_if` over one of the `parts` (0: the first to be delivered), asking
        `predicate` only about the entries whose id is above `after`."""

    def remove_expired(self, now: int) -> list[Entry]:
        """Remove and return, in delivery order, the entries whose message expired by
        `now` (ms since the epoch): the broker's expiry scan, every period, mostly
        finding none."""

    def clear(self) -> None: ...

    def held(self) -> Iterator[Entry]:
        """In delivery order, as the objects the list keeps: a caller may change them
        (iterating may instead make new objects for entries held compactly)."""

    def superseded(self, entry: Entry) -> bool:
        """Whether a newer message already replaced `entry` (it must not be delivered)."""

    def paged(self, message: Message) -> Entry | None:
        """A message for this queue went to pages; returns a waiting entry it supersedes."""

    def wanted_from_pages(self, highest_paged_priority: int) -> Callable[[Message], bool] | None:
        """Which paged messages should overtake the queue's position in its pages (they
        go out before what waits in memory), given the highest priority in its pages;
        None when none should."""


def put_back_all(waiting: Waiting, refs: list[MessageRef]) -> list[Entry]:
    """`waiting.put_back` of each of `refs` (in message id order: a rollback's), in one
    pass where the list can (`Fifo.put_back_all`); returns the entries that made
    superfluous (last-value)."""
    bulk = getattr(waiting, "put_back_all", None)
    if bulk is not None:
        return bulk(refs)  # type: ignore[no-any-return]
    return [entry for ref in refs if (entry := waiting.put_back(ref)) is not None]


def _remove_if(
    entries: Iterable[Entry], predicate: Callable[[Entry], bool], stop: Callable[[], bool] | None
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


class Fifo(Unaware):
    """Arrival order (message id order): the standard queue's list, held compactly.

    Most waiting messages are plain: held by this queue alone, with their body in
    memory, no expiry, and the kind (address, format, durability, priority) of the
    others. Such a message is kept as its body in the list and its id in an array of
    8-byte ints, not as a `Message` object with an int: about 60 B less per message
    (issue 21). It becomes a `Message` again as it leaves (`popleft`) or is read; the
    message objects reading makes are new each time, so changes to them are lost:
    `held()` turns every entry into the object the list keeps, for callers that change
    them (flow to disk). Every other entry (refs, shared messages) is kept as it is.
    """

    __slots__ = ("_entries", "_head", "_ids", "_kind")

    parts = 1

    def __init__(self) -> None:
        #: Entries in order; a `bytes` is a plain message's body.
        self._entries: deque[Any] = deque()
        #: The ids of the plain messages, in order, from `_head` on (a ring: the front is
        #: cut off in bulk, see `popleft`).
        self._ids = array("q")
        self._head = 0
        #: The kind of every plain message.
        self._kind: MessageKind | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        """In delivery order; plain messages as new objects (see the class docstring)."""
        ids, index, kind = self._ids, self._head, self._kind
        for item in self._entries:
            if item.__class__ is bytes:
                yield _plain(ids[index], item, kind)
                index += 1
            else:
                yield item

    def append(self, entry: Entry) -> Entry | None:
        if entry.__class__ is Message and not entry.expiration:
            message: Message = entry  # type: ignore[assignment]
            data = message.data
            kind = message.kind
            if data.__class__ is bytes:
                if kind is not self._kind and self._head == len(self._ids):
                    self._kind = kind  # no plain message waits: later ones are of this kind
                if kind is self._kind:
                    self._entries.append(data)
                    self._ids.append(message.id)
                    return None
        self._entries.append(entry)
        return None

    def popleft(self) -> Entry:
        item = self._entries.popleft()
        if item.__class__ is not bytes:
            return item
        ids = self._ids
        head = self._head
        message_id = ids[head]
        head += 1
        if head == len(ids) or (head >= _CUT and head * 2 >= len(ids)):
            del ids[:head]  # one move of the rest, at most once per as many pops
            head = 0
        self._head = head
        return _plain(message_id, item, self._kind)

    def held(self) -> Iterator[Entry]:
        """Every entry as an object the list keeps: changes to them stay."""
        if self._head != len(self._ids):
            entries = list(self)
            self.clear()
            self._entries.extend(entries)
        return iter(self._entries)

    def _last_id(self) -> int:
        """The id of the last entry (the list is not empty)."""
        item = self._entries[-1]
        return self._ids[-1] if item.__class__ is bytes else item.message.id  # type: ignore[no-any-return]

    def put_back(self, ref: MessageRef) -> Entry | None:
        """Before the first entry that arrived after `ref` (released refs sit near the
        head, so the walk is short); at the end, without a walk, when none did."""
        message_id = ref.message.id
        if not self._entries or self._last_id() < message_id:
            self._entries.append(ref)
            return None
        ids, plain = self._ids, self._head
        for index, item in enumerate(self._entries):
            if item.__class__ is bytes:
                later = ids[plain] > message_id
                plain += 1
            else:
                later = item.message.id > message_id
            if later:
                self._entries.insert(index, ref)
                return None
        self._entries.append(ref)
        return None

    def put_back_all(self, refs: list[MessageRef]) -> list[Entry]:
        """`put_back` of each of `refs` (in message id order), merged with the waiting
        entries in one pass: a rollback returns thousands at once, and walking from the
        head for each would take time growing with the square of their number."""
        entries = self._entries
        if not refs:
            return []
        if not entries or self._last_id() < refs[0].message.id:
            entries.extend(refs)
            return []
        merged: deque[Any] = deque()
        ids, plain = self._ids, self._head
        back = 0
        for item in entries:
            if item.__class__ is bytes:
                item_id = ids[plain]
                plain += 1
            else:
                item_id = item.message.id
            while back < len(refs) and refs[back].message.id < item_id:
                merged.append(refs[back])
                back += 1
            merged.append(item)
        merged.extend(refs[back:])
        self._entries = merged
        return []

    def newer_than(self, message_id: int) -> list[Entry]:
        unseen = []
        ids, plain, kind = self._ids, len(self._ids), self._kind
        for item in reversed(self._entries):  # sorted by id
            if item.__class__ is bytes:
                plain -= 1
                entry: Entry = _plain(ids[plain], item, kind)
            else:
                entry = item
            if entry.message.id <= message_id:
                break
            unseen.append(entry)
        unseen.reverse()
        return unseen

    def remove_if(
        self,
        predicate: Callable[[Entry], bool],
        stop: Callable[[], bool] | None = None,
        after: int = 0,
    ) -> list[Entry]:
        """`Waiting.remove_if`, asking `predicate` only about the entries whose id is
        above `after`: those before stay as they are, unread."""
        if after > 0:
            tail = self._pop_newer_than(after)
            taken, keep = _remove_if(tail, predicate, stop)
        else:
            taken, keep = _remove_if(self, predicate, stop)
            self.clear()
        for entry in keep:
            self.append(entry)
        return taken

    def remove_if_in(
        self,
        part: int,
        predicate: Callable[[Entry], bool],
        stop: Callable[[], bool] | None,
        after: int,
    ) -> list[Entry]:
        return self.remove_if(predicate, stop, after)

    def remove_expired(self, now: int) -> list[Entry]:
        """`Waiting.remove_expired`, reading only the entries held as objects: a plain
        message has no expiry. A backlog of plain messages costs the scan nothing (it
        built a message for each: 0.16 s per 500,000, on the event loop)."""
        entries = self._entries
        if len(entries) == len(self._ids) - self._head:
            return []  # every entry is plain
        taken = [e for e in entries if e.__class__ is not bytes and expired_by(e, now)]
        if taken:  # the plain ones keep their places, and so their ids
            self._entries = deque(
                e for e in entries if e.__class__ is bytes or not expired_by(e, now)
            )
        return taken

    def _pop_newer_than(self, message_id: int) -> list[Entry]:
        """Take the entries whose id is above `message_id` off the end, in order."""
        entries, ids, kind = self._entries, self._ids, self._kind
        tail: list[Entry] = []
        while entries:
            item = entries[-1]
            if item.__class__ is bytes:
                item_id = ids[-1]
                if item_id <= message_id:
                    break
                entries.pop()
                ids.pop()
                tail.append(_plain(item_id, item, kind))
            else:
                if item.message.id <= message_id:
                    break
                tail.append(entries.pop())
        tail.reverse()
        return tail

    def clear(self) -> None:
        self._entries.clear()
        del self._ids[:]
        self._head = 0


#: Ids popped before the front of a `Fifo`'s id array is cut off: one memmove of the
#: rest per at least this many pops.
_CUT = 1024


def _plain(message_id: int, data: bytes, kind: Any) -> Message:
    """A plain message of a `Fifo` as an object again (`Message.__init__`'s work, less
    the kind lookup)."""
    message = _new_message(Message)
    message.id = message_id
    message.data = data
    message.kind = kind
    message.expiration = 0
    return message


_new_message = Message.__new__


class ByPriority(Unaware):
    """Highest priority first, arrival order within a priority (Qpid's priority queue).

    `levels` distinct levels take the top priorities: with 10 every AMQP priority
    (0-9) is its own level; with k, priorities 0..10-k share the lowest level (as
    qpidd maps them). With `fairshare` > 0, a level hands out at most that many
    messages in a row while a lower level has some waiting, instead of strict order.
    """

    def __init__(self, levels: int = 10, fairshare: int = 0) -> None:
        self.levels = [Fifo() for _ in range(levels)]
        self.parts = levels  # each level, highest first (`remove_if_in`)
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

    def held(self) -> Iterator[Entry]:
        return itertools.chain.from_iterable(level.held() for level in reversed(self.levels))

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
        self.levels[self.level_of(ref)].put_back(ref)
        self._size += 1
        return None

    def put_back_all(self, refs: list[MessageRef]) -> list[Entry]:
        """`Fifo.put_back_all` on each level, for the refs of its priorities."""
        by_level: dict[int, list[MessageRef]] = {}
        for ref in refs:
            by_level.setdefault(self.level_of(ref), []).append(ref)
        for level, back in by_level.items():
            self.levels[level].put_back_all(back)
        self._size += len(refs)
        return []

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

    def remove_if_in(
        self,
        part: int,
        predicate: Callable[[Entry], bool],
        stop: Callable[[], bool] | None,
        after: int,
    ) -> list[Entry]:
        """`Fifo.remove_if` on a level: part 0 is the highest."""
        taken = self.levels[len(self.levels) - 1 - part].remove_if(predicate, stop, after)
        self._size -= len(taken)
        return taken

    def remove_expired(self, now: int) -> list[Entry]:
        taken = [e for level in reversed(self.levels) for e in level.remove_expired(now)]
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
    parts = 1  # arrival order: a newer value is a newer message

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

    def held(self) -> Iterator[Entry]:
        return iter(self)

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

    def remove_if_in(
        self,
        part: int,
        predicate: Callable[[Entry], bool],
        stop: Callable[[], bool] | None,
        after: int,
    ) -> list[Entry]:
        """`remove_if` of the entries newer than `after`: the list is in arrival order
        (a newer value is a newer message), so they are the last ones."""
        newer: list[tuple[object, Entry]] = []
        for key, entry in reversed(self._entries.items()):
            if entry.message.id <= after:
                break
            newer.append((key, entry))
        taken: list[Entry] = []
        for key, entry in reversed(newer):
            if stop is not None and stop():
                break
            if predicate(entry):
                del self._entries[key]
                taken.append(entry)
        return taken

    def remove_expired(self, now: int) -> list[Entry]:
        if not any(expired_by(entry, now) for entry in self._entries.values()):
            return []
        return self.remove_if(lambda entry: expired_by(entry, now))

    def clear(self) -> None:
        self._entries.clear()
