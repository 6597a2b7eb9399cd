"""The broker's vocabulary: routing types, addresses, queue specifications, connections."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scow.core.interfaces import keeps_durable_copy
from scow.core.message import MEMORY_OVERHEAD

if TYPE_CHECKING:
    from scow.core.address_settings import AddressSettings
    from scow.core.duplicates import DuplicateIdCache
    from scow.core.interfaces import FullPolicy, Pager, Queue


class RoutingType(enum.Enum):
    ANYCAST = "ANYCAST"  # each message goes to one of the address's anycast queues
    MULTICAST = "MULTICAST"  # each message goes to every multicast queue

    # Routing tests a set of these for every message: the members are singletons compared
    # by identity, so the identity hash will do, in C (Enum's hashes the name in Python).
    __hash__ = object.__hash__


class RouteStatus(enum.Enum):
    ROUTED = "routed"
    PENDING = "pending"  # routed; the completion runs once the journal has it on disk
    NO_ROUTE = "no-route"  # address exists but no queue took it: accepted and discarded
    DROPPED = "dropped"  # the address is full and its policy drops
    REFUSED = "refused"  # the address is full and its policy fails the send
    DUPLICATE = "duplicate"  # its duplicate id was seen: accepted and discarded


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


class StorageFull(ResourceLimitExceeded):
    """Storage has no room for a record: it was not stored, and storage goes on working.

    Raised by a journal (or page store) whose file system is full, before it changes any
    of its own state; the description names the directory and what ran out.
    """


class Unauthorized(BrokerError):
    """The client's user lacks a permission (or did not authenticate); the description
    names the permission, the user and the address."""

    condition = "amqp:unauthorized-access"


def derived_global_max_size() -> int:
    """`global-max-size` when left at -1: 1/16 of the memory this process may use
    (`memory_limit`), at most 128 MiB.

    Estimated memory counts each message's bytes plus MEMORY_OVERHEAD, so this bounds
    the process at roughly that much above its idle size, whatever the message size.
    """
    return min(memory_limit() // 16, 128 << 20)


def memory_limit() -> int:
    """The memory this process may use: physical memory, or less where its cgroup (a
    container's memory limit, systemd's `MemoryMax=`) says so, as a JVM sizes its heap."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        physical = 2 << 30
    return min(physical, cgroup_memory_limit() or physical)


def cgroup_memory_limit(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The lowest memory limit on this process's cgroup and its ancestors (cgroup v2's
    `memory.max`, v1's `memory.limit_in_bytes`); None where there is none or no cgroups."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if not controllers:  # v2: one hierarchy
            base, name = Path(root), "memory.max"
        elif "memory" in controllers.split(","):
            base, name = Path(root) / "memory", "memory.limit_in_bytes"
        else:
            continue
        own = Path(path.lstrip("/"))
        for group in (own, *own.parents):
            try:
                text = (base / group / name).read_text().strip()
            except OSError:  # not mounted here, or a level without the file
                continue
            if text.isdigit():  # "max": no limit at this level
                limits.append(int(text))
    return min(limits, default=None)


class MemoryLimits:
    """Broker-wide memory used by messages, against `global-max-size` / `global-max-messages`.

    Every address adds its in-memory messages here as well as to its own size, so each
    address's full check also sees the broker as a whole. `disk_full` is set while storage
    cannot take more (the disk monitor's "disk", a database store's "database", ...: see
    `block`); while it is set, producers get no credit anywhere.
    """

    __slots__ = (
        "_blocked_by",
        "disk_full",
        "flow_above",
        "max_messages",
        "max_size",
        "messages",
        "on_disk_space",
        "size",
    )

    def __init__(self, max_size: int = -1, max_messages: int = -1) -> None:
        self.max_size = max_size
        self.max_messages = max_messages
        self.size = 0
        self.messages = 0
        #: Past this `size`, each new message is offered to the broker's `flow_to_disk`
        #: (set by the flow-to-disk plugin; never, without it).
        self.flow_above = 1 << 62
        #: True while any reason blocks storage (read per producer: a plain attribute).
        self.disk_full = False
        self._blocked_by: set[str] = set()
        #: Called with no arguments when storage takes messages again.
        self.on_disk_space: list[Callable[[], None]] = []

    def block(self, reason: str) -> None:
        """Storage cannot take more because of `reason`: producers get no more credit."""
        self._blocked_by.add(reason)
        self.disk_full = True

    def unblock(self, reason: str) -> None:
        """`reason` is gone; once no reason is left, waiting producers resume."""
        self._blocked_by.discard(reason)
        if self._blocked_by or not self.disk_full:
            return
        self.disk_full = False
        waiting, self.on_disk_space[:] = list(self.on_disk_space), []
        for resume in waiting:
            resume()

    def blocked_by(self, reason: str) -> bool:
        return reason in self._blocked_by

    @property
    def reasons(self) -> list[str]:
        """What blocks storage now (empty when nothing does)."""
        return sorted(self._blocked_by)

    def is_full(self) -> bool:
        return (0 <= self.max_size <= self.size) or (0 <= self.max_messages <= self.messages)

    def stats(self) -> dict[str, Any]:
        return {
            "memory-used": self.size,
            "global-max-size": self.max_size,
            "messages-in-memory": self.messages,
            "global-max-messages": self.max_messages,
            "disk-full": self.disk_full,
            "storage-blocked-by": self.reasons,
        }


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
    #: Bound queues whose own storage is the durable record of their messages (streams:
    #: `keeps_durable_copy`), rebuilt on bind/unbind; empty for most addresses.
    keepers: list[Queue] = field(default_factory=list)
    #: Estimated memory of the messages held for this address (once per message: its
    #: bytes plus MEMORY_OVERHEAD), and how many.
    size: int = 0
    message_count: int = 0
    full_policy: FullPolicy | None = None
    #: The address's pages, when its full policy pages (set by the paging plugin).
    pager: Pager | None = None
    #: The broker's memory figures, shared by every address.
    limits: MemoryLimits = field(default_factory=MemoryLimits)
    #: Its record in the bindings journal, when durable.
    record_id: int | None = None
    #: Called with no arguments when the address stops being full (BLOCK resumes credit).
    on_space: list[Callable[[], None]] = field(default_factory=list)
    #: Its duplicate-id cache once a message with an id looked it up (the broker's
    #: `duplicate_ids` holds it, by name: it outlives the address).
    id_cache: DuplicateIdCache | None = None
    _anycast_index: int = 0

    def bind(self, queue: Queue) -> None:
        self.queues[queue.name] = queue
        self._rebuild()
        if self.pager is not None:
            self.pager.bind(queue)

    def unbind(self, name: str) -> None:
        queue = self.queues.pop(name, None)
        if queue is not None:
            self._rebuild()
            if self.pager is not None:
                self.pager.unbind(queue)

    def _rebuild(self) -> None:
        queues = self.queues.values()
        self.anycast = [q for q in queues if q.routing_type is RoutingType.ANYCAST]
        self.multicast = [q for q in queues if q.routing_type is RoutingType.MULTICAST]
        self.keepers = [q for q in queues if keeps_durable_copy(q)]

    def add_memory(self, size: int, count: int = 1) -> None:
        """`count` messages of `size` bytes in all are now held in memory for this address."""
        size += MEMORY_OVERHEAD * count
        self.size += size
        self.message_count += count
        limits = self.limits
        limits.size += size
        limits.messages += count

    def is_full(self) -> bool:
        """At or over its own max-size-bytes / max-size-messages, or the broker's."""
        settings = self.settings
        limits = self.limits
        return (
            0 <= settings.max_size_bytes <= self.size
            or 0 <= settings.max_size_messages <= self.message_count
            or 0 <= limits.max_size <= limits.size
            or 0 <= limits.max_messages <= limits.messages
        )


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
    #: Every message goes to one consumer (the first attached) while it stays.
    #: None takes the address's default-exclusive-queue when the queue is created.
    exclusive: bool | None = None
    #: Consumers see messages without taking them (they leave by expiry or last-value).
    #: None takes the address's default-non-destructive when the queue is created.
    non_destructive: bool | None = None
    #: Delete the queue when its last consumer leaves (temporary and shared subscriptions).
    delete_on_no_consumers: bool = False
    arguments: tuple[tuple[str, Any], ...] = ()


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 host in brackets ("[::1]:5672"), as URLs and
    `parse_host_port` take it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def remote_of(transport: Any) -> str:
    """`host:port` of the peer of an asyncio transport ("?" when it has none): a
    connection's `ConnectionInfo.remote`, and what log lines about its socket name."""
    peer = transport.get_extra_info("peername")
    return host_port(peer[0], peer[1]) if peer else "?"


@dataclass(eq=False)
class ConnectionInfo:
    """What hooks learn about a client connection."""

    id: int
    protocol: str
    remote: str
    container_id: str = ""
    user: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    #: Closes the connection, telling the client the given reason (set by the protocol).
    close: Callable[[str], None] | None = field(default=None, repr=False)
    #: Describes its links now: name, role, address or queue, credit, unsettled.
    links: Callable[[], list[dict[str, Any]]] | None = field(default=None, repr=False)
