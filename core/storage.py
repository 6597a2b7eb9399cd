"""Maps broker operations onto journal records (Artemis's storage manager).

The journals store records with ids and types and know nothing about messages; this
module decides what a durable address, queue, message, acknowledgement or delivery-count
update looks like as records, and turns recovered records back into broker state.

Message journal records:
  MESSAGE        add     id = message id; address, expiration, the queue ids it was
                         routed to, and the message bytes
  LARGE_MESSAGE  add     a large message (`scow.core.large_messages`): its file's id, the
                         length of the head in it and its length, then as MESSAGE with
                         the head for the bytes; its other records are a MESSAGE's
  PACKED_ROWS    add     as MESSAGE, for a transaction's packed send routed whole
                         (`scow.core.message.PackedRows`: a queue stores it as its rows);
                         its other records are a MESSAGE's
  ACK_REF        update  a queue acknowledged it (written only while other queues hold it)
  DELIVERY_COUNT update  (queue id, delivery count), replaceable
  (delete)               the last reference went away
  CURSOR_PAGE    add     a queue's acknowledgements in one page of its address: (queue
                         id, page); deleted with the page
  CURSOR_ACK     update  the queue acknowledged the paged message at this byte offset
  CURSOR_COUNT   update  (offset, delivery count) of a paged message
  PAGE_TX        add     id = a transaction id: its page records are committed; written
                         in the transaction, deleted once its pages are gone
  DUPLICATE_KEYS add     a block of ids of an address's duplicate-id cache: (address,
                         the id keys back to back, oldest first: a key is the id's
                         AMQP encoding, which gives its own length); the ids admitted on
                         their own in one loop pass (unsynced), or those of one journal
                         transaction (the messages they admit are in it); all its ids
                         are in one generation of the cache (`DuplicateIdCache`), and it
                         is deleted when that generation is dropped; recovery replays
                         the blocks in order into the same generations
  DUPLICATE_IDS  add     a block as written before 2026-11-25: each key after its length,
                         a key a tag byte and the id (`duplicates.current_key`); still
                         read, deleted as DUPLICATE_KEYS are
  DUPLICATE_ID   add     one id, as (address, id key): written before blocks, still read
A journal refuses a record it has no room for with `StorageFull` (changing nothing), so
every method here either stores what it was asked to or raises without effect.

Bindings journal records:
  ADDRESS, QUEUE add     JSON descriptions; deleted when the address or queue is
  ID_BLOCK       update  the end of the block of ids handed out, replaceable
"""

from __future__ import annotations

import functools
import json
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from scow.core.duplicates import split_keys
from scow.core.interfaces import Completion, Journal, LoadResult, PreparedTransaction
from scow.core.large_messages import large_body
from scow.core.message import PackedRows

MESSAGE = 10
ACK_REF = 11
LARGE_MESSAGE = 13
PACKED_ROWS = 14
DELIVERY_COUNT = 12
CURSOR_PAGE = 20
CURSOR_ACK = 21
CURSOR_COUNT = 22
PAGE_TX = 23
DUPLICATE_ID = 24  # read only: written before DUPLICATE_IDS
DUPLICATE_IDS = 25  # read only: written before DUPLICATE_KEYS
DUPLICATE_KEYS = 26
#: The records that add a message.
_MESSAGE_RECORDS = frozenset((MESSAGE, LARGE_MESSAGE, PACKED_ROWS))
ADDRESS = 1
QUEUE = 2
ID_BLOCK = 3

#: Record id of the id-block record in the bindings journal.
ID_BLOCK_RECORD = 1
ID_BLOCK_SIZE = 1 << 20

# expiration, priority, address length, queue count; the priority is kept so recovery
# never has to parse the message itself
_MSG_HEAD = struct.Struct(">QBHH")
_QID = struct.Struct(">Q")
_COUNT = struct.Struct(">QI")
_CURSOR_PAGE = struct.Struct(">QQ")
_ADDRESS_LEN = struct.Struct(">H")
_KEY_LEN = struct.Struct(">I")
# file id, head size in the file, file length
_LARGE = struct.Struct(">QQQ")


def encode_message_record(
    address: str, expiration: int, priority: int, queue_ids: Iterable[int], data: bytes
) -> bytes:
    ids = list(queue_ids)
    addr = address.encode()
    return b"".join(
        (
            _MSG_HEAD.pack(expiration, priority, len(addr), len(ids)),
            addr,
            struct.pack(f">{len(ids)}Q", *ids),
            data,
        )
    )


def decode_message_record(
    record: bytes, addresses: dict[bytes, str] | None = None
) -> RecoveredMessage:
    """The message a MESSAGE record holds; `addresses` caches decoded address names."""
    expiration, priority, alen, qcount = _MSG_HEAD.unpack_from(record)
    pos = _MSG_HEAD.size + alen
    raw = record[_MSG_HEAD.size : pos]
    address = addresses.get(raw) if addresses is not None else None
    if address is None:
        address = raw.decode()
        if addresses is not None:
            addresses[raw] = address
    if qcount == 1:
        queues = {_QID.unpack_from(record, pos)[0]: 0}
    else:
        queues = dict.fromkeys(struct.unpack_from(f">{qcount}Q", record, pos), 0)
    return RecoveredMessage(0, address, expiration, priority, record[pos + 8 * qcount :], queues)


def encode_large_ref(file_id: int, head_size: int, length: int) -> bytes:
    """What a LARGE_MESSAGE record (or a page record) holds before the message's record."""
    return _LARGE.pack(file_id, head_size, length)


def decode_large_record(
    record: bytes, addresses: dict[bytes, str] | None = None
) -> RecoveredMessage:
    """The message a LARGE_MESSAGE record holds, its head for data."""
    message = decode_message_record(record[_LARGE.size :], addresses)
    message.large = _LARGE.unpack_from(record)
    return message


def _decode_any(
    rec_type: int, record: bytes, addresses: dict[bytes, str] | None = None
) -> RecoveredMessage:
    if rec_type == LARGE_MESSAGE:
        return decode_large_record(record, addresses)
    message = decode_message_record(record, addresses)
    if rec_type == PACKED_ROWS:
        message.data = PackedRows(message.data)
    return message


def _address_prefix(address: str) -> bytes:
    addr = address.encode()
    return _ADDRESS_LEN.pack(len(addr)) + addr


def decode_duplicate_keys(record: bytes) -> tuple[str, list[bytes]]:
    """(address, id keys oldest first) of a DUPLICATE_KEYS record."""
    (alen,) = _ADDRESS_LEN.unpack_from(record)
    pos = _ADDRESS_LEN.size + alen
    return record[_ADDRESS_LEN.size : pos].decode(), split_keys(record, pos)


def decode_duplicate_ids(record: bytes) -> tuple[str, list[bytes]]:
    """(address, id keys oldest first, as keyed then) of a DUPLICATE_IDS record."""
    (alen,) = _ADDRESS_LEN.unpack_from(record)
    pos = _ADDRESS_LEN.size + alen
    address = record[_ADDRESS_LEN.size : pos].decode()
    keys = []
    unpack, size, end = _KEY_LEN.unpack_from, _KEY_LEN.size, len(record)
    while pos < end:
        (length,) = unpack(record, pos)
        pos += size + length
        keys.append(record[pos - length : pos])
    return address, keys


def decode_duplicate_id(record: bytes) -> tuple[str, bytes]:
    """(address, id key) of a DUPLICATE_ID record (one id, as written before blocks)."""
    (alen,) = _ADDRESS_LEN.unpack_from(record)
    end = _ADDRESS_LEN.size + alen
    return record[_ADDRESS_LEN.size : end].decode(), record[end:]


@dataclass(frozen=True, slots=True)
class RecoveredDuplicateId:
    """An id of an address's duplicate-id cache, as journaled (the ids of one block share
    its `record_id`)."""

    record_id: int
    address: str
    key: bytes


@dataclass(slots=True)
class RecoveredMessage:
    id: int
    address: str
    expiration: int
    priority: int
    data: bytes
    #: queue id -> delivery count, for every queue still holding the message.
    queues: dict[int, int] = field(default_factory=dict)
    #: Stored in its address's pages, not in the journal.
    paged: bool = False
    #: A large message: (file id, head size, file length) of its body's file; `data`
    #: is its head.
    large: tuple[int, int, int] | None = None


@dataclass(slots=True)
class RecoveredPrepared:
    """A prepared, undecided transaction: the messages it adds and the acks it holds."""

    tx_id: int
    messages: list[RecoveredMessage] = field(default_factory=list)
    #: (message id, queue id) per acknowledgement; queue id None: every queue (a delete)
    acks: list[tuple[int, int | None]] = field(default_factory=list)


@dataclass(slots=True)
class CursorPage:
    """A queue's journaled acknowledgements and delivery counts in one page."""

    record_id: int
    queue_id: int
    page: int
    acked: set[int] = field(default_factory=set)  # byte offsets of acknowledged records
    counts: dict[int, int] = field(default_factory=dict)  # offset -> delivery count


@dataclass
class PageRecovery:
    """The paging records recovery found, for the paging plugin to apply to its pages."""

    #: (queue id, page) -> what that queue journaled about the page.
    cursor_pages: dict[tuple[int, int], CursorPage] = field(default_factory=dict)
    #: Transactions whose paged messages were committed.
    page_txs: set[int] = field(default_factory=set)


@dataclass
class Recovered:
    addresses: list[dict] = field(default_factory=list)  # with "id"
    queues: list[dict] = field(default_factory=list)  # with "id"
    messages: list[RecoveredMessage] = field(default_factory=list)
    prepared: list[RecoveredPrepared] = field(default_factory=list)
    pages: PageRecovery = field(default_factory=PageRecovery)
    #: Every address's duplicate-id cache, oldest id first (record ids grow with time);
    #: a record written before the cache had generations (2026-11-25) may hold ids it had
    #: forgotten, which replaying the records drops again.
    duplicate_ids: list[RecoveredDuplicateId] = field(default_factory=list)
    next_id: int = 1


class StorageManager:
    """Durable state of one broker, over a bindings journal and a message journal."""

    def __init__(
        self,
        bindings: Journal | None,
        messages: Journal | None,
        *,
        sync_non_transactional: bool = True,
        sync_transactional: bool = True,
    ) -> None:
        """Without journals (persistence disabled) nothing is stored and ids start at 1."""
        self._bindings = bindings
        self._messages = messages
        self.sync = sync_non_transactional
        self.sync_tx = sync_transactional
        self._next_id = 1
        self._id_limit = 0
        self._have_block = False  # the ID_BLOCK record exists in the bindings journal
        # On a full file system a journal that can refuse only some records (the file
        # journal) refuses new messages first: acknowledgements, delivery counts and cursor
        # records are what frees space, so they keep the room that is left.
        hold_back = getattr(messages, "hold_back", None)
        if hold_back is not None:
            hold_back({MESSAGE, LARGE_MESSAGE, PACKED_ROWS, PAGE_TX, DUPLICATE_KEYS})
        # The two journals sync apart: a message must not be confirmed before the bindings
        # records it relies on (its auto-created queue, the id block covering its id) are
        # durable too, or a crash right after the confirmation loses it. Records appended
        # and made durable so far, and the completions held back until they catch up.
        self._bindings_appended = 0
        self._bindings_durable = 0
        self._held: list[tuple[int, Completion]] = []
        self._held_lock = threading.Lock()
        #: Encoded address names, the start of every DUPLICATE_KEYS record of theirs.
        self._id_prefixes: dict[str, bytes] = {}

    def stats(self) -> dict[str, Any]:
        """Each journal's own figures, when its backend reports some."""
        out: dict[str, Any] = {}
        for name, journal in (("bindings", self._bindings), ("messages", self._messages)):
            stats = getattr(journal, "stats", None)
            if journal is not None and stats is not None:
                out[name] = stats()
        return out

    @property
    def journals(self) -> list[Journal]:
        return [j for j in (self._messages, self._bindings) if j is not None]

    @property
    def bindings(self) -> Journal:
        if self._bindings is None:
            raise RuntimeError("persistence is disabled: there is no bindings journal")
        return self._bindings

    @property
    def messages(self) -> Journal:
        if self._messages is None:
            raise RuntimeError("persistence is disabled: there is no message journal")
        return self._messages

    def set_dispatcher(self, dispatch: Callable[[list[Completion]], None]) -> None:
        for journal in self.journals:
            journal.set_dispatcher(dispatch)

    def hold_producers(self, on_backlog: Callable[[str, bool], None]) -> None:
        """`on_backlog(journal, hold)` whenever a journal that can tell (file, database)
        falls too far behind its disk (True) and catches up again (False), from any thread."""
        for name, journal in (("bindings", self._bindings), ("messages", self._messages)):
            hold = getattr(journal, "hold_producers", None)
            if hold is not None:
                hold(functools.partial(on_backlog, f"journal {name}"))

    # ------------------------------------------------------------------ ids

    def next_id(self) -> int:
        """A fresh id for a message, queue or address, never reused across restarts."""
        if self._next_id >= self._id_limit and self._bindings is not None:
            limit = self._next_id + ID_BLOCK_SIZE
            block = _QID.pack(limit)
            if self._have_block:
                self.bindings.append_update(
                    ID_BLOCK_RECORD,
                    ID_BLOCK,
                    block,
                    sync=True,
                    replaceable=True,
                    on_done=self._binding_durable,
                )
            else:
                self.bindings.append_add(
                    ID_BLOCK_RECORD, ID_BLOCK, block, sync=True, on_done=self._binding_durable
                )
                self._have_block = True
            self._bindings_appended += 1
            self._id_limit = limit  # only once appended: a refused block hands out no id
        value = self._next_id
        self._next_id += 1
        return value

    # ------------------------------------------------------------------ bindings

    def store_address(self, record_id: int, description: dict) -> None:
        self.bindings.append_add(
            record_id,
            ADDRESS,
            json.dumps(description).encode(),
            sync=True,
            on_done=self._binding_durable,
        )
        self._bindings_appended += 1

    def store_queue(self, record_id: int, description: dict) -> None:
        self.bindings.append_add(
            record_id,
            QUEUE,
            json.dumps(description).encode(),
            sync=True,
            on_done=self._binding_durable,
        )
        self._bindings_appended += 1

    def delete_binding(self, record_id: int) -> None:
        self.bindings.append_delete(record_id, sync=True, on_done=self._binding_durable)
        self._bindings_appended += 1

    def after_bindings(self, on_done: Completion) -> Completion:
        """`on_done`, held back until every bindings record appended so far is durable.

        Whatever confirms a message to its producer goes through this (the message journal
        and the pages sync apart from the bindings journal)."""
        needed = self._bindings_appended
        if self._bindings_durable >= needed:
            return on_done

        def done() -> None:
            with self._held_lock:
                if self._bindings_durable < needed:
                    self._held.append((needed, on_done))
                    return
            on_done()

        return done

    def _binding_durable(self) -> None:
        """A bindings record is durable (they complete in append order)."""
        with self._held_lock:
            self._bindings_durable += 1
            durable = self._bindings_durable
            ready = [done for needed, done in self._held if needed <= durable]
            if ready:
                self._held = [(n, done) for n, done in self._held if n > durable]
        for done in ready:
            done()

    # ------------------------------------------------------------------ messages

    def store_message(
        self,
        message_id: int,
        address: str,
        expiration: int,
        priority: int,
        queue_ids: list[int],
        data: bytes,
        on_done: Completion | None,
        *,
        tx_id: int | None = None,
    ) -> None:
        record = encode_message_record(address, expiration, priority, queue_ids, data)
        kind = MESSAGE
        if data.__class__ is not bytes:  # one test on the common path
            if data.__class__ is PackedRows:
                kind = PACKED_ROWS
            elif (body := large_body(data)) is not None:
                kind = LARGE_MESSAGE
                record = encode_large_ref(body.file_id, body.head_size, body.length) + record
        if tx_id is not None:
            self.messages.append_add_tx(tx_id, message_id, kind, record)
            return
        if on_done is not None and self._bindings_durable < self._bindings_appended:
            on_done = self.after_bindings(on_done)
        self.messages.append_add(message_id, kind, record, sync=self.sync, on_done=on_done)

    def acknowledge(
        self, message_id: int, queue_id: int, last: bool, *, tx_id: int | None = None
    ) -> None:
        """A queue is done with a message; the last one deletes the message record."""
        journal = self.messages
        if tx_id is not None:
            if last:
                journal.append_delete_tx(tx_id, message_id)
            else:
                journal.append_update_tx(tx_id, message_id, ACK_REF, _QID.pack(queue_id))
        elif last:
            journal.append_delete(message_id, sync=self.sync)
        else:
            journal.append_update(message_id, ACK_REF, _QID.pack(queue_id), sync=self.sync)

    def commit(self, tx_id: int, on_done: Completion) -> None:
        self.messages.commit(tx_id, sync=self.sync_tx, on_done=self.after_bindings(on_done))

    def rollback(self, tx_id: int) -> None:
        self.messages.rollback(tx_id, sync=self.sync_tx)

    def update_delivery_count(
        self, message_id: int, queue_id: int, count: int, on_done: Completion | None = None
    ) -> None:
        self.messages.append_update(
            message_id,
            DELIVERY_COUNT,
            _COUNT.pack(queue_id, count),
            sync=self.sync,
            on_done=on_done,
            replaceable=True,
        )

    # ------------------------------------------------------------------ paged messages

    def store_cursor_page(self, record_id: int, queue_id: int, page: int) -> None:
        """Open the record holding a queue's acknowledgements in one page."""
        self.messages.append_add(
            record_id, CURSOR_PAGE, _CURSOR_PAGE.pack(queue_id, page), sync=False
        )

    def cursor_ack(self, record_id: int, offset: int, *, tx_id: int | None = None) -> None:
        data = _QID.pack(offset)
        if tx_id is not None:
            self.messages.append_update_tx(tx_id, record_id, CURSOR_ACK, data)
        else:
            self.messages.append_update(record_id, CURSOR_ACK, data, sync=self.sync)

    def cursor_delivery_count(
        self, record_id: int, offset: int, count: int, on_done: Completion
    ) -> None:
        self.messages.append_update(
            record_id, CURSOR_COUNT, _COUNT.pack(offset, count), sync=self.sync, on_done=on_done
        )

    def store_page_tx(self, tx_id: int) -> None:
        """Within `tx_id`: its records in pages count as committed once it commits."""
        self.messages.append_add_tx(tx_id, tx_id, PAGE_TX, b"")

    def delete_record(self, record_id: int, *, tx_id: int | None = None) -> None:
        """Drop a cursor-page or page-tx record whose pages are gone, or a block of
        duplicate ids whose generation left its cache (within `tx_id`: when it commits)."""
        if tx_id is not None:
            self.messages.append_delete_tx(tx_id, record_id)
        else:
            self.messages.append_delete(record_id, sync=False)

    # ------------------------------------------------------------------ duplicate ids

    def store_duplicate_ids(
        self,
        record_id: int,
        address: str,
        keys: list[bytes],
        *,
        tx_id: int | None = None,
        deleting: Iterable[int] = (),
    ) -> None:
        """Journal a block of ids of `address`'s duplicate-id cache (oldest first; the
        keys of a block admitted on its own come joined, as one) as record `record_id`:
        within `tx_id`, the transaction of the messages they admit (so both are durable,
        or neither), else unsynced. The records of `deleting` (of blocks of a generation
        dropped from the cache) are deleted first."""
        journal = self.messages
        prefix = self._id_prefixes.get(address)
        if prefix is None:
            if len(self._id_prefixes) >= 4096:  # addresses may come and go without end
                self._id_prefixes.clear()
            prefix = self._id_prefixes[address] = _address_prefix(address)
        data = prefix + b"".join(keys)  # each key gives its own length
        if tx_id is not None:
            for record in deleting:
                journal.append_delete_tx(tx_id, record)
            journal.append_add_tx(tx_id, record_id, DUPLICATE_KEYS, data)
        else:
            for record in deleting:
                journal.append_delete(record, sync=False)
            journal.append_add(record_id, DUPLICATE_KEYS, data, sync=False)

    # ------------------------------------------------------------------ recovery

    def load(self) -> Recovered:
        """Recover both journals; call once at startup."""
        out = Recovered()
        if self._bindings is None or self._messages is None:
            self._id_limit = 1 << 62
            return out
        bindings = self.bindings.load()
        id_limit = 0
        for rec in bindings.records:
            if rec.type == ID_BLOCK:
                id_limit = max(id_limit, _QID.unpack(rec.data)[0])
                self._have_block = True
            elif rec.type == ADDRESS and not rec.is_update:
                out.addresses.append({**json.loads(rec.data), "id": rec.id})
            elif rec.type == QUEUE and not rec.is_update:
                out.queues.append({**json.loads(rec.data), "id": rec.id})
        messages = self.messages.load()
        out.messages = _messages_from(messages)
        out.pages = _pages_from(messages)
        out.duplicate_ids = _duplicate_ids_from(messages)
        out.prepared = [_prepared_from(tx) for tx in messages.prepared]
        self._next_id = max(id_limit, bindings.max_id, messages.max_id, ID_BLOCK_RECORD) + 1
        self._id_limit = 0
        out.next_id = self._next_id
        return out

    def flush(self) -> None:
        for journal in self.journals:
            journal.flush()

    def stop(self) -> None:
        for journal in self.journals:
            journal.stop()


def _messages_from(result: LoadResult) -> list[RecoveredMessage]:
    """Live messages in journal order (the order they became visible)."""
    by_id: dict[int, RecoveredMessage] = {}
    addresses: dict[bytes, str] = {}
    for rec in result.records:
        if rec.type in _MESSAGE_RECORDS and not rec.is_update:
            message = _decode_any(rec.type, rec.data, addresses)
            message.id = rec.id
            by_id[rec.id] = message
            continue
        msg = by_id.get(rec.id)
        if msg is None:
            continue
        if rec.type == ACK_REF:
            msg.queues.pop(_QID.unpack(rec.data)[0], None)
        elif rec.type == DELIVERY_COUNT:
            qid, count = _COUNT.unpack(rec.data)
            if qid in msg.queues:
                msg.queues[qid] = count
    return [m for m in by_id.values() if m.queues]


def _pages_from(result: LoadResult) -> PageRecovery:
    out = PageRecovery()
    by_id: dict[int, CursorPage] = {}
    for rec in result.records:
        if rec.type == CURSOR_PAGE and not rec.is_update:
            queue_id, page = _CURSOR_PAGE.unpack(rec.data)
            by_id[rec.id] = out.cursor_pages[queue_id, page] = CursorPage(rec.id, queue_id, page)
        elif rec.type == CURSOR_ACK:
            if (cursor := by_id.get(rec.id)) is not None:
                cursor.acked.add(_QID.unpack(rec.data)[0])
        elif rec.type == CURSOR_COUNT:
            if (cursor := by_id.get(rec.id)) is not None:
                offset, count = _COUNT.unpack(rec.data)
                cursor.counts[offset] = count
        elif rec.type == PAGE_TX:
            out.page_txs.add(rec.id)
    return out


def _duplicate_ids_from(result: LoadResult) -> list[RecoveredDuplicateId]:
    found = []
    for rec in result.records:
        if rec.type == DUPLICATE_KEYS and not rec.is_update:
            address, keys = decode_duplicate_keys(rec.data)
            found += [RecoveredDuplicateId(rec.id, address, key) for key in keys]
        elif rec.type == DUPLICATE_IDS and not rec.is_update:
            address, keys = decode_duplicate_ids(rec.data)
            found += [RecoveredDuplicateId(rec.id, address, key) for key in keys]
        elif rec.type == DUPLICATE_ID and not rec.is_update:
            address, key = decode_duplicate_id(rec.data)
            found.append(RecoveredDuplicateId(rec.id, address, key))
    # ids are handed out in increasing order, so this (a stable sort, keeping each block's
    # order) is the order they were admitted in, whatever compaction did to the records
    found.sort(key=lambda d: d.record_id)
    return found


def _prepared_from(tx: PreparedTransaction) -> RecoveredPrepared:
    out = RecoveredPrepared(tx.tx_id)
    for rec in tx.records:
        if rec.type in _MESSAGE_RECORDS and not rec.is_update:
            message = _decode_any(rec.type, rec.data)
            message.id = rec.id
            out.messages.append(message)
        elif rec.type == ACK_REF:
            out.acks.append((rec.id, _QID.unpack(rec.data)[0]))
    out.acks += [(message_id, None) for message_id in tx.deletes]
    return out
