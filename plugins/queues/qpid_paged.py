"""Qpid C++ broker's paged queues (`qpid.paging = true`): a FIFO queue whose waiting
messages live in pages, at most `qpid.max_pages_loaded` of them in memory at a time.

The other pages are only in the queue's page file, `<data-dir>/pq/pf_<escaped name>`,
created afresh (O_TRUNC) with the queue and deleted with it or at a clean shutdown. The
file is run-time storage, as qpidd's is: durable messages are journaled by the broker as
for any queue, and at a restart recovery enqueues them again into fresh pages.

Where this follows qpidd and where it departs from it (the reference's bug list, A.6):

- A page is `qpid.page_factor` x the OS page size. Records are packed from the start of
  the page, each a fixed header (`HEADER`: length, message id, expiration, priority,
  flags, origin, delivery count) and the message's bytes as received. There is no count
  field to forget, and the size check counts the real header (qpidd's check is 4 bytes
  short, bug 1): a message whose record is larger than a page is refused while it is
  routed, before any queue holds it, naming the page size.
- The loaded pages are the keys of one ordered dict, so their number is computed, never
  counted (bug 2). Eviction takes the least recently used page, never the tail page that
  producers write to (qpidd evicts the newest page: the tail, thrashing, bug 4); a page
  that just filled counts as the least recently used, since of all the pages it will be
  read last (that is the optimal choice for a FIFO queue).
- Records are encoded only when their page is written: the tail page, as it fills, is
  written whole (its live entries) at once, so evicting it later costs no I/O and
  loading another page never waits on a write; a message consumed while its page is
  still the tail is never encoded or written at all.
- Plain `os.pwrite`/`os.pread` rather than mmap: a loaded page is decoded into `bytes`
  objects anyway (`Message.data` must be bytes), so a mapping would only add a copy's
  worth of address space; mmap would also tie the page count to vm.max_map_count, fault
  pages in on the event loop at unpredictable points, and refuse to close while a
  memoryview of it lives. One pread per page load and one pwrite per filled page are
  what the design needs; the kernel's page cache does the rest.
- Released messages (refs put back) wait in memory, sorted by id, and are merged with
  the pages by id: exact FIFO order without loading the page they came from, which may
  be long gone. They are bounded by the credit consumers held.
- A large message's record holds its head (what the broker parses) and refers to its
  body, which stays in its own file: the page size bounds the head, not the body, and
  all the queue keeps of a paged large message is its `LargeBody` (the reference the
  file is deleted by), by message id.
- Entries that cannot be rebuilt from bytes stay in memory as objects, "pinned" in their
  page (a header-only record keeps their place): messages shared with other queues (their
  reference counts and journal records are shared), refs of the paging plugin's
  address pages, bodies already flowed to disk, and a message that reached the queue
  without routing (a dead-letter copy) although larger than a page.
- The broker's memory books (address and global sizes, which drive the address-full
  policies) count what is really in memory: a page going out takes its messages out of
  them and a page coming in puts them back, so a deep paged queue does not make its
  address page or block as if the whole backlog were in memory.
- Looking without taking (browsers, management's browse, flow to disk's housekeeping,
  the broker's expiry scan) reads unloaded pages without loading them: the memory
  bound holds, but, as in qpidd (bug 6), each expiry scan reads every page (about a
  microsecond per paged message, every message-expiry-scan-period).

`qpid.max_count` / `qpid.max_size` (0: no limit) with `qpid.policy_type` "reject" refuse
a message at routing, like the page size check; "ring" drops the oldest waiting messages
(acknowledged, never delivered) to make room, and refuses only what cannot fit even so.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import heapq
import os
import struct
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog

from scow.core import hookimpl
from scow.core.descriptors import QueueType
from scow.core.large_messages import LargeBody, LargeHead
from scow.core.message import (
    MEMORY_OVERHEAD,
    Entry,
    Message,
    MessageFormat,
    MessageKind,
    MessageRef,
    OnDisk,
    expired_by,
    kind_of,
)
from scow.core.model import BrokerError, ResourceLimitExceeded
from scow.plugins.queues.standard import StandardQueue
from scow.plugins.queues.waiting import Unaware

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.model import QueueSpec

log = structlog.get_logger("scow.qpid_paged")

DEFAULT_MAX_PAGES_LOADED = 4
DEFAULT_PAGE_FACTOR = 1
#: Page size = page factor x this (4096 on x86-64 Linux), as qpidd does.
OS_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
#: The largest page factor accepted: pages of up to 1 GiB at 4 KiB OS pages.
MAX_PAGE_FACTOR = 1 << 18
#: Subdirectory of the broker's data dir that holds the page files (qpidd's default).
PAGE_DIRECTORY = "pq"
POLICY_TYPES = ("reject", "ring")

#: A record's header: body length, message id, absolute expiration (ms since the epoch,
#: 0: never), priority, flags, origin (index into the queue's (address, format) table),
#: delivery count. Big-endian, as qpidd writes its records.
HEADER = struct.Struct(">IQqBBHI")
DURABLE = 1
PINNED = 2  # the entry stays in memory; the record only keeps its place
REF = 4  # rebuilt as a MessageRef (it carries a delivery count)
LARGE = 8  # the record's bytes are a large message's head; its body is in `_bodies`
_MAX_ORIGINS = 1 << 16

ARGUMENTS = {
    "qpid.paging": "true: the queue keeps its messages in pages, most of them on disk.",
    "qpid.max_pages_loaded": f"Pages held in memory at once; 0 means {DEFAULT_MAX_PAGES_LOADED}.",
    "qpid.page_factor": "Page size in OS pages (getconf PAGESIZE); 0 means 1.",
    "qpid.max_count": "Messages the queue holds at most; 0 is no limit.",
    "qpid.max_size": "Bytes of messages the queue holds at most; 0 is no limit.",
    "qpid.policy_type": "At a limit: reject new messages, or ring (drop the oldest).",
}


# --------------------------------------------------------------------------- arguments


def _bool(name: str, value: Any) -> bool:
    """A boolean as qpidd's Variant reads one: bool, integer, or "true"/"false" any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(
        f"{name} = {value!r}: expected true or false (a boolean, an integer, or the "
        '"true"/"false" string in any case)'
    )


def _uint(name: str, value: Any, high: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ValueError(f"{name} = {value!r}: expected an integer from 0 to {high}")
    return value


def check(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Normalize a qpid-paged queue's arguments; ValueError naming what is not accepted.

    `qpid.paging` may be left out when `x-queue-type = "qpid-paged"` chose the type.
    """
    checked = dict(arguments)
    if not _bool("qpid.paging", checked.get("qpid.paging", True)):
        raise ValueError(
            "qpid.paging = false: a qpid-paged queue needs it true; "
            "leave it out for a standard queue"
        )
    checked["qpid.paging"] = True
    for name, high in (
        ("qpid.max_pages_loaded", 2**31 - 1),
        ("qpid.page_factor", MAX_PAGE_FACTOR),
        ("qpid.max_count", 2**63 - 1),
        ("qpid.max_size", 2**63 - 1),
    ):
        if name in checked:
            checked[name] = _uint(name, checked[name], high)
    if "qpid.policy_type" in checked:
        policy = checked["qpid.policy_type"]
        if not isinstance(policy, str) or policy.strip().lower() not in POLICY_TYPES:
            raise ValueError(
                f"qpid.policy_type = {policy!r}: expected one of {', '.join(POLICY_TYPES)}"
            )
        checked["qpid.policy_type"] = policy.strip().lower()
    return checked


@dataclass(frozen=True)
class PagingSettings:
    """A qpid-paged queue's settings, from its checked arguments (defaults as qpidd's)."""

    page_size: int
    max_pages_loaded: int
    max_count: int = 0
    max_size: int = 0
    ring: bool = False

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> PagingSettings:
        factor = arguments.get("qpid.page_factor") or DEFAULT_PAGE_FACTOR
        return cls(
            page_size=factor * OS_PAGE_SIZE,
            max_pages_loaded=arguments.get("qpid.max_pages_loaded") or DEFAULT_MAX_PAGES_LOADED,
            max_count=arguments.get("qpid.max_count", 0),
            max_size=arguments.get("qpid.max_size", 0),
            ring=arguments.get("qpid.policy_type") == "ring",
        )


def escaped_file_name(queue_name: str) -> str:
    """`pf_` and the queue name with every byte outside [A-Za-z0-9_.-] of its UTF-8 form
    written `%` and its decimal value as a signed char, as qpidd names page files.

    A name too long for a file name keeps its first 200 characters and gets a hash of
    the whole, so that it still opens (qpidd would fail with ENAMETOOLONG).
    """
    out = []
    for byte in queue_name.encode("utf-8"):
        char = chr(byte)
        if byte < 128 and (char.isalnum() or char in "_.-"):
            out.append(char)
        else:
            out.append(f"%{byte - 256 if byte > 127 else byte}")
    name = "pf_" + "".join(out)
    if len(name) > 240:
        digest = hashlib.sha256(queue_name.encode("utf-8")).hexdigest()[:16]
        name = f"{name[:200]}%{digest}"
    return name


#: Page files in use in this process: two live queues must never share (and truncate) one.
_IN_USE: weakref.WeakValueDictionary[Path, PagedWaiting] = weakref.WeakValueDictionary()


# --------------------------------------------------------------------------- pages


class _InPage(OnDisk):
    """The body of a message decoded from a page only to be looked at (iteration,
    browsers): a slice of the page bytes read, made `bytes` only if someone reads it.

    Being an `OnDisk`, flow to disk leaves it alone and `Message.restore` reads it.
    """

    __slots__ = ("buffer", "length", "offset")

    def __init__(self, buffer: bytes, offset: int, length: int) -> None:
        self.buffer = buffer
        self.offset = offset
        self.length = length

    def __len__(self) -> int:
        return self.length

    def load(self) -> bytes:
        return self.buffer[self.offset : self.offset + self.length]


class _Page:
    """One page of records at `slot` x page size in the file.

    Loaded, `entries` holds its waiting entries in order; unloaded it is None and only
    the file has them (`gone`: ids of records taken since the page was written, which a
    load skips). A `dirty` page (the tail, appended to) has entries the file lacks: it is
    written whole, its live entries only, when it fills or must leave memory; until then
    `size` counts the bytes its records will take, and after it the bytes written.
    """

    __slots__ = ("dirty", "entries", "gone", "live", "max_id", "pinned", "size", "slot")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.entries: deque[Entry] | None = deque()
        self.size = 0
        self.dirty = False
        self.live = 0
        self.gone: set[int] = set()
        #: Entries kept as objects (see the module docstring), by message id; as of the
        #: last write (only clean pages are read or unloaded).
        self.pinned: dict[int, Entry] = {}
        self.max_id = 0

    def __repr__(self) -> str:
        state = "loaded" if self.entries is not None else "unloaded"
        return f"<page slot {self.slot}, {self.live} waiting, {self.size} bytes, {state}>"


#: What a pageable message's data may be: its bytes, or a large message's head.
_PAGED_DATA = (bytes, LargeHead)


def _pageable(entry: Entry) -> bool:
    """Whether `entry` can leave memory and be rebuilt from its record (and, for a large
    message, its body)."""
    cls = entry.__class__
    if cls is Message:
        return entry.message.data.__class__ in _PAGED_DATA
    if cls is MessageRef:
        ref = cast(MessageRef, entry)
        message = ref.message
        return (
            message.__class__ is Message
            and message.data.__class__ in _PAGED_DATA
            and ref.consumer is None
        )
    return False  # shared messages, the paging plugin's refs


def _message_id(entry: Entry) -> int:
    return entry.message.id


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


Books = Callable[[list[Entry]], None]


def _no_books(entries: list[Entry]) -> None:
    return None


class PagedWaiting(Unaware):
    """The waiting list of a qpid-paged queue (the `Waiting` protocol of `waiting.py`).

    Arrival order, in pages of at most `page_size` bytes of records, `max_loaded` of them
    in memory. `on_unloaded(entries)` is told of entries that left memory with their page
    and `on_loaded(entries)` of those that came back (the queue keeps the broker's memory
    books with them); pinned entries never leave, so neither hears of them.
    """

    parts = 1  # arrival order: released refs go back among the pages' entries by id

    def __init__(
        self,
        path: Path,
        page_size: int,
        max_loaded: int,
        *,
        on_unloaded: Books = _no_books,
        on_loaded: Books = _no_books,
    ) -> None:
        if page_size <= HEADER.size:
            raise ValueError(f"page size {page_size}: must be larger than {HEADER.size}")
        if max_loaded < 1:
            raise ValueError(f"max pages loaded {max_loaded}: expected at least 1")
        while _IN_USE.get(path) is not None:  # two names escaping alike (control characters)
            path = path.with_name(f"{path.name}%2")
        self.path = path
        self.page_size = page_size
        self.max_loaded = max_loaded
        self.on_unloaded = on_unloaded
        self.on_loaded = on_loaded
        #: The queue the refs rebuilt from records belong to (set by the queue).
        self.owner: object = None
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_RDWR | os.O_CLOEXEC, 0o600)
        _IN_USE[path] = self
        self._close_fd = weakref.finalize(self, os.close, self._fd)
        self._unlinked = False
        #: Pages in delivery order; every one holds at least one waiting entry.
        self._pages: deque[_Page] = deque()
        #: The loaded pages, least recently used first: their number is len() of it.
        self._loaded: OrderedDict[_Page, None] = OrderedDict()
        self._free: list[int] = []  # slots of freed pages (a heap: lowest reused first)
        self._next_slot = 0
        self._file_end = 0  # bytes of the file written since it was last truncated
        #: Refs put back (released), by id: merged with the pages by id.
        self._returned: list[Entry] = []
        self._count = 0  # entries in pages
        #: Bytes of every waiting entry (pages and returned), for qpid.max_size.
        self.bytes = 0
        self._origins: list[tuple[str, MessageFormat]] = []
        self._origin_index: dict[tuple[str, MessageFormat], int] = {}
        #: The bodies of the large messages whose records are in pages, by message id.
        self._bodies: dict[int, LargeBody] = {}
        #: The most pages ever loaded at once (never above max_loaded unless writes fail).
        self.peak_loaded = 0
        self.page_reads = 0
        self.page_writes = 0
        self.write_errors = 0

    def __repr__(self) -> str:
        return (
            f"<PagedWaiting {self.path.name}: {len(self)} waiting, {len(self._pages)} pages, "
            f"{len(self._loaded)} loaded>"
        )

    # ------------------------------------------------------------------ figures

    def __len__(self) -> int:
        return self._count + len(self._returned)

    def __bool__(self) -> bool:
        return bool(self._count or self._returned)

    @property
    def pages(self) -> int:
        return len(self._pages)

    @property
    def pages_loaded(self) -> int:
        return len(self._loaded)

    def in_memory(self) -> int:
        """Waiting entries held as objects: in loaded pages, pinned, or put back."""
        held = len(self._returned)
        for page in self._pages:
            held += len(page.entries) if page.entries is not None else len(page.pinned)
        return held

    # ------------------------------------------------------------------ the Waiting protocol

    def append(self, entry: Entry) -> Entry | None:
        """At the tail page: in memory only, serialized when the page is written (an
        entry consumed before that never costs an encoding or a write)."""
        message = entry.message
        size = len(message.data)
        record = HEADER.size + size
        if record > self.page_size:
            record = HEADER.size  # kept in memory (see _serialize): its place only
        pages = self._pages
        tail = pages[-1] if pages else None
        if tail is None or tail.size + record > self.page_size:
            tail = self._new_page()
        if tail.entries is not None:
            tail.entries.append(entry)
            tail.dirty = True
            tail.size += record
            self._loaded.move_to_end(tail)
        else:
            self._append_unloaded(tail, entry)
        tail.live += 1
        if message.id > tail.max_id:
            tail.max_id = message.id
        self._count += 1
        self.bytes += size
        return None

    def popleft(self) -> Entry:
        returned = self._returned
        pages = self._pages
        if pages:
            head = pages[0]
            self._load(head)
            entries = head.entries
            assert entries is not None
            entry = entries[0]
            if returned and returned[0].message.id < entry.message.id:
                return self._pop_returned()
            entries.popleft()
            self._forget(head, entry)
            return entry
        if returned:
            return self._pop_returned()
        raise IndexError("pop from an empty queue")

    def put_back(self, ref: MessageRef) -> Entry | None:
        """Back among the released refs, in id order (see the module docstring)."""
        bisect.insort(self._returned, ref, key=_message_id)
        self.bytes += len(ref.message.data)
        return None

    def newer_than(self, message_id: int) -> Iterator[Entry]:
        """Entries that arrived after `message_id`, in delivery order, lazily.

        An iterator, not a list: a browser stops when its credit does, and a list would
        decode every page behind it. Pages are read without being loaded (see `_walk`).
        """
        return self._walk(message_id)

    def __iter__(self) -> Iterator[Entry]:
        """Every waiting entry in delivery order. Unloaded pages are read, not loaded:
        their entries are copies whose bodies stay in the page bytes until read, and the
        loaded pages (and the memory bound) stay as they are."""
        return self._walk(-1)

    def held(self) -> Iterator[Entry]:
        """As `__iter__`: entries in loaded pages are the objects kept, copies otherwise."""
        return self._walk(-1)

    def remove_if(
        self, predicate: Callable[[Entry], bool], stop: Callable[[], bool] | None = None
    ) -> list[Entry]:
        """Remove and return, in delivery order, the entries `predicate` accepts.

        Each page is loaded in turn (within the bound), since what is taken must be
        in memory and in the broker's books; a page loaded only for this goes first at
        the next eviction.
        """
        taken: list[Entry] = []
        returned = self._returned
        kept_returned: list[Entry] = []
        index = 0
        stopped = False

        def visit_returned(before: int) -> None:
            nonlocal index, stopped
            while index < len(returned) and returned[index].message.id < before:
                if stop is not None and stop():
                    stopped = True
                    return
                ref = returned[index]
                index += 1
                if predicate(ref):
                    taken.append(ref)
                    self.bytes -= len(ref.message.data)
                else:
                    kept_returned.append(ref)

        for page in list(self._pages):
            if stopped:
                break
            head = page is self._pages[0]
            self._load(page)
            entries = page.entries
            assert entries is not None
            snapshot = list(entries)
            kept: deque[Entry] = deque()
            for position, entry in enumerate(snapshot):
                visit_returned(entry.message.id)
                if not stopped and stop is not None and stop():
                    stopped = True
                if stopped:
                    kept.extend(snapshot[position:])
                    break
                if predicate(entry):
                    taken.append(entry)
                    self._forget(page, entry, free=False)
                else:
                    kept.append(entry)
            page.entries = kept
            if page.live == 0:
                self._free_page(page)
            elif not head and page in self._loaded:
                self._loaded.move_to_end(page, last=False)
        if not stopped:
            visit_returned(1 << 64)
        kept_returned.extend(returned[index:])
        self._returned = kept_returned
        return taken

    def remove_if_in(
        self,
        part: int,
        predicate: Callable[[Entry], bool],
        stop: Callable[[], bool] | None,
        after: int,
    ) -> list[Entry]:
        """`remove_if`, asking `predicate` nothing about the entries up to `after` (their
        pages are still walked)."""
        return self.remove_if(lambda entry: entry.message.id > after and predicate(entry), stop)

    def remove_expired(self, now: int) -> list[Entry]:
        """`Waiting.remove_expired`: pages are loaded only when some message in them
        expired (`accepts_any`)."""

        def expired(entry: Entry) -> bool:
            return expired_by(entry, now)

        return self.remove_if(expired) if self.accepts_any(expired) else []

    def accepts_any(self, predicate: Callable[[Entry], bool]) -> bool:
        """Whether `predicate` accepts any waiting entry, loading no page.

        The records of unloaded pages are shown through one reused probe (a message, or
        a ref for records with a delivery count) whose fields are set per record, so a
        scan costs no allocation per message. `predicate` must therefore look, not keep
        what it is given: the broker's take predicates (expiry, prepared acks, management
        moves) read fields, and take calls them again on what it removes anyway.
        """
        for ref in self._returned:
            if predicate(ref):
                return True
        probe = Message.__new__(Message)
        body: Any = _InPage(b"", 0, 0)  # in place of bytes, as OnDisk bodies are
        ref_probe = MessageRef(probe, self.owner)
        kinds: dict[int, MessageKind] = {}
        unpack = HEADER.unpack_from
        header_size = HEADER.size
        for page in list(self._pages):
            if page.entries is not None:
                if any(map(predicate, list(page.entries))):
                    return True
                continue
            data = self._read(page)
            gone, pinned = page.gone, page.pinned
            offset, end = 0, len(data)
            while offset < end:
                length, message_id, expiration, priority, flags, origin, count = unpack(
                    data, offset
                )
                offset += header_size
                body_at = offset
                offset += length
                if gone and message_id in gone:
                    continue
                if flags & PINNED:
                    if predicate(pinned[message_id]):
                        return True
                    continue
                key = (origin << 16) | ((flags & DURABLE) << 8) | priority
                kind = kinds.get(key)
                if kind is None:
                    address, fmt = self._origins[origin]
                    kind = kinds[key] = kind_of(address, fmt, bool(flags & DURABLE), priority)
                body.buffer, body.offset, body.length = data, body_at, length
                probe.id, probe.data, probe.kind = message_id, body, kind
                if flags & LARGE:  # a predicate may ask for the whole message's size
                    probe.data = LargeHead(data[body_at:offset], self._bodies[message_id])
                probe.expiration = expiration
                if flags & REF:
                    ref_probe.delivery_count = count
                    if predicate(ref_probe):
                        return True
                elif predicate(probe):
                    return True
        return False

    def clear(self) -> None:
        """Forget every entry (the caller accounts for them) and empty the file."""
        for page in self._pages:
            page.live = 0  # an iteration under way skips it
            page.entries = None
        self._pages.clear()
        self._loaded.clear()
        self._returned = []
        self._bodies = {}
        self._count = 0
        self.bytes = 0
        self._reset_file()

    # ------------------------------------------------------------------ the file

    def unlink(self) -> None:
        """Remove the page file's name; the open file stays usable until `close`."""
        if not self._unlinked:
            self._unlinked = True
            if _IN_USE.get(self.path) is self:
                del _IN_USE[self.path]
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def close(self) -> None:
        """Delete the page file. What is still waiting stays in memory from now on."""
        self.unlink()
        for page in list(self._pages):
            self._load(page, make_room=False)
        self._close_fd()
        self._fd = -1

    # ------------------------------------------------------------------ internals

    def _origin(self, message: Message) -> int:
        key = (message.kind.address, message.kind.format)
        index = self._origin_index.get(key)
        if index is None:
            if len(self._origins) >= _MAX_ORIGINS:
                return -1
            index = self._origin_index[key] = len(self._origins)
            self._origins.append(key)
        return index

    def _pop_returned(self) -> Entry:
        ref = self._returned.pop(0)
        self.bytes -= len(ref.message.data)
        return ref

    def _forget(self, page: _Page, entry: Entry, *, free: bool = True) -> None:
        """`entry` left `page` (already out of its `entries`)."""
        message_id = entry.message.id
        page.live -= 1
        self._count -= 1
        self.bytes -= len(entry.message.data)
        if page.pinned:
            page.pinned.pop(message_id, None)
        if self._bodies:
            self._bodies.pop(message_id, None)
        if page.live == 0:
            if free:
                self._free_page(page)
        else:
            page.gone.add(message_id)

    def _new_page(self) -> _Page:
        """Start the next tail page; the one that filled is written out at once."""
        full = self._pages[-1] if self._pages else None
        slot = heapq.heappop(self._free) if self._free else self._next_slot
        if slot == self._next_slot:
            self._next_slot += 1
        page = _Page(slot)
        self._pages.append(page)
        if full is not None and full.entries is not None:
            self._flush(full)  # written as it fills: evicting it later costs nothing
            self._loaded.move_to_end(full, last=False)  # read last of all: evicted first
        self._make_room()
        self._loaded[page] = None
        self._peak()
        return page

    def _free_page(self, page: _Page) -> None:
        pages = self._pages
        if pages[0] is page:
            pages.popleft()
        else:
            pages.remove(page)
        self._loaded.pop(page, None)
        page.entries = None
        heapq.heappush(self._free, page.slot)
        if not pages:
            self._reset_file()

    def _reset_file(self) -> None:
        """No page is in use: give the file's space back and start again from slot 0."""
        self._free.clear()
        self._next_slot = 0
        if self._file_end and self._fd >= 0:
            os.ftruncate(self._fd, 0)
        self._file_end = 0

    def _load(self, page: _Page, *, make_room: bool = True) -> None:
        if page.entries is not None:
            self._loaded.move_to_end(page)
            return
        if make_room:
            self._make_room()
        entries = self._decode(page, self._read(page), transient=False)
        page.entries = deque(entries)
        self._loaded[page] = None
        self._peak()
        pinned = page.pinned
        self.on_loaded([e for e in entries if e.message.id not in pinned] if pinned else entries)

    def _peak(self) -> None:
        if len(self._loaded) > self.peak_loaded:
            self.peak_loaded = len(self._loaded)

    def _make_room(self) -> None:
        loaded = self._loaded
        while len(loaded) >= self.max_loaded:
            victim = self._victim()
            if victim is None:
                return  # no page could be written: over the bound rather than lose any
            self._unload(victim)

    def _victim(self) -> _Page | None:
        """The least recently used loaded page that is safely in the file; the tail page
        only when no other is loaded (qpid.max_pages_loaded 1)."""
        tail = self._pages[-1] if self._pages else None
        for page in self._loaded:
            if page is not tail and self._flush(page):
                return page
        if tail is not None and tail in self._loaded and self._flush(tail):
            return tail
        return None

    def _unload(self, page: _Page) -> None:
        entries = page.entries
        assert entries is not None
        page.entries = None
        del self._loaded[page]
        pinned = page.pinned
        self.on_unloaded(
            [e for e in entries if e.message.id not in pinned] if pinned else list(entries)
        )

    def _flush(self, page: _Page) -> bool:
        """Write a dirty page whole; False if the file refused it (it stays in memory)."""
        if not page.dirty:
            return True
        if self._fd < 0:
            return False
        assert page.entries is not None
        pinned: dict[int, Entry] = {}
        parts: list[bytes] = []
        append = parts.append
        pack = HEADER.pack
        largest = self.page_size - HEADER.size
        #: kind -> (origin, flags, priority): one lookup per kind, not per message
        kinds: dict[MessageKind, tuple[int, int, int]] = {}
        for entry in page.entries:
            if entry.__class__ is not Message:  # refs and shared messages: the long way
                append(self._serialize(entry, pinned))
                continue
            message = cast(Message, entry)
            data = message.data
            if data.__class__ is not bytes or len(data) > largest:
                append(self._serialize(entry, pinned))  # kept in memory
                continue
            kind = message.kind
            known = kinds.get(kind)
            if known is None:
                origin = self._origin(message)
                if origin < 0:
                    append(self._serialize(entry, pinned))
                    continue
                known = kinds[kind] = (origin, DURABLE if kind.durable else 0, kind.priority)
            origin, flags, priority = known
            append(pack(len(data), message.id, message.expiration, priority, flags, origin, 0))
            append(data)
        image = b"".join(parts)
        if not self._write(image, page.slot * self.page_size):
            return False
        page.size = len(image)
        page.dirty = False
        page.gone = set()
        page.pinned = pinned
        return True

    def _append_unloaded(self, page: _Page, entry: Entry) -> None:
        """Append one record to the file: `page` is the tail, evicted (at most one page
        loaded); if the file refuses it, the page comes back to memory instead."""
        pinned: dict[int, Entry] = {}
        record = self._serialize(entry, pinned)
        if self._fd >= 0 and self._write(record, page.slot * self.page_size + page.size):
            page.size += len(record)
            page.pinned.update(pinned)
            if not pinned:
                self.on_unloaded([entry])
            return
        self._load(page)
        assert page.entries is not None
        page.entries.append(entry)
        page.dirty = True
        page.size += len(record)

    def _serialize(self, entry: Entry, pinned: dict[int, Entry]) -> bytes:
        """`entry`'s record; a header only, and `entry` added to `pinned`, when it must
        stay in memory (see the module docstring)."""
        message = entry.message
        data = message.data
        origin = -1
        if _pageable(entry):
            if HEADER.size + len(data) <= self.page_size:
                origin = self._origin(message)
            else:  # routing refuses these; one that came another way is kept, not lost
                log.warning(
                    "message larger than a page kept in memory",
                    queue=getattr(self.owner, "name", None),
                    message=message.id,
                    size=len(data),
                    page_size=self.page_size,
                )
        flags = DURABLE if message.kind.durable else 0
        count = 0
        if entry.__class__ is not Message and isinstance(entry, MessageRef):
            flags |= REF
            count = entry.delivery_count
        if origin < 0:
            pinned[message.id] = entry
            return HEADER.pack(
                0, message.id, message.expiration, message.priority, flags | PINNED, 0, count
            )
        if data.__class__ is LargeHead:
            flags |= LARGE
            self._bodies[message.id] = cast(LargeHead, data).body
        header = HEADER.pack(
            len(data), message.id, message.expiration, message.priority, flags, origin, count
        )
        return header + data

    def _write(self, data: bytes, offset: int) -> bool:
        try:
            _pwrite_all(self._fd, data, offset)
        except OSError as exc:
            self.write_errors += 1
            log.error("page file write failed", path=str(self.path), error=str(exc))
            return False
        self.page_writes += 1
        self._file_end = max(self._file_end, offset + len(data))
        return True

    def _read(self, page: _Page) -> bytes:
        data = os.pread(self._fd, page.size, page.slot * self.page_size)
        self.page_reads += 1
        if len(data) != page.size:
            raise OSError(
                f"page file {self.path}: read {len(data)} of {page.size} bytes "
                f"at offset {page.slot * self.page_size}"
            )
        return data

    def _decode(self, page: _Page, data: bytes, *, transient: bool) -> list[Entry]:
        """The waiting entries in a page's bytes; `transient` ones keep their bodies in
        `data` until read (copies to look at, see `_InPage`).

        Messages are built as `Message.__init__` builds them, with their interned kind
        looked up once per (origin, durable, priority) instead of once per record: a page
        load or scan decodes thousands of records on the event loop.
        """
        out: list[Entry] = []
        append = out.append
        gone, pinned, origins, owner = page.gone, page.pinned, self._origins, self.owner
        kinds: dict[int, MessageKind] = {}
        new = Message.__new__
        unpack = HEADER.unpack_from
        header_size = HEADER.size
        offset, end = 0, len(data)
        while offset < end:
            length, message_id, expiration, priority, flags, origin, count = unpack(data, offset)
            offset += header_size
            body_at = offset
            offset += length
            if gone and message_id in gone:
                continue
            if flags & PINNED:
                append(pinned[message_id])
                continue
            key = (origin << 16) | ((flags & DURABLE) << 8) | priority
            kind = kinds.get(key)
            if kind is None:
                address, fmt = origins[origin]
                kind = kinds[key] = kind_of(address, fmt, bool(flags & DURABLE), priority)
            message = new(Message)
            message.id = message_id
            body: Any
            if flags & LARGE:
                body = LargeHead(data[body_at:offset], self._bodies[message_id])
            elif transient:
                body = _InPage(data, body_at, length)
            else:
                body = data[body_at:offset]
            message.data = body
            message.kind = kind
            message.expiration = expiration
            append(MessageRef(message, owner, count) if flags & REF else message)
        return out

    def _walk(self, after: int) -> Iterator[Entry]:
        """Entries with an id above `after` in delivery order: the pages' merged by id
        with the refs put back. Unloaded pages are decoded as transient copies."""
        returned = list(self._returned)
        index = 0
        for page in list(self._pages):
            if page.max_id <= after or page.live == 0:  # older, or emptied meanwhile
                continue
            if page.entries is not None:
                entries: list[Entry] = list(page.entries)
            else:
                entries = self._decode(page, self._read(page), transient=True)
            if index == len(returned) and after < 0:
                yield from entries  # nothing to merge or skip: the common case
                continue
            for entry in entries:
                message_id = entry.message.id
                while index < len(returned) and returned[index].message.id < message_id:
                    ref = returned[index]
                    index += 1
                    if ref.message.id > after:
                        yield ref
                if message_id > after:
                    yield entry
        for ref in returned[index:]:
            if ref.message.id > after:
                yield ref


# --------------------------------------------------------------------------- the queue


class QpidPagedQueue(StandardQueue):
    """A standard queue over `PagedWaiting`, refusing at routing what it cannot hold.

    The broker asks `admit(message)` of each queue a message is routed to before the
    message is stored or enqueued anywhere, so a refusal refuses the send as a whole. A
    message that reaches the queue without routing (a dead-letter copy) is never refused:
    one larger than a page stays in memory.
    """

    def __init__(self, spec: QueueSpec, broker: Broker, settings: PagingSettings) -> None:
        directory = Path(str(broker.config.section("broker")["data-dir"])) / PAGE_DIRECTORY
        path = directory / escaped_file_name(spec.name)
        try:
            waiting = PagedWaiting(
                path,
                settings.page_size,
                settings.max_pages_loaded,
                on_unloaded=self._left_memory,
                on_loaded=self._came_back,
            )
        except OSError as exc:  # e.g. the data dir is not writable
            raise BrokerError(
                f"qpid-paged queue '{spec.name}': cannot create its page file {path}: "
                f"{exc.strerror or exc}"
            ) from exc
        super().__init__(spec, broker, waiting=waiting)
        waiting.owner = self
        self.paging: PagedWaiting = waiting
        self.settings = settings
        self._resume_scheduled = False

    def __repr__(self) -> str:
        return f"<QpidPagedQueue {self.name!r} on {self.address!r}, {self.paging!r}>"

    # ------------------------------------------------------------------ admission

    def admit(self, message: Message) -> None:
        """Raise ResourceLimitExceeded if the queue cannot take `message`: larger than a
        page, or over qpid.max_count / qpid.max_size (reject policy, or ring when even
        dropping every waiting message would not make room)."""
        size = len(message.data)
        settings = self.settings
        if HEADER.size + size > settings.page_size:
            raise ResourceLimitExceeded(
                f"message of {size} bytes is larger than the page size {settings.page_size} "
                f"of qpid-paged queue '{self.name}' (a record holds at most "
                f"{settings.page_size - HEADER.size} bytes of message after its "
                f"{HEADER.size}-byte header; raise qpid.page_factor for larger messages)"
            )
        max_count, max_size = settings.max_count, settings.max_size
        if not (max_count or max_size):
            return
        if settings.ring:  # the oldest waiting ones go, but not those being delivered
            count, held = self.delivering, self.delivering_bytes
        else:
            count, held = self.message_count(), self._held_bytes()
        policy = "ring" if settings.ring else "reject"
        if max_count and count + 1 > max_count:
            raise ResourceLimitExceeded(
                f"qpid-paged queue '{self.name}' is full: {count} messages"
                f"{' being delivered' if settings.ring else ''}, qpid.max_count {max_count} "
                f"(qpid.policy_type {policy})"
            )
        if max_size and held + size > max_size:
            raise ResourceLimitExceeded(
                f"qpid-paged queue '{self.name}' is full: {held} bytes"
                f"{' being delivered' if settings.ring else ''} and a message of {size} "
                f"bytes exceed qpid.max_size {max_size} (qpid.policy_type {policy})"
            )

    def _held_bytes(self) -> int:
        cursor = self.cursor
        paged = cursor.backlog_bytes if cursor is not None else 0
        return self.paging.bytes + self.delivering_bytes + paged

    # ------------------------------------------------------------------ messages

    def enqueue(self, entry: Entry) -> None:
        super().enqueue(entry)
        settings = self.settings
        if settings.ring and (settings.max_count or settings.max_size):
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Ring policy: drop (acknowledge undelivered) the oldest waiting messages while
        the queue is over a limit."""
        settings = self.settings
        waiting = self.paging
        while waiting and (
            (settings.max_count and self.message_count() > settings.max_count)
            or (settings.max_size and self._held_bytes() > settings.max_size)
        ):
            self._drop(waiting.popleft())

    def take(self, predicate: Callable[[Entry], bool] | None = None) -> list[MessageRef]:
        """Remove waiting entries `predicate` accepts (all when None); returns their refs.

        As the standard queue's, with its cheap first pass (mostly nothing is taken: the
        expiry scan's `remove_expired` goes through it too) done without decoding
        the pages (`PagedWaiting.accepts_any`). Taking everything from a queue the broker
        no longer has (it is being deleted) deletes the page file too.
        """
        waiting = self.paging
        if predicate is None:
            taken = waiting.remove_if(lambda _entry: True)
        elif waiting.accepts_any(predicate):
            taken = waiting.remove_if(predicate)
        else:
            return []
        for entry in taken:  # whoever takes them reads them (as the standard queue's)
            entry.message.restore()
        refs = [entry.as_ref(self) for entry in taken]
        if predicate is None and self.broker.queues.get(self.name) is not self:
            self.close()
        return refs

    def close(self) -> None:
        """Delete the page file (the queue is deleted)."""
        self.paging.close()

    def unlink_page_file(self) -> None:
        """The broker stops: the file goes, its open descriptor serves until the end."""
        self.paging.unlink()

    # ------------------------------------------------------------------ the broker's books

    def _left_memory(self, entries: list[Entry]) -> None:
        self._books(entries, -1)
        if entries and not self._resume_scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop, no producer waiting for room
            self._resume_scheduled = True
            loop.call_soon(self._resume)

    def _came_back(self, entries: list[Entry]) -> None:
        self._books(entries, 1)

    def _books(self, entries: list[Entry], sign: int) -> None:
        """Move `entries` out of (-1) or back into (+1) the memory figures the broker
        keeps per address and in total, and this queue's `memory_bytes`."""
        if not entries:
            return
        per_address: dict[str, list[int]] = {}
        total = 0
        for entry in entries:
            message = entry.message
            size = len(message.data)
            total += size
            figures = per_address.get(message.kind.address)
            if figures is None:
                per_address[message.kind.address] = [1, size]
            else:
                figures[0] += 1
                figures[1] += size
        self.memory_bytes += sign * total
        broker = self.broker
        limits = broker.limits
        for name, (count, size) in per_address.items():
            address = broker.addresses.get(name)
            if address is None:
                continue
            size = sign * (size + count * MEMORY_OVERHEAD)
            count *= sign
            address.size += size
            address.message_count += count
            limits.size += size
            limits.messages += count

    def _resume(self) -> None:
        """Pages went out: addresses that had no room may have some now (what the broker
        does when messages are acknowledged), outside the enqueue that evicted them."""
        self._resume_scheduled = False
        self.broker.resume_producers()

    # ------------------------------------------------------------------ figures

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        waiting = self.paging
        out["messages-in-memory"] = waiting.in_memory() + self.delivering
        out.update(
            {
                "pages": waiting.pages,
                "pages-loaded": waiting.pages_loaded,
                "pages-loaded-peak": waiting.peak_loaded,
                "max-pages-loaded": waiting.max_loaded,
                "page-size": waiting.page_size,
                "page-reads": waiting.page_reads,
                "page-writes": waiting.page_writes,
                "page-write-errors": waiting.write_errors,
                "page-file": str(waiting.path),
            }
        )
        return out


def _queue(spec: QueueSpec, broker: Broker) -> QpidPagedQueue:
    return QpidPagedQueue(spec, broker, PagingSettings.from_arguments(dict(spec.arguments)))


@hookimpl
def scow_register_queue_types() -> list[QueueType]:
    return [
        QueueType(
            "qpid-paged",
            _queue,
            "FIFO queue holding at most qpid.max_pages_loaded pages in memory, the rest "
            "in a page file (Qpid's paged queue)",
            selected_by=("qpid.paging",),
            arguments=ARGUMENTS,
            check=check,
        )
    ]


@hookimpl
def scow_broker_stopping(broker: Broker) -> None:
    """Page files do not outlive a clean shutdown (as qpidd's); the descriptors stay
    open for what is still delivered while the broker winds down."""
    for queue in list(broker.queues.values()):
        if isinstance(queue, QpidPagedQueue):
            queue.unlink_page_file()
