"""Large messages: bodies kept in files of their own, never whole in memory.

A message of its listener's `min-large-message-size` or more (Artemis's large message)
is written to `<data-dir>/large-messages/<file id>.msg` as its frames arrive. The file
holds the whole message as the producer sent it. The broker keeps only its *head*, the
encoded sections before the body (header, annotations, properties, application
properties), as a `LargeHead`: a `bytes`, so routing, selectors, duplicate detection,
the journal record and memory accounting read and count it as any message's bytes,
carrying the `LargeBody` it belongs to. A delivery is the head (its delivery count or
annotations perhaps rewritten) followed by the file from the original head's end on.

One file per message however many queues hold it; a dead-letter or expiry copy takes the
same file (moved, not copied). Each message object that refers to a body holds one
reference; the file is deleted when the last goes. At startup every file no recovered
record refers to (a message partly received, one whose record never reached the journal,
a deletion cut short) is removed: `LargeMessageStore.remove_orphans`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog

log = structlog.get_logger("scow.large")

#: `[broker] large-messages-directory`'s default, under the data dir.
DEFAULT_DIRECTORY = "large-messages"
#: Artemis's default for AMQP acceptors: messages from this size on are large.
DEFAULT_MIN_LARGE_MESSAGE_SIZE = 100 << 10
#: Bytes read from a body file per call while a delivery streams it.
READ_CHUNK = 1 << 20
_SUFFIX = ".msg"
#: Threads that sync and delete files: each sync also commits its file's creation, and
#: several in flight let the file system commit them together.
SYNC_THREADS = 4


class LargeBody:
    """The file of one large message, shared by every message object that refers to it."""

    __slots__ = ("_waiting", "file_id", "head_size", "length", "refs", "store", "synced")

    def __init__(self, store: LargeMessageStore, file_id: int, head_size: int, length: int) -> None:
        self.store = store
        self.file_id = file_id
        #: Where the body starts in the file: the length of the original head.
        self.head_size = head_size
        #: The whole message's length as received (the file's length).
        self.length = length
        self.refs = 0
        #: The file is on disk for good (synced, or not to be synced).
        self.synced = True
        self._waiting: list[Callable[[], None]] = []

    @property
    def path(self) -> Path:
        return self.store.path_of(self.file_id)

    def acquire(self) -> None:
        """One more message object refers to this file."""
        self.refs += 1

    def release(self) -> None:
        """A message object that referred to it is gone; the last deletes the file."""
        self.refs -= 1
        if self.refs <= 0:
            self.store.remove(self)

    def when_synced(self, then: Callable[[], None]) -> None:
        """Run `then` once the file is synced (at once if it is)."""
        if self.synced:
            then()
        else:
            self._waiting.append(then)

    def _now_synced(self) -> None:
        self.synced = True
        waiting, self._waiting = self._waiting, []
        for then in waiting:
            then()

    def chunks(self, start: int | None = None, end: int | None = None) -> Iterator[bytes]:
        """The file's bytes from `start` (default: the body's start) to `end` (default:
        the file's end) in READ_CHUNK pieces."""
        stop = self.length if end is None else end
        fd = os.open(self.path, os.O_RDONLY)
        try:
            offset = self.head_size if start is None else start
            while offset < stop:
                chunk = os.pread(fd, min(READ_CHUNK, stop - offset), offset)
                if not chunk:
                    raise OSError(f"large message file {self.path}: ends at {offset} of "
                                  f"{self.length} bytes")  # fmt: skip
                offset += len(chunk)
                yield chunk
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"<LargeBody {self.file_id}: {self.length} bytes, {self.refs} refs>"


class LargeHead(bytes):
    """A large message's head: the bytes the broker parses; its `body` is in a file.

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
    """The body file of a message's data, or None for a message held whole in memory."""
    return data.body if data.__class__ is LargeHead else None


def hold_body(data: bytes) -> None:
    """A message object with these bytes now counts in memory: it holds its body's file
    (the broker releases it with the message's last reference)."""
    if data.__class__ is LargeHead:
        data.body.acquire()


def message_size(data: bytes) -> int:
    """The size of a message as its consumers receive it, body file included."""
    if data.__class__ is LargeHead:
        return data.message_size
    return len(data)


def with_body(delivered: bytes, stored: bytes) -> bytes:
    """The whole message a protocol that cannot stream sends: `delivered` (the head
    `for_delivery` made of `stored`, a message's data) and the body in its file, if any."""
    if stored.__class__ is not LargeHead:
        return delivered
    return delivered + b"".join(stored.body.chunks())


def with_head(data: bytes, new: bytes) -> bytes:
    """`new` (a rewrite of `data`'s head) as a message: with `data`'s body if it has one."""
    body = large_body(data)
    return new if body is None else LargeHead(new, body)


class Arrival:
    """A large message being received: its bytes appended to its file as they come."""

    __slots__ = ("fd", "file_id", "store", "written")

    def __init__(self, store: LargeMessageStore, file_id: int) -> None:
        self.store = store
        self.file_id = file_id
        self.fd = os.open(store.path_of(file_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        self.written = 0
        store.arriving += 1

    def write(self, chunk: bytes | memoryview) -> None:
        # A write lands in the page cache at memory speed; what waits on the disk, the
        # sync, runs on the store's thread (see `complete`).
        view = memoryview(chunk)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.written += n

    def complete(self, head_size: int, *, sync: bool) -> LargeBody:
        """The file is whole; `sync` makes it durable (on the store's thread) before its
        body counts as synced."""
        store = self.store
        store.arriving -= 1
        body = LargeBody(store, self.file_id, head_size, self.written)
        store.files += 1
        store.bytes += self.written
        fd, self.fd = self.fd, -1
        if not sync:
            os.close(fd)
            return body
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # an offline tool (`scow data import`): synced here
            _sync_and_close(fd)
            return body
        body.synced = False

        def synced(_future: object) -> None:
            loop.call_soon_threadsafe(body._now_synced)

        store.executor().submit(_sync_and_close, fd).add_done_callback(synced)
        return body

    def abandon(self) -> None:
        """The message will not be kept (aborted, refused, cut off): its file goes."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.store.arriving -= 1
        self.store.path_of(self.file_id).unlink(missing_ok=True)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:  # removed as an orphan at the next start
        log.warning("large message file not deleted", path=str(path), reason=str(exc))


def _sync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LargeMessageStore:
    """The directory of large message files of one broker, and their figures."""

    def __init__(self, directory: Path, *, sync: bool) -> None:
        self.directory = directory
        #: `large-message-sync`: a durable large message's file is synced before the
        #: message is accepted.
        self.sync = sync
        self._executor: ThreadPoolExecutor | None = None
        #: Files of whole messages now, their bytes, and messages still arriving.
        self.files = 0
        self.bytes = 0
        self.arriving = 0
        self._made = False
        #: Ids of the files recovered records refer to, until `remove_orphans`.
        self._kept: set[int] = set()
        #: Bodies of large messages in pages, by file id: each page record holds its
        #: body (a message read back from pages shares it) until its page is deleted.
        self._paged: dict[int, LargeBody] = {}

    def path_of(self, file_id: int) -> Path:
        return self.directory / f"{file_id}{_SUFFIX}"

    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="scow-large")
        return self._executor

    def begin(self, file_id: int) -> Arrival:
        """A new file for a message that is arriving; `file_id` is a fresh broker id."""
        if not self._made:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._made = True
        return Arrival(self, file_id)

    def write_whole(
        self, file_id: int, head: bytes, rest: bytes | memoryview, *, sync: bool
    ) -> LargeHead:
        """A message that arrived whole (its `head`, then the `rest` of its bytes) as a
        large message: written to a file of its own (synced, with `sync`, before its
        body counts as synced), its head kept."""
        arrival = self.begin(file_id)
        try:
            arrival.write(head)
            arrival.write(rest)
        except OSError:
            arrival.abandon()
            raise
        return LargeHead(head, arrival.complete(len(head), sync=sync))

    def recovered(self, file_id: int, head_size: int, length: int) -> LargeBody | None:
        """The body a recovered record refers to; None when its file is missing or short
        (it was deleted after the message's last acknowledgement, or never synced)."""
        try:
            size = self.path_of(file_id).stat().st_size
        except FileNotFoundError:
            return None
        if size < length:
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
                raise OSError(f"large message file {self.path_of(file_id)}: missing or short")
            self.page_hold(body)
        return body

    def page_release(self, file_id: int) -> None:
        """The page holding a record that refers to this file is deleted."""
        body = self._paged.pop(file_id, None)
        if body is not None:
            body.release()

    def remove(self, body: LargeBody) -> None:
        """Delete a body's file, on the store's threads: unlinking a large file can take
        milliseconds. A crash before it happens leaves an orphan, removed at the start."""
        self.files -= 1
        self.bytes -= body.length
        self.executor().submit(_unlink, body.path)

    def keep(self, file_id: int) -> None:
        """At startup: a recovered message not in the journal (paged) refers to this file."""
        self._kept.add(file_id)

    def remove_orphans(self) -> int:
        """Delete every file no recovered message refers to (see `recovered`, `keep`);
        returns how many went. Call once at startup, after recovery, before any message
        arrives."""
        kept, self._kept = self._kept, set()
        if not self.directory.is_dir():
            return 0
        removed = 0
        for path in self.directory.iterdir():
            stem = path.name.removesuffix(_SUFFIX)
            if path.name.endswith(_SUFFIX) and stem.isdigit() and int(stem) in kept:
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
        if removed:
            log.info("orphan large message files removed", files=removed)
        return removed

    def stats(self) -> dict[str, int]:
        """Files of whole large messages, their bytes, and messages still arriving."""
        return {"files": self.files, "bytes": self.bytes, "arriving": self.arriving}

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
