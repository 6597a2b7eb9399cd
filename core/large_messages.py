"""Large messages: bodies kept apart from the broker's memory, never held whole.

A message of its listener's `min-large-message-size` or more (Artemis's large message)
is written to its store's body as its frames arrive. The body holds the whole message as
the producer sent it. The broker keeps only its *head*, the encoded sections before the
body (header, annotations, properties, application properties), as a `LargeHead`: a
`bytes`, so routing, selectors, duplicate detection, the journal record and memory
accounting read and count it as any message's bytes, carrying the `LargeBody` it belongs
to. A delivery is the head (its delivery count or annotations perhaps rewritten)
followed by the stored message from the original head's end on.

Where bodies live is the `LargeMessageStore` its journal's plugin provides (files under
the data dir by default, `scow.core.large_message_files`; rows of a table on the
database store): bodies must be wherever the records that refer to them are, or a
failover or a restore would find records without bodies. This module holds what every
store shares: one body per message however many queues hold it (a dead-letter or expiry
copy takes the same body: moved, not copied), one reference per message object that
refers to it, the body deleted when the last goes, and at startup every body no
recovered record refers to (a message partly received, one whose record never reached
the journal, a deletion cut short) removed: `LargeMessageStore.remove_orphans`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from typing import Protocol

import structlog

log = structlog.get_logger("scow.large")

#: `[broker] large-messages-directory`'s default, under the data dir.
DEFAULT_DIRECTORY = "large-messages"
#: Artemis's default for AMQP acceptors: messages from this size on are large.
DEFAULT_MIN_LARGE_MESSAGE_SIZE = 100 << 10
#: Bytes read from a body per call while a delivery streams it.
READ_CHUNK = 1 << 20

#: What a delivery calls, on the event loop, once more of a body can be read.
Wake = Callable[[], None]


class Chunks(Protocol):
    """A body's bytes as `LargeBody.chunks` hands them out; `close` ends the reading."""

    def __iter__(self) -> Iterator[bytes]: ...

    def __next__(self) -> bytes: ...

    def close(self) -> None: ...


class LargeBody:
    """The stored bytes of one large message, shared by every message object that refers
    to them."""

    __slots__ = ("_waiting", "file_id", "head_size", "length", "refs", "store", "synced")

    def __init__(self, store: LargeMessageStore, file_id: int, head_size: int, length: int) -> None:
        self.store = store
        self.file_id = file_id
        #: Where the body starts in the stored message: the length of the original head.
        self.head_size = head_size
        #: The whole message's length as received.
        self.length = length
        self.refs = 0
        #: The body is stored for good (synced, or not to be synced).
        self.synced = True
        self._waiting: list[Callable[[], None]] = []

    def acquire(self) -> None:
        """One more message object refers to this body."""
        self.refs += 1

    def release(self) -> None:
        """A message object that referred to it is gone; the last deletes the body."""
        self.refs -= 1
        if self.refs <= 0:
            self.store.remove(self)

    def when_synced(self, then: Callable[[], None]) -> None:
        """Run `then` once the body is synced (at once if it is)."""
        if self.synced:
            then()
        else:
            self._waiting.append(then)

    def _now_synced(self) -> None:
        self.synced = True
        waiting, self._waiting = self._waiting, []
        for then in waiting:
            then()

    def chunks(self, start: int | None = None, wake: Wake | None = None) -> Chunks:
        """The stored message's bytes from `start` (default: the body's start) in pieces
        of about READ_CHUNK; raises OSError when they cannot be read whole.

        Without `wake` every piece is read when asked for (an offline tool, or a
        protocol that cannot stream). With it, a store whose reads must not block the
        event loop may yield `b""`: nothing is ready yet, and `wake` runs on the loop
        once more is. Closing the iterator ends the reading.
        """
        return self.store.read(self, self.head_size if start is None else start, wake)

    def __repr__(self) -> str:
        return f"<LargeBody {self.file_id}: {self.length} bytes, {self.refs} refs>"


class LargeHead(bytes):
    """A large message's head: the bytes the broker parses; its `body` is stored apart.

    `len()` is the head's length, so memory accounting counts the head, not the body.
    """

    body: LargeBody

    def __new__(cls, head: bytes, body: LargeBody) -> LargeHead:
        self = super().__new__(cls, head)
        self.body = body
        return self

    @property
    def message_size(self) -> int:
        """The size of the whole message as delivered with this head."""
        return len(self) + self.body.length - self.body.head_size


def large_body(data: bytes) -> LargeBody | None:
    """The stored body of a message's data, or None for a message held whole in memory."""
    return data.body if data.__class__ is LargeHead else None


def hold_body(data: bytes) -> None:
    """A message object with these bytes now counts in memory: it holds its body (the
    broker releases it with the message's last reference)."""
    if data.__class__ is LargeHead:
        data.body.acquire()


def message_size(data: bytes) -> int:
    """The size of a message as its consumers receive it, body included."""
    if data.__class__ is LargeHead:
        return data.message_size
    return len(data)


def with_body(delivered: bytes, stored: bytes) -> bytes:
    """The whole message a protocol that cannot stream sends: `delivered` (the head
    `for_delivery` made of `stored`, a message's data) and the stored body, if any."""
    if stored.__class__ is not LargeHead:
        return delivered
    return delivered + b"".join(stored.body.chunks())


def with_head(data: bytes, new: bytes) -> bytes:
    """`new` (a rewrite of `data`'s head) as a message: with `data`'s body if it has one."""
    body = large_body(data)
    return new if body is None else LargeHead(new, body)


class Arrival(abc.ABC):
    """A large message being received: its bytes stored as they come."""

    __slots__ = ("file_id", "store", "written")

    def __init__(self, store: LargeMessageStore, file_id: int) -> None:
        self.store = store
        self.file_id = file_id
        #: Bytes received so far.
        self.written = 0
        store.arriving += 1

    @abc.abstractmethod
    def write(self, chunk: bytes | memoryview) -> None:
        """Store the next bytes of the message (raises OSError when they cannot be)."""

    @abc.abstractmethod
    def overwrite(self, offset: int, data: bytes) -> None:
        """Write `data` again over bytes already written at `offset` of the message (a
        size that was not known when they were written); raises OSError when it cannot."""

    def room(self, wake: Wake) -> bool:
        """Whether more bytes may be written now. False when the store is behind: the
        caller stops taking the message's bytes until `wake` runs, on the event loop."""
        return True

    def when_stored(self, then: Callable[[str | None], None]) -> None:
        """Run `then` on the event loop once every byte written so far (and completed)
        is stored: with None, or with why the store refused some, after which the
        message must not be routed (its body is to be released, or its arrival
        abandoned). At once by default: a store whose `write` stores or raises. A store
        that syncs a completed message's bytes apart from writing them (the database's)
        answers once they are synced, if they are to be, so that a failed sync refuses
        the message instead of leaving its producer without an answer."""
        then(None)

    @abc.abstractmethod
    def _finish(self, body: LargeBody, sync: bool) -> None:
        """Store the message's last bytes; mark `body` synced (`_now_synced`, on the
        event loop) once they are stored for good, and synced with `sync`. May raise
        OSError (see `complete`)."""

    def complete(self, head_size: int, *, sync: bool) -> LargeBody:
        """The message has arrived whole; `sync` makes it durable before its body counts
        as synced. Raises OSError when the store finds at once that it could not store
        it whole (an offline tool's, written in place): what it stored of it goes."""
        store = self.store
        store.arriving -= 1
        body = LargeBody(store, self.file_id, head_size, self.written)
        store.files += 1
        store.bytes += self.written
        try:
            self._finish(body, sync)
        except OSError:
            store.remove(body)
            raise
        return body

    def abandon(self) -> None:
        """The message will not be kept (aborted, refused, cut off): its bytes go."""
        self.store.arriving -= 1
        self._discard()

    @abc.abstractmethod
    def _discard(self) -> None:
        """Delete what was stored of the message."""


class LargeMessageStore(abc.ABC):
    """Where one broker's large message bodies live, and their figures.

    A backend implements how bodies are written (`begin`), read (`read`), found at
    startup (`_found`), deleted (`_delete`, `_delete_all_but`) and named in messages
    (`describe`); the reference keeping is here.
    """

    def __init__(self, *, sync: bool) -> None:
        #: `large-message-sync`: a durable large message's body is synced before the
        #: message is accepted.
        self.sync = sync
        #: Bodies of whole messages now, their bytes, and messages still arriving.
        self.files = 0
        self.bytes = 0
        self.arriving = 0
        #: Ids of the bodies recovered records refer to, until `remove_orphans`.
        self._kept: set[int] = set()
        #: Bodies of large messages in pages, by id: each page record holds its body (a
        #: message read back from pages shares it) until its page is deleted.
        self._paged: dict[int, LargeBody] = {}

    # ------------------------------------------------------------------ the backend's

    def open(self) -> None:  # noqa: B027 (most stores need none)
        """Blocking preparation before recovery (off the event loop): nothing by default."""

    @abc.abstractmethod
    def begin(self, file_id: int) -> Arrival:
        """A new body for a message that is arriving; `file_id` is a fresh broker id."""

    @abc.abstractmethod
    def read(self, body: LargeBody, start: int, wake: Wake | None) -> Chunks:
        """`body`'s stored bytes from `start` on: see `LargeBody.chunks`."""

    @abc.abstractmethod
    def _found(self, file_id: int, length: int) -> bool:
        """Whether a body of at least `length` bytes is stored under `file_id` (at
        startup: a recovered record refers to it)."""

    @abc.abstractmethod
    def _delete(self, body: LargeBody) -> None:
        """Delete a body, off the event loop's critical path; a crash before it is done
        leaves an orphan, removed at the next start."""

    @abc.abstractmethod
    def _delete_all_but(self, kept: set[int]) -> int:
        """Delete every stored body whose id is not in `kept`; returns how many went."""

    @abc.abstractmethod
    def describe(self, file_id: int) -> str:
        """Where the body `file_id` is, for messages (a path, a table and id)."""

    def close(self) -> None:  # noqa: B027 (most stores need none)
        """Finish pending writes and deletions and let go of resources (off the loop)."""

    # ------------------------------------------------------------------ shared

    def write_whole(
        self, file_id: int, head: bytes, rest: bytes | memoryview, *, sync: bool
    ) -> LargeHead:
        """A message that arrived whole (its `head`, then the `rest` of its bytes) as a
        large message: stored as a body of its own (synced, with `sync`, before it counts
        as synced), its head kept."""
        arrival = self.begin(file_id)
        try:
            arrival.write(head)
            arrival.write(rest)
        except OSError:
            arrival.abandon()
            raise
        return LargeHead(head, arrival.complete(len(head), sync=sync))

    def recovered(self, file_id: int, head_size: int, length: int) -> LargeBody | None:
        """The body a recovered record refers to; None when it is missing or short
        (deleted after the message's last acknowledgement, or never synced)."""
        if not self._found(file_id, length):
            return None
        self._kept.add(file_id)
        body = LargeBody(self, file_id, head_size, length)
        self.files += 1
        self.bytes += length
        return body

    def page_hold(self, body: LargeBody) -> None:
        """A page record refers to `body`: it stays until `page_release`."""
        if body.file_id not in self._paged:
            self._paged[body.file_id] = body
            body.acquire()

    def paged_body(self, file_id: int, head_size: int, length: int) -> LargeBody:
        """The body a page record refers to (held by its page; see `page_hold`)."""
        body = self._paged.get(file_id)
        if body is None:  # a record written before this start: its page holds it from now
            body = self.recovered(file_id, head_size, length)
            if body is None:
                raise OSError(f"large message {self.describe(file_id)}: missing or short")
            self.page_hold(body)
        return body

    def page_release(self, file_id: int) -> None:
        """The page holding a record that refers to this body is deleted."""
        body = self._paged.pop(file_id, None)
        if body is not None:
            body.release()

    def remove(self, body: LargeBody) -> None:
        """The last message object referring to `body` is gone: it is deleted."""
        self.files -= 1
        self.bytes -= body.length
        self._delete(body)

    def keep(self, file_id: int) -> None:
        """At startup: a recovered message not in the journal (paged) refers to this body."""
        self._kept.add(file_id)

    def remove_orphans(self) -> int:
        """Delete every body no recovered message refers to (see `recovered`, `keep`);
        returns how many went. Call once at startup (off the event loop), after
        recovery, before any message arrives."""
        kept, self._kept = self._kept, set()
        removed = self._delete_all_but(kept)
        if removed:
            log.info("orphan large message bodies removed", bodies=removed)
        return removed

    def delete_all(self) -> int:
        """Delete every stored body (a failed import's undo); returns how many went."""
        return self._delete_all_but(set())

    def stats(self) -> dict[str, int]:
        """Bodies of whole large messages, their bytes, and messages still arriving."""
        return {"files": self.files, "bytes": self.bytes, "arriving": self.arriving}
