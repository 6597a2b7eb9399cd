"""The standard queue: round-robin to consumers with credit, selectors per consumer.

Dispatch keeps one invariant: after a full `dispatch()`, no waiting message can go to any
consumer that has credit. So a new message only needs to be offered on its own, and a
full pass is needed only when credit or the set of consumers changes.

The order in which waiting messages go out is the waiting list's (`waiting.py`): FIFO
for the standard type, by priority or one per key for the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from scow.core.message import Entry, Message, MessageRef
from scow.core.model import QueueSpec
from scow.plugins.queues.waiting import Fifo, Waiting, put_back_all

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.interfaces import Consumer, Cursor


class StandardQueue:
    """A queue; released messages go back to their original place in its waiting list."""

    #: Refuses messages while they are routed (see `Queue.admit`); a standard queue
    #: takes everything, and None keeps routing free of the call.
    admit: Callable[[Message], None] | None = None

    def __init__(
        self, spec: QueueSpec, broker: Broker, queue_id: int = 0, waiting: Waiting | None = None
    ) -> None:
        self.spec = spec
        self.id = queue_id
        self.name = spec.name
        self.address = spec.address
        self.routing_type = spec.routing_type
        self.durable = spec.durable
        self.broker = broker
        #: Waiting entries in delivery order: messages never delivered from this queue,
        #: and refs that came back with per-queue state.
        #: The standard type's own list, entries in the order they came (message id
        #: order); None for the other types' lists.
        self._fifo = Fifo() if waiting is None else None
        self._messages: Waiting = waiting if self._fifo is None else self._fifo
        self._attached: list[Consumer] = []  # consumers in the order they attached
        #: Those that receive: all of them, or only the first of an exclusive queue.
        self._consumers: list[Consumer] = []
        self._browsers: dict[Consumer, int] = {}  # browser -> last message id it saw
        self._filtered = False  # any consumer with a selector
        #: Per part of the waiting list (`Waiting.parts`; made at the first pass of
        #: `_dispatch_filtered`), in arrival order: consumer with a selector -> a
        #: message id such that every waiting message of the part up to it fails that
        #: selector.
        self._notes: list[dict[Consumer, int]] = []
        #: Those of the part a pass is in.
        self._refused: dict[Consumer, int] = {}
        #: The highest id noted: an entry that comes to wait at or below it (put back,
        #: or moved in) voids every note.
        self._refused_to = 0
        self._scanning = False  # in a pass of `_dispatch_filtered`
        self._rr = 0
        self._dispatching = False
        #: Set by the paging plugin while the queue's address has pages.
        self.cursor: Cursor | None = None
        #: Consumers whose drain waits for a page being read (see `holds_drain`).
        self._held_drains: list[Consumer] = []
        #: Bytes of the messages in memory, waiting or delivering.
        self.memory_bytes = 0
        #: References handed to consumers and not yet settled, and their bytes.
        self.delivering = 0
        self.delivering_bytes = 0
        self.messages_added = 0
        self.messages_acknowledged = 0
        self.messages_expired = 0
        self.messages_killed = 0

    def __repr__(self) -> str:
        return f"<StandardQueue {self.name!r} on {self.address!r}, {len(self._messages)} ready>"

    # ------------------------------------------------------------------ consumers

    def add_consumer(self, consumer: Consumer) -> None:
        if consumer.browse:
            self._browsers[consumer] = 0
        else:
            self._attached.append(consumer)
            self._receivers_changed()
        self.dispatch()

    def consumers(self) -> list[Consumer]:
        return self._consumers

    def attached(self) -> list[Consumer]:
        return [*self._attached, *self._browsers]

    def remove_consumer(self, consumer: Consumer) -> None:
        if self.cursor is not None:
            self.cursor.forget(consumer)
        if consumer in self._held_drains:
            self._held_drains.remove(consumer)
        if self._browsers.pop(consumer, None) is None and consumer in self._attached:
            self._attached.remove(consumer)
            self._receivers_changed()
            if self.spec.exclusive and self._consumers:
                self.dispatch()  # the next consumer takes over

    def _receivers_changed(self) -> None:
        attached = self._attached
        self._consumers = attached[:1] if self.spec.exclusive else attached
        self._filtered = any(c.filter is not None for c in self._consumers)
        if self._refused_to:
            for notes in self._notes:
                for gone in [c for c in notes if c not in self._consumers]:
                    del notes[gone]
            if not any(self._notes):
                self._refused_to = 0

    def _forget_refusals(self) -> None:
        for notes in self._notes:
            notes.clear()
        self._refused_to = 0

    def close(self) -> None:
        """Deleted: a standard queue holds nothing outside memory."""

    def consumer_count(self) -> int:
        return len(self._attached) + len(self._browsers)

    def message_count(self) -> int:
        """Messages in the queue (memory and pages), including those delivered, unsettled."""
        cursor = self.cursor
        paged = cursor.backlog if cursor is not None else 0
        return len(self._messages) + self.delivering + paged

    def ready_count(self) -> int:
        return len(self._messages)

    # ------------------------------------------------------------------ messages

    def enqueue(self, entry: Entry) -> None:
        self.messages_added += 1
        self.memory_bytes += len(entry.message.data)
        if self._messages.may_supersede and self._messages.superseded(entry):
            self._drop(entry)  # a newer value of its key is in pages: never delivered
            return
        if not (self._consumers and not self._dispatching and self._offer(entry)):
            if entry.message.id <= self._refused_to:
                self._forget_refusals()  # not newer than what selectors refused
            replaced = self._messages.append(entry)
            if replaced is not None:
                self._drop(replaced)
        for browser in self._browsers:
            self._dispatch_browser(browser)

    def enqueue_all(self, entries: list[Entry]) -> None:
        """`enqueue` each of `entries`, in order (a cursor's batch read from pages).

        With one consumer, no selectors and no browsers, they go to it up to its credit
        without asking it each time (as `_dispatch_fifo` does), and the rest wait."""
        consumers = self._consumers
        if (
            len(consumers) != 1
            or self._filtered
            or self._browsers
            or self._dispatching
            or self._messages.may_supersede
        ):
            for entry in entries:
                self.enqueue(entry)
            return
        consumer = consumers[0]
        deliver = consumer.deliver
        broker = self.broker
        self.messages_added += len(entries)
        credit = consumer.credit()
        taken = 0  # entries delivered or expired; only deliveries use credit
        for entry in entries:
            if credit <= 0:
                break
            taken += 1
            message = entry.message
            size = len(message.data)
            self.memory_bytes += size
            if message.data.__class__ is not bytes:
                message.restore()  # it flowed to disk: consumers read the bytes
            if message.expiration and broker.expired(message):
                broker.expire(entry.as_ref(self))
                continue
            ref = entry.as_ref(self)
            ref.consumer = consumer
            self.delivering += 1
            self.delivering_bytes += size
            credit = 0 if deliver(ref) else credit - 1
        for entry in entries[taken:]:
            self.memory_bytes += len(entry.message.data)
            self._messages.append(entry)  # no value to supersede: checked above

    def deliverable(self) -> int | None:
        """How many entries `enqueue_all` would hand straight to a consumer now, when that
        is all it would do with them (one consumer, no selector, no browser, arrival
        order): a cursor draining pages hands over no more, so what it read waits in
        the cursor, not as objects in the queue. None when entries may wait or be
        offered around."""
        consumers = self._consumers
        if len(consumers) != 1 or self._filtered or self._browsers or self._fifo is None:
            return None
        credit = consumers[0].credit() - len(self._messages)
        return credit if credit > 0 else 0

    def _offer(self, entry: Entry) -> bool:
        """Give `entry` to the next consumer with credit that accepts it (in a pass of
        `_dispatch_filtered`, noting the selectors that refuse it)."""
        consumers = self._consumers
        n = len(consumers)
        message = entry.message
        if message.data.__class__ is not bytes:
            message.restore()  # it flowed to disk: selectors and consumers read the bytes
        if message.expiration and self.broker.expired(message):
            self.broker.expire(entry.as_ref(self))
            return True
        for _ in range(n):
            self._rr = (self._rr + 1) % n
            consumer = consumers[self._rr]
            if consumer.credit() <= 0:
                continue
            selector = consumer.filter
            if selector is not None:
                if not self._scanning:
                    if not selector(message):
                        continue
                else:
                    refused = self._refused
                    if refused and refused.get(consumer, 0) >= message.id:
                        continue  # it refused this one in an earlier pass
                    if not selector(message):
                        refused[consumer] = message.id
                        if message.id > self._refused_to:
                            self._refused_to = message.id
                        continue
            ref = entry.as_ref(self)
            ref.consumer = consumer
            self.delivering += 1
            self.delivering_bytes += len(message.data)
            consumer.deliver(ref)
            return True
        return False

    def dispatch(self) -> None:
        """Offer waiting messages to consumers with credit, in order."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            if self._browsers:
                for browser in list(self._browsers):
                    self._dispatch_browser(browser)
            if self._consumers and self._messages:
                if self._filtered:
                    self._dispatch_filtered()
                else:
                    self._dispatch_fifo()
        finally:
            self._dispatching = False
        cursor = self.cursor
        if cursor is not None and cursor.backlog and self._consumers:
            cursor.fill(now=True)  # credit may have come: a drain is answered next
        if self._held_drains:
            self._answer_drains()

    def holds_drain(self, consumer: Consumer) -> bool:
        """Whether `consumer`'s drain waits (see `holds_drain` in the interfaces): while
        the cursor reads a page its credit may take from, a drain answered at once would
        find a queue with messages in pages empty (a JMS receiveNoWait drains). It is
        answered (`drain_ready`) once the credit is spent, the pages are, or no read is
        under way. A consumer with a selector is answered at once: its scan may read
        many pages."""
        if not self._drain_waits(consumer):
            return False
        if consumer not in self._held_drains:
            self._held_drains.append(consumer)
        return True

    def _drain_waits(self, consumer: Consumer) -> bool:
        cursor = self.cursor
        return (
            cursor is not None
            and cursor.reading
            and cursor.backlog > 0
            and consumer.filter is None
            and consumer.credit() > 0
        )

    def _answer_drains(self) -> None:
        held, self._held_drains = self._held_drains, []
        for consumer in held:
            if self._drain_waits(consumer):
                self._held_drains.append(consumer)
            else:
                consumer.drain_ready()

    def _dispatch_fifo(self) -> None:
        messages = self._messages
        consumers = self._consumers
        expired = self.broker.expired
        n = len(consumers)
        idle = 0
        while messages and idle < n:
            self._rr = (self._rr + 1) % n
            consumer = consumers[self._rr]
            credit = consumer.credit()
            if credit <= 0:
                idle += 1
                continue
            idle = 0
            for _ in range(min(credit, len(messages))):
                ref = messages.popleft().as_ref(self)
                if ref.message.data.__class__ is not bytes:
                    ref.message.restore()
                if ref.message.expiration and expired(ref.message):
                    self.broker.expire(ref)
                    continue
                ref.consumer = consumer
                self.delivering += 1
                self.delivering_bytes += len(ref.message.data)
                if consumer.deliver(ref) or n > 1:
                    break  # it takes no more now; or round robin: one per consumer per turn

    def _dispatch_filtered(self) -> None:
        """Offer the waiting messages, in order, to consumers of which some have selectors.

        A pass goes over each part of the waiting list in turn (`Waiting.parts`: each in
        message id order; a priority queue's levels) and notes, per part, for each
        consumer with credit, the last message its selector refused (`_notes`): every
        waiting message of the part up to it fails that selector, since the pass offered
        it each one in order and credit only falls during a pass. The next pass (new
        credit: a flow frame, an acknowledgement) starts each part after the lowest such
        id among the consumers with credit and asks no selector again about a message it
        refused, so a selector that matches none of 100,000 waiting messages reads each
        once, not once per flow frame. An entry that comes to wait among them (a message
        put back) voids the notes.
        """
        consumers = self._consumers
        with_credit = [c for c in consumers if c.credit() > 0]
        if not with_credit:
            return

        def no_credit() -> bool:
            return not any(c.credit() > 0 for c in consumers)

        messages = self._messages
        notes = self._notes
        if not notes:
            notes.extend({} for _ in range(messages.parts))
        self._scanning = True
        try:
            for part, refused in enumerate(notes):
                self._refused = refused
                after = min(refused.get(c, 0) if c.filter is not None else 0 for c in with_credit)
                messages.remove_if_in(part, self._offer, no_credit, after)
                with_credit = [c for c in with_credit if c.credit() > 0]
                if not with_credit:
                    break
        finally:
            self._scanning = False

    def _dispatch_browser(self, browser: Consumer) -> None:
        """Show a browser the messages it has not seen yet, oldest first."""
        cursor = self.cursor
        for entry in self._messages.newer_than(self._browsers[browser]):
            if browser.credit() <= 0:
                return
            self._browsers[browser] = entry.message.id
            if cursor is not None and cursor.browsed(browser, entry):
                continue  # it saw this one in the pages already
            entry.message.restore()
            if browser.filter is None or browser.filter(entry.message):
                browser.deliver(entry.as_ref(self))
        if cursor is not None and cursor.backlog:
            cursor.browse(browser)  # then what is still in pages

    # ------------------------------------------------------------------ outcomes

    def acknowledge(self, ref: MessageRef) -> None:
        ref.consumer = None
        size = len(ref.message.data)
        self.delivering -= 1
        self.delivering_bytes -= size
        self.memory_bytes -= size
        self.messages_acknowledged += 1
        cursor = self.cursor
        if cursor is not None and cursor.backlog and self._consumers:
            cursor.fill()

    def release(self, ref: MessageRef, *, delivered: bool) -> None:
        """Return an unsettled ref to its original place and offer it again."""
        self._undeliver(ref)
        self._forget_refusals()  # it goes back among messages selectors refused
        superseded = self._messages.put_back(ref)
        if superseded is not None:
            self._drop(superseded)
        self.dispatch()

    def release_all(self, refs: list[MessageRef], *, delivered: bool) -> None:
        """`release` of each of `refs` (in message id order: a rollback's), put back in
        one pass over the waiting list and offered once."""
        for ref in refs:
            self._undeliver(ref)
        self._forget_refusals()
        for superseded in put_back_all(self._messages, refs):
            self._drop(superseded)
        self.dispatch()

    def _undeliver(self, ref: MessageRef) -> None:
        if ref.consumer is not None:
            ref.consumer = None
            self.delivering -= 1
            self.delivering_bytes -= len(ref.message.data)

    def paged(self, message: Message) -> None:
        """A message for this queue went to pages (a last-value queue forgets the value
        it replaces)."""
        superseded = self._messages.paged(message)
        if superseded is not None:
            self._drop(superseded)

    def wanted_from_pages(self, highest_paged_priority: int) -> Callable[[Message], bool] | None:
        return self._messages.wanted_from_pages(highest_paged_priority)

    def _drop(self, entry: Entry) -> None:
        """A newer message supersedes `entry` (last-value): acknowledged, never delivered."""
        self.memory_bytes -= len(entry.message.data)
        self.messages_acknowledged += 1
        self.broker.discard(entry.as_ref(self))

    def remove_delivering(self, ref: MessageRef) -> None:
        """Forget a ref the broker moved elsewhere (dead-lettered, expired)."""
        size = len(ref.message.data)
        self.memory_bytes -= size
        if ref.consumer is not None:
            ref.consumer = None
            self.delivering -= 1
            self.delivering_bytes -= size

    def take(self, predicate: Callable[[Entry], bool] | None = None) -> list[MessageRef]:
        """Remove waiting entries `predicate` accepts (all when None); returns their refs."""
        if predicate is None:
            taken = list(self._messages)
            self._messages.clear()
        elif any(map(predicate, self._messages)):
            taken = self._messages.remove_if(predicate)
        else:
            return []  # nothing to rebuild
        return self._taken(taken)

    def take_expired(self, now: int) -> list[MessageRef]:
        """`take` of the waiting entries expired by `now` (ms), asking the list only about
        those that can have expired (`Waiting.remove_expired`)."""
        return self._taken(self._messages.remove_expired(now))

    def _taken(self, taken: list[Entry]) -> list[MessageRef]:
        for entry in taken:  # whoever takes them reads them (expiry, dead letters)
            entry.message.restore()
        # still counted in memory_bytes until remove_delivering or deletion
        return [entry.as_ref(self) for entry in taken]

    def waiting(self) -> Iterator[Entry]:
        """The waiting entries in delivery order, as they are (bodies may be on disk);
        messages held compactly become objects for good (`Waiting.held`)."""
        return self._messages.held()

    def browse(self) -> Iterator[MessageRef]:
        return iter([entry.as_ref(self) for entry in self._messages])

    def stats(self) -> dict[str, Any]:
        cursor = self.cursor
        return {
            "name": self.name,
            "address": self.address,
            "routing-type": self.routing_type.value,
            "durable": self.durable,
            "message-count": self.message_count(),
            "messages-in-memory": len(self._messages) + self.delivering,
            "memory-bytes": self.memory_bytes,
            "messages-paged": cursor.backlog if cursor is not None else 0,
            "paged-bytes": cursor.backlog_bytes if cursor is not None else 0,
            "delivering-count": self.delivering,
            "consumer-count": self.consumer_count(),
            "messages-added": self.messages_added,
            "messages-acknowledged": self.messages_acknowledged,
            "messages-expired": self.messages_expired,
            "messages-killed": self.messages_killed,
        }
