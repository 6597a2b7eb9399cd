"""The `$management` node: management requests over AMQP, answered by `core.management`.

Requests and responses have the shape of the OASIS AMQP Management draft: a request
carries application properties `operation`, `type` and `name` (queue: CREATE, READ,
DELETE, QUERY, PURGE, MOVE (property `to`, optional `filter`), RETRY; address: CREATE
(body {"routing-types": [...]}), DELETE (property `force`), READ, QUERY; connection:
QUERY, DELETE, which closes it),
a map body for CREATE (the queue's attributes) and a `reply-to`;
the response goes to that address with `correlation-id` = the request's message-id and
application properties `statusCode` (200, 201, 204, or 400/403/404/409/501 with
`statusDescription` saying why). QUERY answers `{"attributeNames": [...], "results":
[[...], ...]}`. This is what `scow queue` speaks; the HTTP API serves the same operations.
Attaching needs the `manage` permission on `$management`; each operation checks its own.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import structlog
from proton import Message as ProtonMessage

from scow.core.management import (
    MANAGEMENT_ADDRESS,
    Management,
    ManagementOperation,
    status_of,
)
from scow.core.model import BrokerError, InvalidField
from scow.protocols.amqp import engine
from scow.protocols.amqp.format import AMQP_FORMAT

if TYPE_CHECKING:
    from scow.protocols.amqp.connection import AmqpConnection

log = structlog.get_logger("scow.amqp")

MANAGEMENT_NODE = MANAGEMENT_ADDRESS
_CREDIT = 100


class ManagementLink:
    """A client's link to `$management`: each message is a request."""

    def __init__(self, conn: AmqpConnection, link: Any) -> None:
        self.conn = conn
        self.link = link
        self.closed = False
        #: Operations still at work, each to reply when done (kept from the collector).
        self._pending: set[asyncio.Task[None]] = set()
        if conn.authorize is not None:
            conn.authorize("manage", MANAGEMENT_NODE)
        self.management = Management(conn.broker, conn.principal)
        self.operations = _operations(self.management)
        _add_plugin_operations(self.operations, conn.broker)
        engine.open_link(link, address=MANAGEMENT_NODE)
        engine.link_flow(link, _CREDIT)

    def on_delivery(self, delivery: Any) -> None:
        if engine.delivery_partial(delivery) or not engine.delivery_readable(delivery):
            return  # partial, or its event came again after it was read (see ProducerLink)
        request = ProtonMessage()
        try:
            request.decode(self.conn.engine.receive(self.link, delivery))
        except Exception as exc:  # proton raises its own types for undecodable bytes
            engine.reject(delivery, "amqp:decode-error", f"management request: {exc}")
        else:
            answer = self.handle(request)
            if isinstance(answer, tuple):
                self._reply(request, *answer)
            else:  # it hands the loop back while it works: the reply follows when done
                task = asyncio.ensure_future(self._reply_later(request, answer))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
            engine.delivery_update(delivery, engine.ACCEPTED)
            engine.delivery_settle(delivery)
        if engine.link_credit(self.link) < _CREDIT // 2:
            engine.link_flow(self.link, _CREDIT - engine.link_credit(self.link))

    def handle(
        self, request: ProtonMessage
    ) -> tuple[int, str, Any] | Awaitable[tuple[int, str, Any]]:
        """(statusCode, statusDescription, body) for one request, or an awaitable of it."""
        properties: dict[str, Any] = request.properties or {}
        operation, kind, name = _asked(properties)
        operations = self.operations.get(kind)
        if operations is None:
            accepted = ", ".join(self.operations)
            return 400, f"unknown type {kind!r} (accepted: {accepted})", None
        run = operations.get(operation)
        if run is None:
            accepted = ", ".join(operations)
            return 501, f"unknown operation {operation!r} for {kind} (accepted: {accepted})", None
        try:
            return run(name, request.body, properties)
        except Exception as exc:
            return _failed(exc, properties)

    async def _reply_later(
        self, request: ProtonMessage, answer: Awaitable[tuple[int, str, Any]]
    ) -> None:
        try:
            status, description, body = await answer
        except Exception as exc:
            status, description, body = _failed(exc, request.properties or {})
        self._reply(request, status, description, body)

    def _reply(self, request: ProtonMessage, status: int, description: str, body: Any) -> None:
        if not request.reply_to:
            return
        reply = ProtonMessage(
            address=request.reply_to,
            correlation_id=request.id if request.id is not None else request.correlation_id,
            properties={"statusCode": status, "statusDescription": description},
            body=_wire(body),
        )
        try:
            self.conn.broker.send(bytes(reply.encode()), request.reply_to, AMQP_FORMAT)
        except BrokerError as exc:  # e.g. the reply address is gone: nobody to tell
            log.info("management reply not delivered", reason=exc.description)

    def describe(self) -> dict[str, Any]:
        return {"name": engine.link_name(self.link), "role": "management"}

    def close(self, remote_closed: bool) -> None:
        self.closed = True


Operation = ManagementOperation


def _asked(properties: dict[str, Any]) -> tuple[str, str, str]:
    """(operation, type, name) of a request."""
    return (
        str(properties.get("operation", "")).upper(),
        str(properties.get("type", "queue")),
        str(properties.get("name", "")),
    )


def _failed(exc: Exception, properties: dict[str, Any]) -> tuple[int, str, Any]:
    """The answer to a request whose operation raised `exc`."""
    if isinstance(exc, BrokerError):
        return status_of(exc), exc.description, None
    # a bug must cost this request only, not the client's connection
    operation, kind, _name = _asked(properties)
    log.error("management request failed", operation=operation, type=kind, exc_info=exc)
    return 500, f"{operation} {kind} failed inside the broker (see its log)", None


async def _ok(pending: Awaitable[Any]) -> tuple[int, str, Any]:
    return 200, "OK", await pending


def _operations(m: Management) -> dict[str, dict[str, Operation]]:
    """Per type, per operation: (name, request body, request properties) -> the answer."""
    return {
        "queue": {
            "CREATE": lambda name, body, _: (
                201,
                "Created",
                m.create_queue(name, _attributes(body)),
            ),
            "READ": lambda name, _, __: (200, "OK", m.read_queue(name)),
            "DELETE": lambda name, _, props: _done(
                m.delete_queue(name, force=bool(props.get("force", False)))
            ),
            "QUERY": lambda *_: (200, "OK", _query(m.list_queues())),
            "PURGE": lambda name, _, __: (200, "OK", {"purged": m.purge_queue(name)}),
            "MOVE": lambda name, _, props: _ok(
                m.move_messages(name, str(props.get("to", "")), selector=props.get("filter"))
            ),
            "RETRY": lambda name, _, __: _ok(m.retry_messages(name)),
        },
        "address": {
            "CREATE": lambda name, body, _: (
                201,
                "Created",
                m.create_address(name, _routing_types(body)),
            ),
            "DELETE": lambda name, _, props: _done(
                m.delete_address(name, force=bool(props.get("force", False)))
            ),
            "READ": lambda name, _, __: (200, "OK", m.read_address(name)),
            "QUERY": lambda *_: (200, "OK", _query(m.list_addresses())),
        },
        "connection": {
            "QUERY": lambda *_: (200, "OK", _query(m.list_connections())),
            "DELETE": lambda name, _, __: _done(m.close_connection(_number(name))),
        },
    }


def _add_plugin_operations(table: dict[str, dict[str, Operation]], broker: Any) -> None:
    """Merge what plugins add (`scow_management_operations`); built-in ones stay."""
    if broker.hooks is None:
        return
    for added in broker.hooks.scow_management_operations(broker=broker):
        for kind, operations in added.items():
            ops = table.setdefault(kind, {})
            for name, run in operations.items():
                ops.setdefault(name.upper(), run)


def _attributes(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise InvalidField(f"CREATE needs a map of attributes, not {body!r}")
    return _plain(body)


def _routing_types(body: Any) -> list[str]:
    """CREATE address's body: {"routing-types": ["ANYCAST", ...]} (default ANYCAST)."""
    attributes = _attributes(body)
    types = attributes.get("routing-types", ["ANYCAST"])
    if not isinstance(types, list):
        raise InvalidField(f"routing-types = {types!r}: expected a list, e.g. ['ANYCAST']")
    return [str(t) for t in types]


def _number(name: str) -> int:
    try:
        return int(name)
    except ValueError:
        raise InvalidField(f"connection {name!r}: expected its number") from None


def _done(_: None) -> tuple[int, str, Any]:
    return 204, "No Content", None


def _query(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The AMQP Management QUERY answer: attribute names once, then a row per object
    (objects of several kinds may have attributes the others lack: null there)."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {
        "attributeNames": names,
        "results": [[_wire(row.get(n)) for n in names] for row in rows],
    }


def _wire(value: Any) -> Any:
    """Values proton can encode: enums by their value, containers element by element."""
    if isinstance(value, dict):
        return {str(k): _wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_wire(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _plain(value: Any) -> Any:
    """Proton's typed values (symbol, ulong, ...) as plain str, int, dict, list."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    return value
