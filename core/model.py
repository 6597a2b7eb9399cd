"""The broker's vocabulary: routing types, addresses, queue specifications, connections."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scow.core.address_settings import AddressSettings
    from scow.core.interfaces import FullPolicy, Queue


class RoutingType(enum.Enum):
    ANYCAST = "ANYCAST"  # each message goes to one of the address's anycast queues
    MULTICAST = "MULTICAST"  # each message goes to every multicast queue


class RouteStatus(enum.Enum):
    ROUTED = "routed"
    PENDING = "pending"  # routed; the completion runs once the journal has it on disk
    NO_ROUTE = "no-route"  # address exists but no queue took it: accepted and discarded
    DROPPED = "dropped"  # the address is full and its policy drops
    REFUSED = "refused"  # the address is full and its policy fails the send


class BrokerError(Exception):
    """An operation a client asked for cannot be done; `condition` is the AMQP error name."""

    condition = "amqp:internal-error"

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class NotFound(BrokerError):
    condition = "amqp:not-found"


class InvalidField(BrokerError):
    condition = "amqp:invalid-field"


class ResourceLocked(BrokerError):
    condition = "amqp:resource-locked"


class NotAllowed(BrokerError):
    condition = "amqp:not-allowed"


class ResourceLimitExceeded(BrokerError):
    condition = "amqp:resource-limit-exceeded"


@dataclass(eq=False)
class AddressInfo:
    """An address: its routing types, bound queues and size accounting."""

    name: str
    routing_types: set[RoutingType]
    settings: AddressSettings
    auto_created: bool = False
    durable: bool = True
    temporary: bool = False
    queues: dict[str, Queue] = field(default_factory=dict)
    #: Bound queues by routing type, rebuilt on bind/unbind (routing reads them per message).
    anycast: list[Queue] = field(default_factory=list)
    multicast: list[Queue] = field(default_factory=list)
    #: Bytes of messages routed here and not yet freed (counted once per message).
    size: int = 0
    message_count: int = 0
    full_policy: FullPolicy | None = None
    #: Its record in the bindings journal, when durable.
    record_id: int | None = None
    #: Called with no arguments when the address stops being full (BLOCK resumes credit).
    on_space: list[Callable[[], None]] = field(default_factory=list)
    _anycast_index: int = 0

    def bind(self, queue: Queue) -> None:
        self.queues[queue.name] = queue
        self._rebuild()

    def unbind(self, name: str) -> None:
        if self.queues.pop(name, None) is not None:
            self._rebuild()

    def _rebuild(self) -> None:
        queues = self.queues.values()
        self.anycast = [q for q in queues if q.routing_type is RoutingType.ANYCAST]
        self.multicast = [q for q in queues if q.routing_type is RoutingType.MULTICAST]

    def is_full(self) -> bool:
        limit = self.settings.max_size_bytes
        if limit >= 0 and self.size >= limit:
            return True
        limit = self.settings.max_size_messages
        return limit >= 0 and self.message_count >= limit


@dataclass(frozen=True)
class QueueSpec:
    """Everything needed to build a queue; also what the bindings journal stores."""

    name: str
    address: str
    routing_type: RoutingType
    filter: str | None = None
    durable: bool = True
    temporary: bool = False
    auto_created: bool = False
    queue_type: str = "standard"
    max_consumers: int = -1
    exclusive: bool = False
    #: Delete the queue when its last consumer leaves (temporary and shared subscriptions).
    delete_on_no_consumers: bool = False
    arguments: tuple[tuple[str, Any], ...] = ()


@dataclass(eq=False)
class ConnectionInfo:
    """What hooks learn about a client connection."""

    id: int
    protocol: str
    remote: str
    container_id: str = ""
    user: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)
