"""The `$management` node: management requests over AMQP, answered by `core.management`.

Requests and responses have the shape of the OASIS AMQP Management draft: a request
carries application properties `operation` (CREATE, READ, DELETE, QUERY), `type`
("queue") and `name`, a map body for CREATE (the queue's attributes) and a `reply-to`;
the response goes to that address with `correlation-id` = the request's message-id and
application properties `statusCode` (200, 201, 204, or 400/404/409/501 with
`statusDescription` saying why). QUERY answers `{"attributeNames": [...], "results":
[[...], ...]}`. This is what `scow queue` speaks; the HTTP API serves the same operations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from proton import Message as ProtonMessage

from scow.core.management import Management, status_of
from scow.core.model import BrokerError, InvalidField
from scow.protocols.amqp import engine
from scow.protocols.amqp.format import AMQP_FORMAT

if TYPE_CHECKING:
    from scow.protocols.amqp.connection import AmqpConnection

log = structlog.get_logger("scow.amqp")

MANAGEMENT_NODE = "$management"
_CREDIT = 100


class ManagementLink:
    """A client's link to `$management`: each message is a request."""

    def __init__(self, conn: AmqpConnection, link: Any) -> None:
        self.conn = conn
        self.link = link
        self.closed = False
        self.management = Management(conn.broker)
        engine.open_link(link, address=MANAGEMENT_NODE)
        engine.link_flow(link, _CREDIT)

    def on_delivery(self, delivery: Any) -> None:
        if engine.delivery_partial(delivery):
            return
        request = ProtonMessage()
        try:
            request.decode(engine.receive(self.link, delivery))
        except Exception as exc:  # proton raises its own types for undecodable bytes
            engine.reject(delivery, "amqp:decode-error", f"management request: {exc}")
        else:
            status, description, body = self.handle(request)
            if request.reply_to:
                self._reply(request, status, description, body)
            engine.delivery_update(delivery, engine.ACCEPTED)
            engine.delivery_settle(delivery)
        if engine.link_credit(self.link) < _CREDIT // 2:
            engine.link_flow(self.link, _CREDIT - engine.link_credit(self.link))

    def handle(self, request: ProtonMessage) -> tuple[int, str, Any]:
        """(statusCode, statusDescription, body) for one request."""
        properties: dict[str, Any] = request.properties or {}
        operation = str(properties.get("operation", "")).upper()
        kind = str(properties.get("type", "queue"))
        name = str(properties.get("name", ""))
        try:
            if kind != "queue":
                raise InvalidField(f"unknown type {kind!r} (accepted: queue)")
            if operation == "CREATE":
                body = request.body if request.body is not None else {}
                if not isinstance(body, dict):
                    raise InvalidField(f"CREATE needs a map of attributes, not {body!r}")
                return 201, "Created", self.management.create_queue(name, _plain(body))
            if operation == "READ":
                return 200, "OK", self.management.read_queue(name)
            if operation == "DELETE":
                self.management.delete_queue(name, force=bool(properties.get("force", False)))
                return 204, "No Content", None
            if operation == "QUERY":
                rows = self.management.list_queues()
                names = list(rows[0]) if rows else []
                return (
                    200,
                    "OK",
                    {
                        "attributeNames": names,
                        "results": [[row[n] for n in names] for row in rows],
                    },
                )
            return (
                501,
                f"unknown operation {operation!r} (accepted: CREATE, READ, DELETE, QUERY)",
                None,
            )
        except BrokerError as exc:
            return status_of(exc), exc.description, None

    def _reply(self, request: ProtonMessage, status: int, description: str, body: Any) -> None:
        reply = ProtonMessage(
            address=request.reply_to,
            correlation_id=request.id if request.id is not None else request.correlation_id,
            properties={"statusCode": status, "statusDescription": description},
            body=body,
        )
        try:
            self.conn.broker.send(bytes(reply.encode()), request.reply_to, AMQP_FORMAT)
        except BrokerError as exc:  # e.g. the reply address is gone: nobody to tell
            log.info("management reply not delivered", reason=exc.description)

    def close(self, remote_closed: bool) -> None:
        self.closed = True


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
