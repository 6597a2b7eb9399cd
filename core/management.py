"""Management operations on a running broker, whatever carries them.

Protocol plugins expose these (AMQP's `$management` node; the management plugin's HTTP
API later): each operation takes plain values, returns plain data (JSON-able dicts and
lists) and raises `BrokerError` subclasses whose `status` is the HTTP-style code the
AMQP management draft also uses (400 bad request, 404 not found, 409 conflict, 403
forbidden).

Each operation needs the `manage` permission: on the address of the queue or address it
acts on, or on `$management` for listings, connections and address settings; creating
and deleting need the create/delete permission too. Every change is written to the audit
log with the user who asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from scow.core.broker import Broker
from scow.core.interfaces import Completion, Queue, after_all
from scow.core.large_messages import large_body, message_size
from scow.core.message import Message, MessageRef
from scow.core.model import (
    BrokerError,
    InvalidField,
    NotFound,
    ResourceLimitExceeded,
    ResourceLocked,
    RouteStatus,
    RoutingType,
    Unauthorized,
)
from scow.core.security import Principal

#: The address `manage` is checked on for operations on the broker as a whole.
MANAGEMENT_ADDRESS = "$management"

#: A management operation: (object name, request body, request properties) ->
#: (statusCode, statusDescription, response body). Plugins add them through the
#: `scow_management_operations` hook; they raise `BrokerError`s for refusals.
ManagementOperation = Callable[
    [str, Any, Mapping[str, Any]], tuple[int, str, Any] | Awaitable[tuple[int, str, Any]]
]
#: Messages a move or a retry sends before it lets the loop serve others.
MOVE_BATCH = 500
#: The most messages one browse answers with (Artemis's management-browse-page-size
#: is 200): a browse is built on the event loop, and its answer in memory.
MAX_BROWSE = 1000

#: Attributes `create_queue` accepts, with what they mean.
QUEUE_ATTRIBUTES = {
    "address": "the address it is bound to (default: the queue's name)",
    "routing-type": "ANYCAST or MULTICAST (default: the address's default-queue-routing-type)",
    "durable": "kept across restarts (default true)",
    "filter": "a selector: only messages it matches enter the queue",
    "arguments": "queue arguments, which choose its type (e.g. qpid.priorities)",
    "max-consumers": "consumers at once; -1 unlimited",
    "exclusive": "one consumer receives at a time",
    "non-destructive": "consumers see messages without taking them",
}


class _AllStored:
    """Completions for storage operations, each counted once however often it is
    called; `wait()` returns once every one has run."""

    def __init__(self) -> None:
        self.waiting = 0
        self._all: asyncio.Future[None] | None = None

    def completion(self) -> Completion:
        self.waiting += 1
        return after_all(1, self._stored)  # after_all: a second call does nothing

    def _stored(self) -> None:
        self.waiting -= 1
        if not self.waiting and self._all is not None and not self._all.done():
            self._all.set_result(None)

    async def wait(self) -> None:
        if self.waiting:
            self._all = asyncio.get_running_loop().create_future()
            await self._all


def _browsed(message: Message, delivery_count: int, preview: int) -> dict[str, Any]:
    """What a browse shows of a message."""
    message.restore()
    large = large_body(message.data) is not None
    described = message.format.describe(message.data, preview)
    if large:
        described["body-preview"] = ""
    return {
        "id": message.id,
        "size": message_size(message.data),
        "large": large,
        "durable": message.durable,
        "priority": message.priority,
        "expiration": message.expiration,
        "delivery-count": delivery_count,
        **described,
    }


def status_of(error: BrokerError) -> int:
    """The HTTP-style status code for a refused operation."""
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, ResourceLocked):
        return 409
    if isinstance(error, (InvalidField, ResourceLimitExceeded)):
        return 400
    if isinstance(error, Unauthorized):
        return 403
    return 500


class Management:
    """The operations, bound to one broker and the user asking; call them on its loop."""

    def __init__(self, broker: Broker, principal: Principal | None = None) -> None:
        self.broker = broker
        self.principal = principal
        self.security = broker.security

    def _authorize(self, permission: str, address: str) -> None:
        self.security.check(self.principal, permission, address)

    def _audit(self, action: str, **details: Any) -> None:
        self.security.management_action(self.principal, action, **details)

    def _queue(self, name: str) -> Any:
        """Queue `name`, once `manage` on its address is checked."""
        queue = self.broker.queues.get(name)
        if queue is None:
            self._authorize("manage", MANAGEMENT_ADDRESS)
            raise NotFound(f"queue '{name}' does not exist")
        self._authorize("manage", queue.address)
        return queue

    def create_queue(self, name: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """Create queue `name`; returns what `read_queue` would."""
        if not name:
            raise InvalidField("a queue needs a name")
        unknown = sorted(set(attributes) - set(QUEUE_ATTRIBUTES))
        if unknown:
            raise InvalidField(
                f"queue '{name}': unknown attribute {', '.join(unknown)} "
                f"(accepted: {', '.join(QUEUE_ATTRIBUTES)})"
            )
        arguments = attributes.get("arguments") or {}
        if not isinstance(arguments, Mapping):
            raise InvalidField(f"queue '{name}': arguments = {arguments!r}: expected a map")
        address = _optional(attributes, "address", str, name) or name
        durable = _optional(attributes, "durable", bool, name, default=True)
        self._authorize("manage", address)
        if address not in self.broker.addresses:
            self._authorize("createAddress", address)
        self._authorize("createDurableQueue" if durable else "createNonDurableQueue", address)
        self.broker.declare_queue(
            name,
            address=address,
            routing_type=_optional(attributes, "routing-type", str, name),
            durable=durable,
            filter=_optional(attributes, "filter", str, name),
            arguments=dict(arguments),
            max_consumers=_optional(attributes, "max-consumers", int, name, default=-1),
            exclusive=_optional(attributes, "exclusive", bool, name),
            non_destructive=_optional(attributes, "non-destructive", bool, name),
        )
        self._audit("create queue", queue=name, address=address, durable=durable)
        return self.read_queue(name)

    def read_queue(self, name: str) -> dict[str, Any]:
        return describe_queue(self._queue(name))

    def list_queues(self) -> list[dict[str, Any]]:
        return [d for name in self.queue_names() if (d := self.queue_if_any(name)) is not None]

    def queue_names(self) -> list[str]:
        """Every queue's name, in order (a listing made in slices: `queue_if_any`)."""
        self._authorize("manage", MANAGEMENT_ADDRESS)
        return sorted(self.broker.queues)

    def queue_if_any(self, name: str) -> dict[str, Any] | None:
        """`read_queue` for a listing `queue_names` began (and authorized: this checks
        nothing itself); None for a queue gone since."""
        queue = self.broker.queues.get(name)
        return None if queue is None else describe_queue(queue)

    def purge_queue(self, name: str) -> int:
        """Drop every waiting message of queue `name`, in memory and in pages (not those
        being delivered); those in pages go as the cursor reads them, just after."""
        queue = self._queue(name)
        refs = queue.take()
        for ref in refs:
            queue.remove_delivering(ref)
            self.broker.discard(ref)
        cursor = queue.cursor
        paged = cursor.backlog if cursor is not None else 0
        if paged:
            cursor.purge(self.broker.next_id())  # what is in pages goes as it is read
        self._audit("purge queue", queue=name, purged=len(refs) + paged)
        return len(refs) + paged

    def create_address(self, name: str, routing_types: list[str]) -> dict[str, Any]:
        """Create address `name` with the given routing types (ANYCAST, MULTICAST)."""
        if not name:
            raise InvalidField("an address needs a name")
        self._authorize("manage", name)
        self._authorize("createAddress", name)
        if name in self.broker.addresses:
            raise ResourceLocked(f"address '{name}' already exists")
        try:
            types = {RoutingType(str(r).upper()) for r in routing_types}
        except ValueError:
            raise InvalidField(
                f"address '{name}': routing types {routing_types!r}: expected ANYCAST and/or "
                "MULTICAST"
            ) from None
        if not types:
            raise InvalidField(f"address '{name}': give at least one routing type")
        self.broker.create_address(name, types)
        self._audit("create address", address=name, routing_types=sorted(t.value for t in types))
        return self.read_address(name)

    def delete_address(self, name: str, *, force: bool = False) -> None:
        """Delete address `name`; one with queues only with `force` (they go too)."""
        self._authorize("manage", name)
        self._authorize("deleteAddress", name)
        address = self.broker.addresses.get(name)
        if address is None:
            raise NotFound(f"address '{name}' does not exist")
        if address.queues and not force:
            raise ResourceLocked(
                f"address '{name}' has queues ({', '.join(sorted(address.queues))}); "
                "force the delete to remove them with it"
            )
        self.broker.delete_address(name, forget_ids=True)
        self._audit("delete address", address=name, force=force)

    def list_addresses(self) -> list[dict[str, Any]]:
        return [d for name in self.address_names() if (d := self.address_if_any(name)) is not None]

    def address_names(self) -> list[str]:
        """Every address's name, in order (a listing made in slices: `address_if_any`)."""
        self._authorize("manage", MANAGEMENT_ADDRESS)
        return sorted(self.broker.addresses)

    def address_if_any(self, name: str) -> dict[str, Any] | None:
        """`read_address` for a listing `address_names` began (and authorized: this checks
        nothing itself); None for an address gone since."""
        if name not in self.broker.addresses:
            return None
        return self._describe_address(name)

    def read_address(self, name: str) -> dict[str, Any]:
        self._authorize("manage", name)
        return self._describe_address(name)

    def _describe_address(self, name: str) -> dict[str, Any]:
        address = self.broker.addresses.get(name)
        if address is None:
            raise NotFound(f"address '{name}' does not exist")
        return {
            "name": name,
            **self.broker.address_stats(address),
            "auto-created": address.auto_created,
            "settings": address.settings.to_dict(),
        }

    def list_connections(self) -> list[dict[str, Any]]:
        self._authorize("manage", MANAGEMENT_ADDRESS)
        return [
            {
                "id": info.id,
                "protocol": info.protocol,
                "remote": info.remote,
                "container-id": info.container_id,
                "user": info.user,
                "links": info.links() if info.links is not None else [],
            }
            for _, info in sorted(self.broker.connections.items())
        ]

    async def move_messages(
        self, name: str, target: str, *, selector: str | None = None
    ) -> dict[str, int]:
        """Send the waiting messages of queue `name` (those `selector` matches) to the
        address `target`, as new messages; each leaves the queue once routed."""
        if not target:
            raise InvalidField(f"queue '{name}': moving needs a target address")
        moved = await self._resend(name, lambda _message: target, selector)
        self._audit("move messages", queue=name, to=target, filter=selector, **moved)
        return moved

    async def retry_messages(self, name: str) -> dict[str, int]:
        """Send dead-lettered or expired messages of queue `name` back to the address they
        came from (their x-opt-ORIG-ADDRESS annotation); others stay."""

        def origin(message: Message) -> str | None:
            annotations = message.format.describe(message.data, 0)["annotations"]
            return annotations.get("x-opt-ORIG-ADDRESS")

        retried = await self._resend(name, origin, None)
        self._audit("retry messages", queue=name, **retried)
        return retried

    async def _resend(
        self, name: str, target_of: Callable[[Message], str | None], selector: str | None
    ) -> dict[str, int]:
        """Resend what queue `name` held when asked: the messages in memory, then those in
        pages (read off the loop a window at a time, never into the queue), then those the
        cursor read meanwhile or held back at a restart. The loop serves others after
        every `MOVE_BATCH`. Messages that arrive meanwhile stay, or a move to the queue's
        own address would chase its own messages for ever."""
        queue = self._queue(name)
        matches = self.broker.compile_filter(selector) if selector else None
        up_to = self.broker.next_id()
        targets: dict[int, str] = {}

        def chosen(message: Message) -> bool:
            if message.id > up_to:
                return False
            message.restore()
            if matches is not None and not matches(message):
                return False
            target = target_of(message)
            if target:
                targets[message.id] = target
            return bool(target)

        def in_memory() -> list[MessageRef]:
            return queue.take(lambda entry: chosen(entry.message))

        moved = await self._send_all(queue, in_memory(), targets, taken_from_queue=True)
        cursor = queue.cursor
        if cursor is None:
            return {"moved": moved}
        batch: list[MessageRef] = []
        async with contextlib.aclosing(cursor.paged(up_to)) as paged:
            async for page, at, message in paged:
                if chosen(message) and (ref := cursor.take_paged(page, at, message)):
                    batch.append(ref)
                    if len(batch) == MOVE_BATCH:
                        moved += await self._send_all(queue, batch, targets)
                        batch = []
        moved += await self._send_all(queue, batch, targets)
        moved += await self._send_all(queue, in_memory(), targets, taken_from_queue=True)
        held = cursor.take_held(lambda ref: chosen(ref.message))
        return {"moved": moved + await self._send_all(queue, held, targets)}

    async def _send_all(
        self,
        queue: Queue,
        refs: list[MessageRef],
        targets: dict[int, str],
        *,
        taken_from_queue: bool = False,
    ) -> int:
        """Send each of `refs` to its target, and drop it from `queue` once what was sent
        is stored, `MOVE_BATCH` at a time (the loop serving others meanwhile); returns
        once the drops are durable too. A crash in between leaves a message in both
        places, never in neither. A target that refuses ends the move: the refs not sent
        go back to the queue."""
        for start in range(0, len(refs), MOVE_BATCH):
            batch = refs[start : start + MOVE_BATCH]
            stored = _AllStored()
            refused = None
            sent = 0
            for ref in batch:
                message = ref.message
                done = stored.completion()
                try:
                    status = self.broker.send(
                        message.data,
                        targets.pop(message.id),
                        message.format,
                        on_stored=done,
                        check_duplicates=False,
                    )
                except BrokerError as exc:
                    refused = exc
                    done()  # nothing was sent
                    break
                sent += 1
                if status is not RouteStatus.PENDING:
                    done()  # nothing waits for storage
            await stored.wait()
            if taken_from_queue:
                for ref in batch[:sent]:
                    queue.remove_delivering(ref)
            dropped = _AllStored()
            self.broker.discard_together(batch[:sent], dropped.completion())
            await dropped.wait()
            if refused is not None:
                for rest in refs[start + sent :]:
                    if taken_from_queue:
                        queue.release(rest, delivered=False)
                    else:
                        queue.enqueue(rest)
                raise refused
        return len(refs)

    async def browse_queue(
        self, name: str, limit: int = 10, preview: int = 256
    ) -> list[dict[str, Any]]:
        """The first `limit` messages waiting, in memory then in pages, without taking
        them. A large message shows its size and headers; its body stays in its file."""
        if not 0 <= limit <= MAX_BROWSE:
            raise InvalidField(
                f"limit={limit}: a browse answers at most {MAX_BROWSE} messages (and not "
                "fewer than 0)"
            )
        queue = self._queue(name)
        out = [
            _browsed(entry.message, getattr(entry, "delivery_count", 0), preview)
            for entry in itertools.islice(queue.waiting(), limit)
        ]
        cursor = queue.cursor
        if cursor is None or len(out) >= limit:
            return out
        async with contextlib.aclosing(cursor.paged(self.broker.next_id())) as paged:
            async for _page, _at, message in paged:
                out.append(_browsed(message, 0, preview))
                if len(out) >= limit:
                    break
        return out

    def close_connection(self, connection_id: int) -> None:
        self._authorize("manage", MANAGEMENT_ADDRESS)
        info = self.broker.connections.get(connection_id)
        if info is None or info.close is None:
            raise NotFound(f"connection {connection_id} is not open")
        info.close("closed by the broker's management")
        self._audit("close connection", connection=connection_id, remote=info.remote)

    def set_address_settings(
        self, pattern: str, changes: Mapping[str, Any], *, persist: bool = False
    ) -> dict[str, Any]:
        """Apply `changes` to `pattern` now (kept across restarts with `persist`); the
        pattern's settings."""
        if not pattern:
            raise InvalidField("an address-settings pattern is needed, e.g. 'orders.#'")
        self._authorize("manage", MANAGEMENT_ADDRESS)
        self.broker.set_address_settings(pattern, changes, persist=persist)
        self._audit("set address settings", pattern=pattern, changes=dict(changes))
        return {"pattern": pattern, **(self.broker.config.address_settings.explicit(pattern) or {})}

    def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete queue `name` and its messages; one with consumers only with `force`."""
        queue = self._queue(name)
        permission = "deleteDurableQueue" if queue.spec.durable else "deleteNonDurableQueue"
        self._authorize(permission, queue.address)
        consumers = queue.consumer_count()
        if consumers and not force:
            raise ResourceLocked(
                f"queue '{name}' has {consumers} consumer(s); force the delete to detach them"
            )
        self.broker.delete_queue(name)
        self._audit("delete queue", queue=name, force=force)


def describe_queue(queue: Any) -> dict[str, Any]:
    """A queue's definition and figures, as management reports it."""
    spec = queue.spec
    return {
        **queue.stats(),
        "queue-type": spec.queue_type,
        "arguments": dict(spec.arguments),
        "filter": spec.filter,
        "max-consumers": spec.max_consumers,
        "exclusive": bool(spec.exclusive),
        "non-destructive": bool(spec.non_destructive),
        "temporary": spec.temporary,
        "auto-created": spec.auto_created,
    }


def _optional(
    attributes: Mapping[str, Any], key: str, kind: type, queue: str, default: Any = None
) -> Any:
    value = attributes.get(key, default)
    if value is None or (isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
        return value
    raise InvalidField(f"queue '{queue}': {key} = {value!r}: expected {kind.__name__}")
