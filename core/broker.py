"""The broker: addresses, queues, routing, outcomes, dead letters and expiry.

Protocols talk to the broker through a handful of methods (`send`, `subscribe`,
`unsubscribe`, `acknowledge`, `release`, `reject`); everything a message does between
producer and consumer happens here and in the queue objects.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from scow.core.duplicates import (
    DEFAULT_ID_CACHE_SIZE,
    DuplicateIdCache,
    current_key,
    describe_id,
    duplicate_error,
    id_key,
)
from scow.core.interfaces import after_all, take_expired
from scow.core.large_message_files import configured_store
from scow.core.large_messages import LargeHead, LargeMessageStore, large_body, with_head
from scow.core.logging import debug_enabled
from scow.core.message import (
    MEMORY_OVERHEAD,
    REF_OVERHEAD,
    Header,
    Message,
    MessageFormat,
    MessageRef,
    PackedRows,
    PagedRef,
    SharedMessage,
)
from scow.core.model import (
    AddressInfo,
    BrokerError,
    ConnectionInfo,
    InvalidField,
    MemoryLimits,
    NotFound,
    QueueSpec,
    ResourceLimitExceeded,
    ResourceLocked,
    RouteStatus,
    RoutingType,
    StorageFull,
    derived_global_max_size,
)
from scow.core.queue_types import typed, with_defaults
from scow.core.security import Security
from scow.core.selector import Selector, SelectorFilter

if TYPE_CHECKING:
    from scow.core.address_settings import AddressSettings
    from scow.core.config import Config
    from scow.core.descriptors import (
        FullPolicyType,
        PageStoreBackend,
        QueueType,
        StreamStoreBackend,
    )
    from scow.core.interfaces import Completion, Consumer
    from scow.core.storage import (
        PageRecovery,
        Recovered,
        RecoveredDuplicateId,
        RecoveredMessage,
        StorageManager,
    )

log = structlog.get_logger("scow.broker")

#: Address settings changed at run time and asked to be kept, in the data dir.
PERSISTED_SETTINGS = "address-settings.json"

FQQN_SEPARATOR = "::"
#: Seconds between attempts at a dead-letter or expiry move storage had no room for.
MOVE_RETRY = 1.0
#: Messages (or acknowledgements) a large transaction's commit routes and journals per
#: pass of the event loop, and messages it makes visible per pass once it is durable. A
#: message costs the commit ~20 us: a Spark batch of 250,000 rows done in one pass held
#: every other connection for 5 s; a slice is a few tens of milliseconds.
COMMIT_SLICE = 2000

# Enum members the per-message path reads, as globals: on Python 3.11 reading one off its
# class (`RouteStatus.ROUTED`) goes through EnumType.__getattr__'s slot, ~65 ns a read.
_ANYCAST, _MULTICAST = RoutingType.ANYCAST, RoutingType.MULTICAST
_ROUTED, _PENDING = RouteStatus.ROUTED, RouteStatus.PENDING

#: `authorize(permission, address)`: raises Unauthorized when the client may not.
Authorize = Callable[[str, str], None]


class PackedSend(Protocol):
    """A send of a transaction that holds several messages (rows), for queues that take
    it whole (`takes_packs`: a stream appends its rows as one write; see
    `Transaction.packed`)."""

    #: How many messages it holds: what it weighs in a commit's slices.
    rows: int
    #: Its own header fields, as `MessageFormat.inspect` gives them (its duplicate id
    #: None: its rows carry theirs, `duplicate_keys`), read once from its header alone.
    header: Header

    def duplicate_keys(self) -> list[bytes]:
        """The duplicate-id cache keys (`id_key`) of the `_AMQ_DUPL_ID`s its rows carry."""

    def unpacked(self) -> list[bytes]:
        """Its rows, each a message of its own: how it goes to an address any of whose
        queues does not take packs."""


class Transaction:
    """A local transaction: sends and acknowledgements applied at commit."""

    __slots__ = ("acks", "held", "id", "packed", "sends")

    def __init__(self, tx_id: int) -> None:
        self.id = tx_id
        self.sends: list[tuple[bytes, str, MessageFormat, RoutingType | None]] = []
        self.acks: list[MessageRef] = []
        #: Refs of messages a recovered prepared transaction adds, enqueued at its commit.
        self.held: list[MessageRef] = []
        #: Sends (by their place in `sends`) that hold several rows: routed whole (one
        #: journal record) where every queue of the address takes packs, else as their
        #: rows; the rows' duplicate ids are checked and admitted as any send's.
        self.packed: dict[int, PackedSend] = {}

    def weight(self) -> int:
        """What its commit handles: acknowledgements, and messages (a pack's rows)."""
        rows = sum(pack.rows - 1 for pack in self.packed.values())
        return len(self.sends) + len(self.acks) + rows


def now_ms() -> int:
    return int(time.time() * 1000)


class Broker:
    """One broker's topology and message flow. Runs on a single event loop thread."""

    def __init__(
        self,
        config: Config,
        storage: StorageManager,
        *,
        queue_types: Mapping[str, QueueType],
        full_policies: Mapping[str, FullPolicyType],
        persistent: bool,
        selector_compiler: Callable[[str], Selector],
        page_stores: Mapping[str, PageStoreBackend] | None = None,
        stream_stores: Mapping[str, StreamStoreBackend] | None = None,
        large_messages: LargeMessageStore | None = None,
    ) -> None:
        self.config = config
        self.storage = storage
        self.queue_types = dict(queue_types)
        self.full_policies = dict(full_policies)
        self.page_stores = dict(page_stores or {})
        #: Where stream queues may keep their records, by backend name.
        self.stream_stores = dict(stream_stores or {})
        #: The paging plugin's manager, once an address pages (see `scow.plugins.paging`).
        self.page_manager: Any = None
        #: How stored messages are read back (the protocol plugin's), set at recovery.
        self.message_format: MessageFormat | None = None
        #: False when persistence is disabled: nothing is stored, not even topology.
        self.persistent = persistent
        self.compile_selector = selector_compiler
        #: The plugin hooks (pluggy's relay), for per-connection hook calls by protocols.
        self.hooks: Any = None
        #: This broker's HA membership (`scow.core.ha.HaMember`), or None without HA.
        self.ha: Any = None
        self.addresses: dict[str, AddressInfo] = {}
        self.queues: dict[str, Any] = {}
        #: Transactions found prepared at recovery, undecided: their messages and acks are
        #: held (invisible, not redelivered) until commit_prepared or rollback_prepared.
        self.prepared: dict[int, Transaction] = {}
        broker_cfg = config.section("broker")
        max_size = int(broker_cfg.get("global-max-size", -1))
        self.limits = MemoryLimits(
            derived_global_max_size() if max_size < 0 else max_size,
            int(broker_cfg.get("global-max-messages", -1)),
        )
        #: Moves a new message's body to disk once `limits.flow_above` is passed (the
        #: flow-to-disk plugin sets both).
        self.flow_to_disk: Callable[[Message], None] | None = None
        #: Plugins' figures for `stats()`, by section name.
        self.stats_sections: dict[str, Callable[[], dict[str, Any]]] = {}
        #: Open client connections of every protocol, by id (kept by the server).
        self.connections: dict[int, ConnectionInfo] = {}
        #: What recovery found of the paging plugin's journal records, for it to take.
        self.page_recovery: PageRecovery | None = None
        self.messages_routed = 0
        self.messages_unrouted = 0
        self.messages_expired = 0
        self.messages_dead_lettered = 0
        #: Messages dropped because their address had seen their duplicate id.
        self.messages_duplicate = 0
        #: Duplicate detection: every address's cache of the ids it admitted last, by
        #: address name (an address auto-deleted and created again keeps its ids).
        self.duplicate_ids: dict[str, DuplicateIdCache] = {}
        self.id_cache_size = int(broker_cfg.get("id-cache-size", DEFAULT_ID_CACHE_SIZE))
        self.persist_id_cache = bool(broker_cfg.get("persist-id-cache", True))
        #: Caches with ids admitted on their own to journal at the end of the loop pass.
        self._ids_to_write: list[tuple[str, DuplicateIdCache]] = []
        #: Acknowledgements storage had no room for (see `_ack_not_stored`).
        self.acks_not_stored = 0
        #: Dead-letter/expiry moves storage refused, waiting to be tried again.
        self.moves_waiting = 0
        #: Commits run in slices (`commit`) not over yet (`finish_commits`).
        self.commits: set[_SlicedCommit] = set()
        #: Rollbacks with slices left to run (`rollback`), and the slices run so far.
        self.rollbacks: set[_Rollback] = set()
        self.rollback_slices = 0
        #: Logins, permissions and connection limits (`scow.core.security`).
        self.security = Security.from_config(config)
        #: Where large messages' bodies live (`scow.core.large_messages`; files unless
        #: given): opened off the event loop before recovery (`LargeMessageStore.open`).
        self.large_messages = large_messages or configured_store(
            {}, config, "", persistent=persistent
        )
        self._connection_numbers = itertools.count(1)

    # ------------------------------------------------------------------ settings and ids

    def settings_for(self, address: str) -> AddressSettings:
        return self.config.address_settings.get(address)

    def next_id(self) -> int:
        return self.storage.next_id()

    def next_connection_number(self) -> int:
        """A number for a new client connection, unique across protocols while running."""
        return next(self._connection_numbers)

    @staticmethod
    def expired(message: Message) -> bool:
        return 0 < message.expiration <= now_ms()

    # ------------------------------------------------------------------ addresses

    def get_address(self, name: str) -> AddressInfo | None:
        return self.addresses.get(name)

    def create_address(
        self,
        name: str,
        routing_types: set[RoutingType],
        *,
        auto_created: bool = False,
        durable: bool = True,
        temporary: bool = False,
        record_id: int | None = None,
    ) -> AddressInfo:
        """Create an address, or add routing types to an existing one."""
        existing = self.addresses.get(name)
        if existing is not None:
            if not routing_types <= existing.routing_types:
                existing.routing_types |= routing_types
                self._store_address(existing)
            return existing
        settings = self.settings_for(name)
        address = AddressInfo(
            name,
            set(routing_types),
            settings,
            auto_created=auto_created,
            durable=durable,
            temporary=temporary,
            limits=self.limits,
        )
        address.full_policy = self._full_policy_for(address)
        if record_id is None:
            self._store_address(address)  # first: storage may refuse (StorageFull)
        else:
            address.record_id = record_id
        self.addresses[name] = address
        log.debug("address created", address=name, routing=sorted(r.value for r in routing_types))
        return address

    @property
    def _persisted_settings_path(self) -> Path:
        return Path(str(self.config.section("broker")["data-dir"])) / PERSISTED_SETTINGS

    def load_persisted_settings(self) -> None:
        """Apply the address settings a run-time change asked to keep (over the config)."""
        path = self._persisted_settings_path
        if not path.exists():
            return
        try:
            layers = json.loads(path.read_text())
            for pattern, layer in layers.items():
                repository = self.config.address_settings
                repository.add(pattern, {**(repository.explicit(pattern) or {}), **layer})
        except (ValueError, AttributeError) as exc:
            raise InvalidField(
                f"{path}: {exc} (delete the file to start from the config)"
            ) from None

    def _persist_settings(self, pattern: str, changes: Mapping[str, object]) -> None:
        path = self._persisted_settings_path
        layers = json.loads(path.read_text()) if path.exists() else {}
        layers[pattern] = {**layers.get(pattern, {}), **changes}
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(layers, indent=2, sort_keys=True, default=str))
        os.replace(partial, path)

    def set_address_settings(
        self, pattern: str, changes: Mapping[str, object], *, persist: bool = False
    ) -> None:
        """Change the settings of `pattern` at run time (merged into what it had); every
        matching address takes them at once. With `persist`, they are also kept in the
        data dir and applied at each start (over the config file, which stays as it is).

        Raises InvalidField naming the setting (and what is accepted), or ResourceLocked
        when an address with pages would change its address-full-policy (that needs a
        restart).
        """
        policy = changes.get("address-full-policy")
        if isinstance(policy, str) and policy.upper() not in self.full_policies:
            raise InvalidField(
                f"address-full-policy = {policy!r}: no enabled plugin provides it "
                f"(accepted: {', '.join(sorted(self.full_policies))})"
            )
        repository = self.config.address_settings
        old = repository.explicit(pattern)
        try:
            repository.add(pattern, {**(old or {}), **changes})
        except ValueError as exc:
            raise InvalidField(str(exc)) from None
        changed = {
            name: address
            for name, address in self.addresses.items()
            if self.settings_for(name).address_full_policy != address.settings.address_full_policy
        }
        paged = [name for name, address in changed.items() if address.pager is not None]
        if paged:
            if old is None:
                repository.remove(pattern)
            else:
                repository.add(pattern, old)
            raise ResourceLocked(
                f"address '{paged[0]}' has pages: its address-full-policy changes with a restart"
            )
        for name, address in self.addresses.items():
            address.settings = self.settings_for(name)
            if name in changed:
                address.full_policy = self._full_policy_for(address)
        for name, cache in list(self.duplicate_ids.items()):
            cache.size = self._id_cache_size(name)  # a smaller cache shrinks as ids arrive
            if cache.size <= 0:
                self._forget_ids(name)
        self.resume_producers()  # a raised limit lets blocked producers go on
        if persist:
            self._persist_settings(pattern, changes)
        log.info("address settings changed", pattern=pattern, settings=dict(changes), kept=persist)

    def _full_policy_for(self, address: AddressInfo) -> Any:
        """The address's full policy, if any limit (its own or the broker's) can fill it.

        The broker-wide limits apply only to addresses whose policy some enabled plugin
        provides (the app warns at startup about those it cannot bound).
        """
        settings = address.settings
        own_limit = settings.max_size_bytes >= 0 or settings.max_size_messages >= 0
        global_limit = self.limits.max_size >= 0 or self.limits.max_messages >= 0
        if not (own_limit or global_limit):
            return None
        policy = self.full_policies.get(settings.address_full_policy)
        if policy is None:
            if not own_limit:
                return None
            raise ResourceLimitExceeded(
                f"address '{address.name}': address-full-policy "
                f"'{settings.address_full_policy}' is not provided by any enabled plugin "
                f"(available: {', '.join(sorted(self.full_policies)) or 'none'})"
            )
        return policy.factory(address, self)

    def _store_address(self, address: AddressInfo) -> None:
        if not (self.persistent and address.durable and not address.temporary):
            return
        if address.record_id is not None:
            self.storage.delete_binding(address.record_id)
        record_id = address.record_id = self.next_id()
        self.storage.store_address(
            record_id,
            {
                "name": address.name,
                "routing-types": sorted(r.value for r in address.routing_types),
                "auto-created": address.auto_created,
            },
        )

    def delete_address(self, name: str, *, forget_ids: bool = False) -> None:
        """Delete an address and its queues. Its duplicate-id cache stays (an address
        auto-deleted once its consumers left still knows what producers sent) unless
        `forget_ids` (an operator's delete) or the address was temporary."""
        address = self.addresses.pop(name, None)
        if address is None:
            return
        for queue_name in list(address.queues):
            self.delete_queue(queue_name)
        if address.pager is not None:
            address.pager.close()
        if address.record_id is not None:
            self.storage.delete_binding(address.record_id)
        if (forget_ids or address.temporary) and name in self.duplicate_ids:
            self._forget_ids(name)

    def address_for(
        self, name: str, routing_type: RoutingType | None, authorize: Authorize | None = None
    ) -> AddressInfo:
        """The address `name`, auto-created if its settings allow; NotFound otherwise.

        `authorize(permission, address)` raises Unauthorized when the client may not
        create it (createAddress).
        """
        address = self.addresses.get(name)
        if address is not None:
            return address
        settings = self.settings_for(name)
        if not settings.auto_create_addresses:
            raise NotFound(f"address '{name}' does not exist and auto-create-addresses is off")
        if authorize is not None:
            authorize("createAddress", name)
        rtype = routing_type or RoutingType(settings.default_address_routing_type)
        return self.create_address(name, {rtype}, auto_created=True)

    def routing_type_of(self, name: str, hint: RoutingType | None) -> RoutingType:
        """The routing type a link on `name` gets: its hint, else the address's own."""
        if hint is not None:
            return hint
        address = self.addresses.get(name)
        if address is not None and len(address.routing_types) == 1:
            return next(iter(address.routing_types))
        return RoutingType(self.settings_for(name).default_address_routing_type)

    # ------------------------------------------------------------------ queues

    def create_queue(self, spec: QueueSpec, *, record_id: int | None = None) -> Any:
        """Create a queue; a new one (not recovered) takes its address's defaults.

        Raises InvalidField naming the argument or type that is not accepted.
        """
        if spec.name in self.queues:
            raise ResourceLocked(f"queue '{spec.name}' already exists")
        if record_id is None:
            spec = with_defaults(spec, self.settings_for(spec.address), self.queue_types)
        spec, queue_type = typed(spec, self.queue_types)
        address = self.create_address(
            spec.address,
            {spec.routing_type},
            auto_created=spec.auto_created,
            durable=spec.durable,
            temporary=spec.temporary,
        )
        queue_filter = self.compile_filter(spec.filter) if spec.filter is not None else None
        queue = queue_type.factory(spec, self)
        durable = spec.durable and not spec.temporary and self.persistent
        queue.id = record_id if record_id is not None else self.next_id()
        queue.durable = durable
        queue.filter = queue_filter
        if durable and record_id is None:  # first: storage may refuse (StorageFull)
            self.storage.store_queue(queue.id, _queue_description(spec))
        self.queues[spec.name] = queue
        address.bind(queue)
        log.debug("queue created", queue=spec.name, address=spec.address)
        return queue

    def declare_queue(
        self,
        name: str,
        *,
        address: str | None = None,
        routing_type: str | None = None,
        durable: bool = True,
        filter: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        max_consumers: int = -1,
        exclusive: bool | None = None,
        non_destructive: bool | None = None,
    ) -> Any:
        """Create queue `name` as a user described it (config, attach, management).

        Unset values come from the address settings (default-queue-routing-type,
        default-exclusive-queue, ...). Raises BrokerError saying what is not accepted.
        """
        address = address or name
        try:
            rtype = RoutingType(
                (routing_type or self.settings_for(address).default_queue_routing_type).upper()
            )
        except ValueError:
            raise InvalidField(
                f"queue '{name}': routing type {routing_type!r} is not ANYCAST or MULTICAST"
            ) from None
        if filter is not None:
            self.compile_filter(filter)  # a bad selector is refused before anything is created
        return self.create_queue(
            QueueSpec(
                name,
                address,
                rtype,
                filter=filter,
                durable=durable,
                max_consumers=max_consumers,
                exclusive=exclusive,
                non_destructive=non_destructive,
                arguments=tuple((arguments or {}).items()),
            )
        )

    def delete_queue(self, name: str) -> None:
        """Delete a queue with its messages; its consumers are detached first."""
        queue = self.queues.get(name)
        if queue is None:
            return
        for consumer in queue.attached():  # what they hold unsettled comes back first
            consumer.detach(f"queue '{name}' was deleted")
        if not self._is_live(queue):
            return  # losing its last consumer auto-deleted it
        del self.queues[name]
        address = self.addresses.get(queue.address)
        if address is not None:
            address.unbind(name)
        for ref in queue.take():
            self.discard(ref)
        queue.close()
        if queue.durable:
            self.storage.delete_binding(queue.id)
        log.debug("queue deleted", queue=name)
        if (
            address is not None
            and not address.queues
            and (
                address.temporary  # a dynamic reply address goes with its queue
                or (address.auto_created and address.settings.auto_delete_addresses)
            )
        ):
            self.delete_address(address.name)

    def _is_live(self, queue: Any) -> bool:
        """True while `queue` is the broker's queue of that name (not deleted, not replaced)."""
        return self.queues.get(queue.name) is queue

    def _auto_delete(self, queue: Any, waited: bool = False) -> None:
        """Delete an unused queue that asked for it (temporary, or auto-created and idle)."""
        spec: QueueSpec = queue.spec
        if queue.consumer_count() or not self._is_live(queue):
            return
        if spec.delete_on_no_consumers:
            self.delete_queue(queue.name)
            return
        settings = self.settings_for(queue.address)
        if (
            spec.auto_created
            and settings.auto_delete_queues
            and queue.message_count() <= settings.auto_delete_queues_message_count
        ):
            delay = settings.auto_delete_queues_delay
            if delay > 0 and not waited:  # check again once it stayed unused that long
                asyncio.get_running_loop().call_later(delay / 1000, self._auto_delete, queue, True)
                return
            self.delete_queue(queue.name)

    # ------------------------------------------------------------------ producing

    def send(
        self,
        data: bytes,
        address_name: str,
        fmt: MessageFormat,
        routing_type: RoutingType | None = None,
        on_stored: Completion | None = None,
        tx: Transaction | None = None,
        *,
        check_duplicates: bool = True,
    ) -> RouteStatus:
        """Route one message. `on_stored` runs once it is durable, if it must be.

        Returns PENDING when `on_stored` will be called, otherwise the final status
        (DUPLICATE: its duplicate id was seen, so it was dropped) and keeps no hold on
        `on_stored` (which may have run already): a caller may hand the same one to its
        next send. Within a transaction the message is only checked now and routed at
        commit. `check_duplicates=False` routes a message whatever its duplicate id (a
        message moved back, not resent).
        """
        if data.__class__ is not bytes and (body := large_body(data)) is not None:
            if tx is not None:
                body.acquire()  # the transaction holds it until it ends
            elif not body.synced and on_stored is not None:
                # confirmed once both its file and its record are durable
                stored = _after_files([body], on_stored)
                status = self._send(
                    data, address_name, fmt, routing_type, stored, None, check_duplicates
                )
                if status is RouteStatus.PENDING:
                    return status
                stored()
                return status if body.synced else RouteStatus.PENDING
        return self._send(data, address_name, fmt, routing_type, on_stored, tx, check_duplicates)

    def _send(
        self,
        data: bytes,
        address_name: str,
        fmt: MessageFormat,
        routing_type: RoutingType | None,
        on_stored: Completion | None,
        tx: Transaction | None,
        check_duplicates: bool,
    ) -> RouteStatus:
        address = self.addresses.get(address_name)  # address_for, inlined: per message
        if address is None:
            address = self.address_for(address_name, routing_type)
        if tx is not None:
            tx.sends.append((data, address_name, fmt, routing_type))
            return RouteStatus.ROUTED
        # inspect() also looks for a duplicate id: a message without one costs no more
        header = fmt.inspect(data)
        key = header[3]
        cache = None
        if key is not None and check_duplicates:
            cache = address.id_cache
            if cache is None:  # None again: detection is off here
                cache = address.id_cache = self._id_cache(address.name)
            if cache is not None:
                if key.__class__ is not bytes:  # `inspect` gives the key of a valid id
                    key = id_key(key, address.name)  # raises InvalidField
                if header[0] or address.pager is not None:
                    # the message, or its resends, may wait for its storage
                    return self._send_once(
                        data, address, fmt, routing_type, header, cache, key, on_stored
                    )
                # held in memory only, so accepted at once: its id is admitted as it is
                # checked, and withdrawn if the send is refused
                opened = cache.admit_new(key)
                if opened is None:
                    return self._duplicate(cache, key, address, on_stored)
                if opened:  # the first of this loop pass
                    self._write_ids_soon(address.name, cache)
        try:
            routed = self._route(data, address, fmt, routing_type, header)
            if routed.__class__ is RouteStatus:  # isinstance: 65 ns, EnumType's own check
                return routed  # it goes nowhere, but its id counts (Artemis)
            message, queues, full = routed
            try:
                return self._accept(message, queues, address, on_stored, full)
            except StorageFull:
                self.messages_routed -= 1  # refused before anything was enqueued or counted
                raise
        except BaseException:
            if cache is not None:
                cache.withdraw(key)
            raise

    def _duplicate(
        self,
        cache: DuplicateIdCache,
        key: bytes,
        address: AddressInfo,
        on_stored: Completion | None,
    ) -> RouteStatus:
        """Drop (but accept) a message whose id `key` its address's cache holds."""
        self.messages_duplicate += 1
        if debug_enabled():  # a resend storm is thousands of these
            log.debug("duplicate message dropped", address=address.name, id=describe_id(key))
        waiting = cache.pending.get(key)
        if waiting is not None and on_stored is not None:
            # what it repeats is not durable yet: it is confirmed when that is
            waiting.append(on_stored)
            return RouteStatus.PENDING
        return RouteStatus.DUPLICATE

    def _send_once(
        self,
        data: bytes,
        address: AddressInfo,
        fmt: MessageFormat,
        routing_type: RoutingType | None,
        header: Header,
        cache: DuplicateIdCache,
        key: bytes,
        on_stored: Completion | None,
    ) -> RouteStatus:
        """Send a message with id `key`, durable or to an address that may page, once:
        one journaled goes as a transaction of its own, so that it and its id are
        journaled together (both durable, or neither); any other's id joins its cache's
        open block, its resends confirmed when it is stored."""
        if key in cache:
            return self._duplicate(cache, key, address, on_stored)
        routed = self._route(data, address, fmt, routing_type, header)
        if routed.__class__ is RouteStatus:
            # it goes nowhere, but its id counts (Artemis)
            if cache.admit(key):  # the first of this loop pass
                self._write_ids_soon(address.name, cache)
            return routed
        message, queues, full = routed
        pager = address.pager
        paging = pager is not None and (full or pager.paging)
        durable = message.kind.durable
        if not (
            durable
            and self.persistent
            and self.persist_id_cache
            and (paging or any(q.durable for q in queues))
        ):  # no id record to journal with the message: no transaction
            # a message held in memory only is accepted at once (`_accept`): resends of
            # it have nothing to wait for
            waits = on_stored is not None and (durable or paging)
            if waits:
                resends: list[Completion] = []
                cache.pending[key] = resends  # until it is stored
                on_stored = _confirming_resends(cache, key, resends, on_stored)
            try:
                status = self._accept(message, queues, address, on_stored, full)
            except StorageFull:
                self.messages_routed -= 1
                if waits:
                    cache.pending.pop(key, None)
                raise
            if cache.admit(key):  # the first of this loop pass
                self._write_ids_soon(address.name, cache)
            if waits and status is not RouteStatus.PENDING and cache.pending.get(key) is resends:
                del cache.pending[key]  # accepted at once: `on_stored` is not called
            return status
        # journaled: the message and its id in one journal transaction
        kept: list[tuple[Message, list[Any], AddressInfo]] = []
        paged: list[tuple[Message, list[Any], Any]] = []
        _place((message, queues, full), address, kept, paged)
        returned = False

        def stored() -> None:
            if returned and on_stored is not None:  # not when commit runs it at once
                on_stored()

        tx = Transaction(self.next_id())
        status = self._commit_routed(tx, stored, [(cache, address.name, key)], kept, paged)
        returned = True
        if status is RouteStatus.PENDING and on_stored is not None:
            return RouteStatus.PENDING
        return RouteStatus.ROUTED

    def _write_ids_soon(self, address_name: str, cache: DuplicateIdCache) -> None:
        """`cache` opened a block for ids of messages that are not journaled: with
        persist-id-cache, it is journaled (unsynced: nothing waits for it) at the end of
        the loop pass, one record for the ids its address admits meanwhile."""
        if not self._ids_to_write:
            try:
                asyncio.get_running_loop().call_soon(self.write_duplicate_ids)
            except RuntimeError:  # no loop runs (a tool driving the broker): at once
                self._write_block(address_name, cache)
                return
        self._ids_to_write.append((address_name, cache))

    def write_duplicate_ids(self) -> None:
        """Journal the ids admitted on their own since the last call, a record per
        address; runs at the end of a loop pass that admitted some, and before the
        broker's storage stops."""
        caches, self._ids_to_write = self._ids_to_write, []
        for address_name, cache in caches:
            self._write_block(address_name, cache)

    def _write_block(self, address_name: str, cache: DuplicateIdCache) -> None:
        """Journal `cache`'s open block (unsynced) and delete the records it dropped."""
        blocks, dead = cache.close()
        try:
            for block, keys in blocks:
                record_id = self.next_id()
                self.storage.store_duplicate_ids(record_id, address_name, [keys], deleting=dead)
                block.record_id, block.keys, dead = record_id, None, []
            for record_id in dead:
                self.storage.delete_record(record_id)
        except StorageFull:
            # their messages were accepted: the ids are kept in memory only, and records
            # not deleted are dropped with their generation at the next start
            log.warning("duplicate ids not journaled: storage full", address=address_name)

    def _id_cache_size(self, address_name: str) -> int:
        size = self.settings_for(address_name).id_cache_size
        return self.id_cache_size if size is None else size

    def _id_cache(self, address_name: str) -> DuplicateIdCache | None:
        """The duplicate-id cache of an address; None when its id-cache-size is 0."""
        cache = self.duplicate_ids.get(address_name)
        if cache is None:
            size = self._id_cache_size(address_name)
            if size <= 0:
                return None
            cache = self.duplicate_ids[address_name] = DuplicateIdCache(
                size, journaled=self.persistent and self.persist_id_cache
            )
        elif cache.size <= 0:
            return None
        return cache

    def _forget_ids(self, address_name: str) -> None:
        """Drop an address's duplicate-id cache and its records."""
        cache = self.duplicate_ids.pop(address_name, None)
        address = self.addresses.get(address_name)
        if address is not None:
            address.id_cache = None
        if cache is None or not self.persistent:
            return
        try:
            for record_id in cache.clear():
                self.storage.delete_record(record_id)
        except StorageFull:  # the rest come back at the next start
            log.warning("duplicate ids not deleted: storage full", address=address_name)

    def _accept(
        self,
        message: Message,
        queues: list[Any],
        address: AddressInfo,
        on_stored: Completion | None,
        full: bool,
    ) -> RouteStatus:
        """Put a routed message in its queues' memory, or in the address's pages."""
        pager = address.pager
        if pager is not None and (full or pager.paging):
            return pager.page(message, queues, on_stored, None)
        if address.keepers and message.kind.durable and self.persistent:
            kept = [q for q in queues if q.durable and q in address.keepers]
            if kept:
                return self._accept_kept(message, queues, kept, address, on_stored)
        message, journaled = self._store(message, queues, address, on_stored, None)
        for queue in queues:
            queue.enqueue(message)
        if journaled and on_stored is not None:
            return _PENDING
        return _ROUTED

    def _accept_kept(
        self,
        message: Message,
        queues: list[Any],
        kept: list[Any],
        address: AddressInfo,
        on_stored: Completion | None,
    ) -> RouteStatus:
        """Accept a durable message some of whose queues keep their own durable copy
        (`keeps_durable_copy`): journaled for the other durable queues only, so it is
        written once for each store; `on_stored` runs once the journal and every keeper
        have it."""
        others = [q for q in queues if q not in kept]
        parts = len(kept) + any(q.durable for q in others)
        done = None if on_stored is None else after_all(parts, on_stored)
        message, _journaled = self._store(message, others, address, done, None, refs=len(queues))
        for queue in queues:
            if queue in kept:
                queue.keep(message, done)
            else:
                queue.enqueue(message)
        return RouteStatus.ROUTED if done is None else RouteStatus.PENDING

    def release_kept(self, ref: MessageRef) -> None:
        """A queue that keeps its own durable copy (`keeps_durable_copy`) has that copy
        and is done holding `ref` in memory: free it (no journal record to touch)."""
        self._release_memory(ref)

    def _route(
        self,
        data: bytes,
        address: AddressInfo,
        fmt: MessageFormat,
        routing_type: RoutingType | None,
        header: Header,
    ) -> RouteStatus | tuple[Message, list[Any], bool]:
        """The message (whose `fmt.inspect` is `header`), the queues it goes to and
        whether the address is full; or why it goes nowhere."""
        durable, priority, ttl, _duplicate_id = header
        settings = address.settings
        message = Message(0, data, address.name, fmt, durable, priority)  # no keywords: a dict
        if ttl > 0 or settings.expiry_delay >= 0:
            message.expiration = _expiration(ttl, settings)
        full = address.full_policy is not None and address.is_full()
        if full:
            verdict = address.full_policy.admit(message)
            if verdict is None:
                raise ResourceLimitExceeded(
                    f"address '{address.name}' is full ({address.size} bytes, "
                    f"max-size-bytes {settings.max_size_bytes}) and its policy is "
                    f"{settings.address_full_policy}"
                )
            if verdict is False:
                return RouteStatus.DROPPED
        queues = self._route_targets(address, routing_type, message)
        if not queues:
            self.messages_unrouted += 1
            if settings.send_to_dla_on_no_route and settings.dead_letter_address:
                queues = self._dead_letter_targets(settings.dead_letter_address, message)
            if not queues:
                return RouteStatus.NO_ROUTE
        for queue in queues:  # a queue may refuse what it cannot hold: nothing is stored yet
            if queue.admit is not None:
                queue.admit(message)
        message.id = self.storage.next_id()
        self.messages_routed += 1
        return message, queues, full

    def _route_targets(
        self, address: AddressInfo, routing_type: RoutingType | None, message: Message
    ) -> list[Any]:
        """Every matching multicast queue plus one matching anycast queue (round robin)."""
        targets: list[Any] = []
        if routing_type is not _ANYCAST and address.multicast:
            targets = [q for q in address.multicast if q.filter is None or q.filter(message)]
        if routing_type is _MULTICAST or _ANYCAST not in address.routing_types:
            return targets
        anycast: list[Any] = address.anycast
        if not anycast and address.settings.auto_create_queues:
            anycast = [self._auto_queue(address.name, RoutingType.ANYCAST)]
        if len(anycast) == 1 and anycast[0].filter is None:
            targets.append(anycast[0])
            return targets
        matching = [q for q in anycast if q.filter is None or q.filter(message)]
        if matching:
            address._anycast_index = (address._anycast_index + 1) % len(matching)
            targets.append(matching[address._anycast_index])
        return targets

    def _auto_queue(self, name: str, routing_type: RoutingType) -> Any:
        max_consumers = self.settings_for(name).default_max_consumers
        return self.create_queue(
            QueueSpec(
                name,
                name,
                routing_type,
                auto_created=True,
                durable=True,
                max_consumers=max_consumers,
            )
        )

    def _store(
        self,
        message: Message,
        queues: list[Any],
        address: AddressInfo,
        on_stored: Completion | None,
        tx_id: int | None,
        refs: int = 0,
    ) -> tuple[Message, bool]:
        """Journal `message` if durable, then account for it.

        Returns the message to enqueue in `queues` (shared when there are several, or
        held by `refs` queues in all when given) and whether it was journaled. Raises
        StorageFull, with nothing accounted, when the journal has no room for it.
        """
        durable_ids = []
        if message.kind.durable and self.persistent:
            durable_ids = [q.id for q in queues if q.durable]
            if durable_ids:
                self.storage.store_message(
                    message.id,
                    message.address,
                    message.expiration,
                    message.priority,
                    durable_ids,
                    message.data,
                    on_stored,
                    tx_id=tx_id,
                )
        data = message.data
        if data.__class__ is not bytes and (body := large_body(data)) is not None:
            body.acquire()
        size = len(data) + MEMORY_OVERHEAD  # address.add_memory, inlined: per message
        address.size += size
        address.message_count += 1
        limits = self.limits
        limits.size += size
        limits.messages += 1
        if limits.size > limits.flow_above:
            self.flow_to_disk(message)  # type: ignore[misc]
        refs = refs or len(queues)
        if refs == 1:  # message.shared's first test, inlined: per message
            return message, bool(durable_ids)
        shared = message.shared(refs, len(durable_ids))
        if isinstance(shared, SharedMessage):  # its further queues' slots, counted too
            shared.ref_bytes = extra = REF_OVERHEAD * (refs - 1)
            address.size += extra
            limits.size += extra
        return shared, bool(durable_ids)

    def _in_journal(self, ref: MessageRef) -> bool:
        """Whether `ref` (not paged) has its place in a journal record of its message."""
        return ref.message.durable and ref.queue.durable

    # ------------------------------------------------------------------ transactions

    def begin(self) -> Transaction:
        return Transaction(self.next_id())

    def commit(
        self,
        tx: Transaction,
        on_done: Completion,
        on_failed: Callable[[BrokerError], None] | None = None,
    ) -> RouteStatus:
        """Route the transaction's messages and apply its acknowledgements, atomically.

        The durable part is one journal transaction; messages become visible and
        acknowledgements take effect once it is on disk, then `on_done` runs. Raises
        BrokerError (and changes nothing) if a message can no longer be routed, and
        DuplicateMessage if one carries a duplicate id its address has admitted (or
        another message of the transaction carries too): Artemis's rule.

        Given `on_failed`, a transaction of more than COMMIT_SLICE messages and
        acknowledgements is committed a slice per pass of the event loop, so that other
        connections are served meanwhile (see `_SlicedCommit`): it returns PENDING at
        once, and an error met in any slice undoes what the commit took and goes to
        `on_failed` instead of being raised (the caller rolls back, as for a raised one).
        """
        if on_failed is not None and tx.weight() > COMMIT_SLICE:
            _SlicedCommit(self, tx, on_done, on_failed).start()
            return RouteStatus.PENDING
        bodies = _large_bodies(tx)
        kept: list[tuple[Message, list[Any], AddressInfo]] = []
        paged: list[tuple[Message, list[Any], Any]] = []
        ids, _routed = self._route_sends(tx, 0, len(tx.sends), set(), kept, paged)
        if bodies:
            on_done = _after_files(bodies, on_done)
        status = self._commit_routed(tx, on_done, ids, kept, paged)
        for body in bodies:  # its messages hold their files now (`_store`, the pages)
            body.release()
        return status

    def _route_sends(
        self,
        tx: Transaction,
        start: int,
        end: int,
        seen: set[tuple[str, bytes]],
        kept: list[tuple[Message, list[Any], AddressInfo]],
        paged: list[tuple[Message, list[Any], Any]],
    ) -> tuple[list[tuple[DuplicateIdCache, str, bytes]], int]:
        """Route `tx.sends[start:end]` into `kept` and `paged` (`_place`), their duplicate
        ids checked first (`_ids_of`: a duplicate refuses before any is routed). A packed
        send goes whole, marked `PackedRows`, where its address takes packs when it is
        routed (`_takes_packs`: routing the sends before it may have changed that), else
        as its rows. Returns those ids and how many messages were routed."""
        sends = tx.sends[start:end]
        packed = tx.packed
        packs = (
            [packed.get(place) for place in range(start, end)] if packed else [None] * len(sends)
        )
        headers = [
            fmt.inspect(data) if pack is None else pack.header
            for (data, _address, fmt, _routing_type), pack in zip(sends, packs, strict=True)
        ]
        ids = self._ids_of(sends, headers, seen)
        for (_data, address_name, _fmt, _routing_type), pack in zip(sends, packs, strict=True):
            if pack is not None:
                ids += self._pack_ids(address_name, pack.duplicate_keys(), seen)
        routed = 0
        for (data, address_name, fmt, routing_type), header, pack in zip(
            sends, headers, packs, strict=True
        ):
            address = self.address_for(address_name, routing_type)
            if pack is None:
                messages = [(data, header)]
            elif _takes_packs(address, routing_type):
                messages = [(PackedRows(data), header)]
            else:  # a queue takes single messages: the rows go
                messages = [(row, fmt.inspect(row)) for row in pack.unpacked()]
            for message, message_header in messages:
                result = self._route(message, address, fmt, routing_type, message_header)
                if not isinstance(result, RouteStatus):
                    _place(result, address, kept, paged)
                    routed += 1
        return ids, routed

    def _pack_ids(
        self, address_name: str, keys: list[bytes], seen: set[tuple[str, bytes]]
    ) -> list[tuple[DuplicateIdCache, str, bytes]]:
        """`_ids_of` for the duplicate ids of a pack's rows (their cache `keys`), all for
        `address_name`: checked as a block (set operations, not a test per row)."""
        cache = self._id_cache(address_name)
        if cache is None or not keys:
            return []
        pairs = {(address_name, key) for key in keys}
        if len(pairs) < len(keys) or not pairs.isdisjoint(seen) or cache.holds_any(keys):
            for key in keys:  # the first one seen before, for the error
                _note_new_id(cache, address_name, key, seen)
        seen |= pairs
        return [(cache, address_name, key) for key in keys]

    def _commit_routed(
        self,
        tx: Transaction,
        on_done: Completion,
        ids: list[tuple[DuplicateIdCache, str, bytes]],
        kept: list[tuple[Message, list[Any], AddressInfo]],
        paged: list[tuple[Message, list[Any], Any]],
    ) -> RouteStatus:
        """`commit` once its messages are routed: those for queues' memory (`kept`) and
        those for pages, and the duplicate ids they carry (checked)."""
        # The journal first: it may refuse (StorageFull) while nothing is visible yet.
        taken = _Taken()
        try:
            self._store_kept(tx, kept, taken)
            self._store_acks(tx, tx.acks, taken)
            admitted = self._store_last(tx, ids, paged, taken)
        except StorageFull:
            self._abandon_commit(tx, taken.stored, taken.acks, len(kept) + len(paged))
            raise
        return self._commit_stored(tx, on_done, admitted, paged, taken)

    def _store_kept(
        self, tx: Transaction, kept: list[tuple[Message, list[Any], AddressInfo]], taken: _Taken
    ) -> None:
        """Journal, within `tx`, the routed messages for queues' memory (not visible yet)."""
        for message, queues, address in kept:
            shared, in_journal = self._store(message, queues, address, None, tx.id)
            taken.stored.append((message, address))
            taken.visible.append((shared, queues))
            taken.journaled |= in_journal

    def _store_acks(self, tx: Transaction, acks: list[MessageRef], taken: _Taken) -> None:
        """Journal, within `tx`, that the queues of `acks` are done with their messages."""
        for ref in acks:
            if self._journal_ack(ref, tx.id):
                taken.journaled = True
                taken.acks.append(ref)

    def _store_last(
        self,
        tx: Transaction,
        ids: list[tuple[DuplicateIdCache, str, bytes]],
        paged: list[tuple[Message, list[Any], Any]],
        taken: _Taken,
    ) -> list[tuple[DuplicateIdCache, list[bytes], int]]:
        """Journal, within `tx`, what a commit writes once its messages are stored: that
        its paged messages count, and its duplicate ids. Returns the ids to admit."""
        for _message, _queues, pager in paged:
            # a page store is opened first: its file system may refuse (StorageFull)
            prepare = getattr(pager, "prepare_store", None)
            if prepare is not None:
                prepare()
        if paged and self.persistent:
            self.storage.store_page_tx(tx.id)  # marks the tx's page records as committed
            taken.journaled = True
        admitted = self._journal_ids(tx, ids) if ids else []
        taken.journaled |= any(record_id for _, _, record_id in admitted)
        return admitted

    def _commit_stored(
        self,
        tx: Transaction,
        on_done: Completion,
        admitted: list[tuple[DuplicateIdCache, list[bytes], int]],
        paged: list[tuple[Message, list[Any], Any]],
        taken: _Taken,
        enqueue: Callable[[list[tuple[Message, list[Any]]], Callable[[], None]], None]
        | None = None,
    ) -> RouteStatus:
        """Commit what `_store_*` journaled: nothing can refuse it from here. Its messages
        become visible once the commit record is durable: all at once, or by `enqueue`
        (theirs, then what runs after: a `_SlicedCommit`'s, a slice per pass of the loop);
        then `on_done` runs. ROUTED when that was at once."""
        waiting = self._admit_ids(admitted) if admitted else []
        barrier = _Barrier()
        # The commit record goes only once the pages hold the transaction's messages: a
        # crash before it leaves none of the transaction, never its acknowledgements
        # without the messages it paged (a dead letter's copy, a pipeline's output).
        pages = _Barrier() if paged and taken.journaled else barrier
        pagers: list[Any] = []
        for message, queues, pager in paged:
            pager.page(message, queues, pages.add(), tx.id)
            if pager not in pagers:
                pagers.append(pager)
        acks, tx.acks, tx.sends, tx.packed = tx.acks, [], [], {}
        visible = taken.visible
        done_now = False

        def finish() -> None:
            for pager in pagers:
                pager.commit_tx(tx.id)
            if enqueue is None:
                _enqueue(visible, 0, len(visible))
                settle()
            else:
                enqueue(visible, settle)

        def settle() -> None:
            nonlocal done_now
            for ref in acks:
                self._settle_ack(ref)
            on_done()
            for cache, key, resends in waiting:  # resends of its messages are confirmed
                if cache.pending.get(key) is resends:
                    del cache.pending[key]
                for resent in resends:
                    resent()
            done_now = True

        if pages is not barrier:
            committed = barrier.add()
            pages.arm(lambda: self.storage.commit(tx.id, committed))
        elif taken.journaled:
            self.storage.commit(tx.id, barrier.add())
        barrier.arm(finish)
        return RouteStatus.ROUTED if done_now else RouteStatus.PENDING

    def _ids_of(
        self,
        sends: list[tuple[bytes, str, MessageFormat, RoutingType | None]],
        headers: list[Header],
        seen: set[tuple[str, bytes]] | None = None,
    ) -> list[tuple[DuplicateIdCache, str, bytes]]:
        """(cache, address, key) of each duplicate id a transaction's `sends` carry
        (their `headers`, in order); DuplicateMessage when one was already admitted or two
        messages carry it (`seen`: those of its sends checked before these)."""
        ids: list[tuple[DuplicateIdCache, str, bytes]] = []
        if seen is None:
            seen = set()
        for (_data, address_name, _fmt, _routing_type), header in zip(sends, headers, strict=True):
            key = header[3]
            if key is None:
                continue
            cache = self._id_cache(address_name)
            if cache is None:
                continue
            if key.__class__ is not bytes:  # `inspect` gives the key of a valid id
                key = id_key(key, address_name)
            _note_new_id(cache, address_name, key, seen)
            ids.append((cache, address_name, key))
        return ids

    def _journal_ids(
        self, tx: Transaction, ids: list[tuple[DuplicateIdCache, str, bytes]]
    ) -> list[tuple[DuplicateIdCache, list[bytes], int]]:
        """Journal, within `tx`, the ids its commit admits (a record per address) and the
        deletion of the blocks they push out of their caches (with persist-id-cache); the
        caches are unchanged. Returns, per cache, the ids it is to take and their record
        (0: not journaled)."""
        by_cache: dict[int, tuple[DuplicateIdCache, str, list[bytes]]] = {}
        for cache, address_name, key in ids:
            by_cache.setdefault(id(cache), (cache, address_name, []))[2].append(key)
        persist = self.persistent and self.persist_id_cache
        admitted = []
        for cache, address_name, keys in by_cache.values():
            kept = cache.kept(keys)
            record_id = 0
            if persist and kept:
                # the ids admitted on their own before these go first, so that record ids
                # keep the order of admission
                self._write_block(address_name, cache)
                record_id = self.next_id()
                self.storage.store_duplicate_ids(
                    record_id,
                    address_name,
                    kept,
                    tx_id=tx.id,
                    deleting=cache.emptied_by(kept),
                )
            admitted.append((cache, kept, record_id))
        return admitted

    @staticmethod
    def _admit_ids(
        admitted: list[tuple[DuplicateIdCache, list[bytes], int]],
    ) -> list[tuple[DuplicateIdCache, bytes, list[Completion]]]:
        """Put a commit's ids in their caches; each is pending (resends of it wait for
        its commit to be durable) until the returned lists are run."""
        waiting = []
        for cache, keys, record_id in admitted:
            cache.add_block(keys, record_id)  # the blocks it empties: deleted in the commit
            for key in keys:
                resends: list[Completion] = []
                cache.pending[key] = resends
                waiting.append((cache, key, resends))
        return waiting

    def _abandon_commit(
        self,
        tx: Transaction,
        stored: list[tuple[Message, AddressInfo]],
        acks: list[MessageRef],
        routed: int,
    ) -> None:
        """Storage refused part of a commit: undo the part it took (the caller rolls the
        transaction back, so its acknowledged messages go back to their queues)."""
        for message, address in stored:
            self._unaccount(message, address)
        for ref in acks:
            self._restore_stored_ref(ref)
        self.messages_routed -= routed
        if self.persistent:
            try:
                self.storage.rollback(tx.id)
            except StorageFull:
                # its records stay uncommitted: recovery rolls them back
                log.warning("transaction rollback not journaled: storage full", tx=tx.id)

    def _unaccount(self, message: Message, address: AddressInfo) -> None:
        """The reverse of `_store`'s accounting, for a message never enqueued."""
        if (body := large_body(message.data)) is not None:
            body.release()
        size = len(message.data) + MEMORY_OVERHEAD + message.ref_bytes
        address.size -= size
        address.message_count -= 1
        limits = self.limits
        limits.size -= size
        limits.messages -= 1

    def rollback(self, tx: Transaction, on_done: Completion | None = None) -> None:
        """Forget the transaction's messages; its acknowledged messages go back (+1 count).

        They are taken in id order, COMMIT_SLICE per pass of the event loop, and each
        slice goes back to its queues at once (`_put_back_all`) when its new counts are
        durable: a rollback of thousands (a Spark sink's failed commit) would otherwise
        hold the loop, and every other connection, until the last one is back. `on_done`
        runs once the last one is back: until then some of them are not in their queues
        (a caller that lets them be taken again waits for it).
        """
        for body in _large_bodies(tx):
            body.release()
        acks, tx.acks, tx.sends, tx.packed = tx.acks, [], [], {}
        acks.sort(key=lambda r: r.message.id)
        _Rollback(self, acks, on_done).step()

    async def finish_commits(self) -> None:
        """End every commit still running in slices (shutdown: connections are closed,
        and storage must not meet their journal writes as it stops). One still journaling
        its slices is undone: it was not answered and its connection is gone, so either
        outcome is one its client allows, and undoing writes one rollback record now where
        finishing would journal every slice left. One whose commit record is written is
        finished: its messages are enqueued at once, once that record is durable (awaited
        here). Undone commits roll their transactions back: `finish_rollbacks` after this."""
        for commit in list(self.commits):
            commit.finish()
        if self.commits:  # their commit records are not durable yet
            await asyncio.wait([commit.over for commit in self.commits])

    def finish_rollbacks(self) -> None:
        """Roll back at once the slices rollbacks still have to run (shutdown: before
        storage stops, which must not meet their journal writes)."""
        for rollback in list(self.rollbacks):
            rollback.finish()

    def _roll_back(self, acks: list[MessageRef], on_done: Completion) -> None:
        """Count a failed delivery of each of `acks` and put them back once that is
        durable, then run `on_done`."""
        back: dict[int, tuple[Any, list[MessageRef]]] = {}
        counted = _Barrier()
        for ref in acks:
            done = counted.add()
            outcome = self._count_attempt(ref, done)
            if outcome != _LATER:
                done()
            if outcome != _GONE:
                back.setdefault(id(ref.queue), (ref.queue, []))[1].append(ref)

        def put_back() -> None:
            self._put_back_all(list(back.values()))
            on_done()

        counted.arm(put_back)

    # ------------------------------------------------------------------ consuming

    def subscribe(
        self,
        consumer: Consumer,
        address_name: str,
        *,
        routing_type: RoutingType | None = None,
        selector: str | None = None,
        durable: bool = False,
        shared: bool = False,
        global_: bool = False,
        subscription: str | None = None,
        client_id: str = "",
        authorize: Authorize | None = None,
    ) -> Any:
        """Attach `consumer` to the queue it asked for, creating it where allowed.

        Anycast: the queue named like the address (or `address::queue`). Multicast: a
        subscription queue: temporary, or durable and named `client_id.subscription`
        (just `subscription` for global shared ones). `authorize(permission, address)`
        is asked before anything is created (createAddress, createDurableQueue,
        createNonDurableQueue) and raises Unauthorized to refuse.
        """
        if FQQN_SEPARATOR in address_name:
            address_name, queue_name = address_name.split(FQQN_SEPARATOR, 1)
            queue = self.queues.get(queue_name)
            if queue is None or queue.address != address_name:
                raise NotFound(f"queue '{queue_name}' on address '{address_name}' does not exist")
            return self._attach(consumer, queue, selector)
        rtype = self.routing_type_of(address_name, routing_type)
        settings = self.settings_for(address_name)
        if rtype is RoutingType.ANYCAST:
            queue = self.queues.get(address_name)
            if queue is None:
                address = self.addresses.get(address_name)
                if address is None and not settings.auto_create_addresses:
                    raise NotFound(
                        f"address '{address_name}' does not exist and auto-create-addresses is off"
                    )
                if not settings.auto_create_queues:
                    raise NotFound(
                        f"queue '{address_name}' does not exist and auto-create-queues is off"
                    )
                if authorize is not None:
                    if address is None:
                        authorize("createAddress", address_name)
                    authorize("createDurableQueue", address_name)
                queue = self._auto_queue(address_name, RoutingType.ANYCAST)
            return self._attach(consumer, queue, selector)
        self.address_for(address_name, RoutingType.MULTICAST, authorize)
        name = _subscription_queue_name(durable, shared, global_, subscription, client_id)
        queue = self.queues.get(name) if name else None
        if queue is not None and (queue.spec.filter != selector or queue.address != address_name):
            if queue.consumer_count():
                raise ResourceLocked(
                    f"subscription '{name}' is in use with a different address or selector"
                )
            if authorize is not None:
                authorize("deleteDurableQueue", address_name)
            self.delete_queue(queue.name)  # a changed subscription starts afresh
            queue = None
        if queue is None:
            if authorize is not None:
                authorize(
                    "createDurableQueue" if durable else "createNonDurableQueue", address_name
                )
            queue = self.create_queue(
                QueueSpec(
                    name or f"{address_name}.{uuid.uuid4()}",
                    address_name,
                    RoutingType.MULTICAST,
                    filter=selector,
                    durable=durable,
                    temporary=not durable,
                    delete_on_no_consumers=not durable,
                )
            )
        return self._attach(consumer, queue, None)

    def compile_filter(self, selector: str) -> Callable[[Message], bool]:
        """A message filter from a selector; InvalidField names what is wrong in it.

        The filter keeps its `Selector` (`.selector`): page cursors evaluate it on paged
        records' bytes and against page summaries, without building messages."""
        try:
            compiled = self.compile_selector(selector)
        except ValueError as exc:
            raise InvalidField(str(exc)) from exc
        return SelectorFilter(compiled)

    def _attach(self, consumer: Consumer, queue: Any, selector: str | None) -> Any:
        spec: QueueSpec = queue.spec
        if spec.max_consumers >= 0 and queue.consumer_count() >= spec.max_consumers:
            raise ResourceLimitExceeded(
                f"queue '{queue.name}' already has its max-consumers ({spec.max_consumers})"
            )
        consumer.filter = self.compile_filter(selector) if selector is not None else None
        if spec.non_destructive:
            consumer.browse = True  # it sees messages without taking them
        try:
            queue.add_consumer(consumer)  # which hands it what waits
        except BaseException:
            # a consumer left attached by a failed attach outlives its link: what the
            # queue hands it later would go to a link that no longer exists
            queue.remove_consumer(consumer)
            raise
        return queue

    def subscribe_temporary(self, consumer: Consumer, authorize: Authorize | None = None) -> Any:
        """A dynamic (reply-to) queue for `consumer`, deleted when it goes (its address
        `temp.<uuid>` needs createNonDurableQueue when `authorize` is given)."""
        name = f"temp.{uuid.uuid4()}"
        if authorize is not None:
            authorize("createNonDurableQueue", name)
        queue = self.create_queue(
            QueueSpec(
                name,
                name,
                RoutingType.ANYCAST,
                durable=False,
                temporary=True,
                delete_on_no_consumers=True,
            )
        )
        return self._attach(consumer, queue, None)

    def unsubscribe(self, consumer: Consumer, queue: Any, *, remove_subscription: bool) -> None:
        """Detach `consumer`; `remove_subscription` ends a durable subscription too."""
        queue.remove_consumer(consumer)
        if remove_subscription and queue.spec.routing_type is RoutingType.MULTICAST:
            if not queue.consumer_count():
                self.delete_queue(queue.name)
            return
        self._auto_delete(queue)

    # ------------------------------------------------------------------ outcomes

    def acknowledge(self, ref: MessageRef, tx: Transaction | None = None) -> None:
        """The consumer is done with `ref`; within `tx`, only once `tx` commits."""
        if tx is not None:
            tx.acks.append(ref)
            return
        # _journal_ack's own tests, first: most acknowledgements have nothing to journal
        # (a paged message's cursor journals only durable ones, as the journal does)
        if ref.message.kind.durable and (ref.__class__ is PagedRef or ref.queue.durable):
            try:
                self._journal_ack(ref, None)
            except StorageFull as exc:
                self._ack_not_stored(ref, exc)
        self._settle_ack(ref)

    def _settle_ack(self, ref: MessageRef) -> None:
        ref.queue.acknowledge(ref)
        self._release_memory(ref)
        if ref.queue.spec.auto_created and not ref.queue.consumer_count():
            self._auto_delete(ref.queue)

    def release_unsettled(self, refs: list[MessageRef]) -> None:
        """Put back what a consumer leaves unsettled (its link closed, its connection
        gone): each a failed attempt (delivery-count + 1), all back together in id order
        once their new counts are durable, each queue's in one pass over its waiting list
        (`_roll_back`). Released one by one, each offered again on its own, a consumer
        gone with 200,000 unsettled held every other connection for 0.6 s, and those
        whose count needs no journal write came back ahead of those whose count did."""
        refs.sort(key=lambda r: r.message.id)
        self._roll_back(refs, _nothing)

    def release(self, ref: MessageRef, *, delivered: bool) -> None:
        """Put `ref` back; `delivered` makes it a failed attempt (delivery-count + 1)."""
        if (
            not delivered
            or self._count_attempt(ref, lambda: self._put_back(ref, delivered)) == _NOW
        ):
            self._put_back(ref, delivered)

    def _count_attempt(self, ref: MessageRef, on_stored: Completion) -> int:
        """A failed delivery of `ref`: its delivery count + 1. Returns _GONE when that was
        its last attempt (dead-lettered), _LATER when its new count is journaled
        (`on_stored` runs once that is on disk: it is put back then), else _NOW."""
        queue: Any = ref.queue
        ref.delivery_count += 1
        limit = self.settings_for(queue.address).max_delivery_attempts
        if 0 <= limit <= ref.delivery_count:
            queue.remove_delivering(ref)
            queue.messages_killed += 1
            self._dead_letter(ref)
            return _GONE
        try:
            if ref.__class__ is PagedRef:
                if ref.cursor.store_delivery_count(ref, on_stored):
                    return _LATER
            elif self._in_journal(ref):
                # offered again only once its new count is on disk
                self.storage.update_delivery_count(
                    ref.message.id, queue.id, ref.delivery_count, on_done=on_stored
                )
                return _LATER
        except StorageFull:
            pass  # storage is full: offered again now, the count kept in memory only
        return _NOW

    def _put_back_all(self, back: list[tuple[Any, list[MessageRef]]]) -> None:
        """Put back failed deliveries, each queue's refs (in id order) in one pass where
        it can (`release_all`: a rollback's thousands would otherwise each walk its
        waiting list)."""
        for queue, refs in back:
            bulk = getattr(queue, "release_all", None)
            if bulk is None or not self._is_live(queue) or self._redelivery_delay(queue) > 0:
                for ref in refs:
                    self._put_back(ref, True)
            else:
                bulk(refs, delivered=True)

    def _redelivery_delay(self, queue: Any) -> int:
        return self.settings_for(queue.address).redelivery_delay

    def _put_back(self, ref: MessageRef, delivered: bool) -> None:
        queue: Any = ref.queue
        delay = self._redelivery_delay(queue) if delivered else 0
        if delay > 0:  # a failed delivery waits redelivery-delay ms before it is offered again
            asyncio.get_running_loop().call_later(delay / 1000, self._put_back, ref, False)
            return
        if self._is_live(queue):
            queue.release(ref, delivered=delivered)
        else:  # the queue went away meanwhile
            queue.remove_delivering(ref)
            self.discard(ref)

    def reject(self, ref: MessageRef) -> None:
        """The consumer refuses the message for good: it goes to the dead-letter address."""
        ref.queue.remove_delivering(ref)
        ref.queue.messages_killed += 1
        self._dead_letter(ref)

    def discard(self, ref: MessageRef) -> None:
        """Drop a reference without delivering it (purge, queue deletion, drop policies)."""
        self._dereference(ref)

    def discard_together(self, refs: list[MessageRef], on_done: Completion) -> None:
        """`discard` for several refs, their acknowledgements journaled as one transaction:
        `on_done` runs once it is durable (at once when nothing was journaled), and the
        refs let go of their memory then, as a committed transaction's do."""
        tx_id = self.next_id()
        journaled = False
        for ref in refs:
            try:
                journaled |= self._journal_ack(ref, tx_id)
            except StorageFull as exc:
                self._ack_not_stored(ref, exc)

        def committed() -> None:
            for ref in refs:
                self._release_memory(ref)
            on_done()

        if not journaled:
            committed()
            return
        try:
            self.storage.commit(tx_id, committed)
        except StorageFull as exc:
            # its records stay uncommitted: a restart gives the messages back (at least once)
            self._ack_not_stored(refs[0], exc)
            committed()

    def _dereference(self, ref: MessageRef) -> None:
        try:
            self._journal_ack(ref, None)
        except StorageFull as exc:
            self._ack_not_stored(ref, exc)
        self._release_memory(ref)

    def _journal_ack(self, ref: MessageRef, tx_id: int | None) -> bool:
        """Journal that `ref`'s queue is done with the message; True if anything was written.

        Raises StorageFull, with the message's journal references as they were, when
        storage has no room even for that."""
        if ref.__class__ is PagedRef:
            return ref.cursor.journal_ack(ref, tx_id)
        message = ref.message
        if not (message.kind.durable and ref.queue.durable):  # self._in_journal(ref), inlined
            return False
        last = message.drop_stored_ref()
        try:
            self.storage.acknowledge(message.id, ref.queue.id, last, tx_id=tx_id)
        except StorageFull:
            self._restore_stored_ref(ref)
            raise
        return True

    @staticmethod
    def _restore_stored_ref(ref: MessageRef) -> None:
        """Undo `drop_stored_ref` for an acknowledgement the journal did not take."""
        message = ref.message
        if isinstance(message, SharedMessage) and ref.__class__ is not PagedRef:
            message.stored_refs += 1

    def _ack_not_stored(self, ref: MessageRef, exc: StorageFull) -> None:
        """The journal had no room left even for an acknowledgement (its reserve is gone).

        The message leaves the queue all the same (the consumer is done with it); its
        record stays, so a restart before the journal has room again delivers it again:
        at least once, never lost. Blocking acknowledgements instead would stop consumers,
        which is what frees space."""
        self.acks_not_stored += 1
        if self.acks_not_stored == 1 or self.acks_not_stored % 10_000 == 0:
            log.warning(
                "acknowledgement not journaled: storage full; redelivered after a restart",
                queue=ref.queue.name,
                count=self.acks_not_stored,
                reason=exc.description,
            )

    def _release_memory(self, ref: MessageRef) -> None:
        message = ref.message
        last = message.drop_ref()
        if ref.__class__ is PagedRef:
            ref.cursor.settle(ref)
        if last:
            data = message.data
            if data.__class__ is not bytes and (body := large_body(data)) is not None:
                body.release()
            address = self.addresses.get(message.kind.address)
            if address is not None:
                # the reverse of add_memory (and of `_store`'s ref_bytes), inlined
                size = len(message.data) + MEMORY_OVERHEAD + message.ref_bytes
                address.size -= size
                address.message_count -= 1
                limits = self.limits
                limits.size -= size
                limits.messages -= 1
                if limits.size < limits.max_size <= limits.size + size or (
                    limits.messages + 1 == limits.max_messages  # both: it just stopped being full
                ):
                    self.resume_producers()  # the broker as a whole has room again
                if address.on_space and not address.is_full():
                    for resume in list(address.on_space):
                        resume()
                pager = address.pager
                if pager is not None and pager.paging:
                    pager.check()

    def resume_producers(self) -> None:
        """Addresses may have room again (memory freed, a limit raised): every address's
        blocked producers go on, and a paging address with room leaves page mode."""
        for address in list(self.addresses.values()):
            if address.on_space and not address.is_full():
                for resume in list(address.on_space):
                    resume()
            pager = address.pager
            if pager is not None and pager.paging:
                pager.check()

    # ------------------------------------------------------------------ dead letters and expiry

    def _dead_letter(self, ref: MessageRef) -> None:
        queue: Any = ref.queue
        settings = self.settings_for(queue.address)
        self._move(ref, settings.dead_letter_address, "x-opt-ORIG-", {})
        self.messages_dead_lettered += 1

    def expire(self, ref: MessageRef) -> None:
        """`ref` has outlived its TTL: move it to the expiry address, or drop it."""
        queue: Any = ref.queue
        queue.remove_delivering(ref)
        queue.messages_expired += 1
        self.messages_expired += 1
        settings = self.settings_for(queue.address)
        self._move(ref, settings.expiry_address, "x-opt-ORIG-", {"x-opt-ACTUAL-EXPIRY": now_ms()})

    def _move(
        self,
        ref: MessageRef,
        target: str | None,
        prefix: str,
        extra: dict,
        *,
        retry: bool = False,
    ) -> None:
        """Move `ref`'s message to `target`: a copy there and `ref` dereferenced, in one
        transaction (`_store_move`).

        When storage has no room for the copy or the acknowledgement, the message stays
        where it was (in memory and in its queue's journal record) and the move is tried
        again every MOVE_RETRY seconds until it is stored: once space returns it happens,
        once."""
        message = ref.message
        queue: Any = ref.queue
        if target and target != queue.address:
            queues = self._dead_letter_targets(target, message)
            if queues:
                annotated = message.format.annotate(
                    message.data,
                    {
                        f"{prefix}ADDRESS": message.address,
                        f"{prefix}QUEUE": queue.name,
                        f"{prefix}MESSAGE-ID": message.id,
                        **extra,
                    },
                )
                data = with_head(message.data, annotated)  # a large one keeps its file
                copy = Message(
                    self.next_id(),
                    data,
                    target,
                    message.format,
                    durable=message.durable,
                    priority=message.priority,
                )
                try:
                    self._store_move(ref, copy, queues, self.addresses[target])
                except StorageFull as exc:
                    # The copy cannot be stored: the message keeps its place (its memory,
                    # its journal record) and the move is tried again later, not offered
                    # to consumers again (they would meet it again) nor dropped from
                    # memory (nothing would reach it until a restart).
                    if not retry:
                        log.warning(
                            "message not moved: storage full; moved once space returns",
                            queue=queue.name,
                            target=target,
                            reason=exc.description,
                        )
                    self.moves_waiting += 1
                    asyncio.get_running_loop().call_later(
                        MOVE_RETRY, self._retry_move, ref, target, prefix, extra
                    )
                return
            else:
                log.warning("no queue on dead-letter/expiry address", address=target)
        self._dereference(ref)

    def _store_move(
        self, ref: MessageRef, copy: Message, queues: list[Any], address: AddressInfo
    ) -> None:
        """Store `copy` for `queues` of `address` (its memory or its pages) and journal
        `ref`'s acknowledgement as one transaction, so that a crash leaves one of them,
        never both (the restarted broker would move the original again: two copies);
        `ref` lets go of its memory once the transaction is durable. Raises StorageFull,
        having changed nothing, when storage has no room for either."""
        kept: list[tuple[Message, list[Any], AddressInfo]] = []
        paged: list[tuple[Message, list[Any], Any]] = []
        _place((copy, queues, address.is_full()), address, kept, paged)
        tx = Transaction(self.next_id())
        taken = _Taken()
        try:
            self._store_kept(tx, kept, taken)
            self._store_acks(tx, [ref], taken)
            self._store_last(tx, [], paged, taken)
        except StorageFull:
            self._abandon_commit(tx, taken.stored, taken.acks, 0)  # a copy is not routed
            raise
        self._commit_stored(tx, partial(self._release_memory, ref), [], paged, taken)

    def _retry_move(self, ref: MessageRef, target: str | None, prefix: str, extra: dict) -> None:
        self.moves_waiting -= 1
        if not self._is_live(ref.queue):  # its queue was deleted meanwhile, with the rest
            self.discard(ref)
            return
        self._move(ref, target, prefix, extra, retry=True)

    def _dead_letter_targets(self, target: str, message: Message) -> list[Any]:
        address = self.addresses.get(target) or self.create_address(
            target, {RoutingType.ANYCAST}, auto_created=True
        )
        queues = list(address.queues.values())
        if not queues:
            queues = [self._auto_queue(target, RoutingType.ANYCAST)]
        return [q for q in queues if q.filter is None or q.filter(message)]

    def expire_scan(self) -> int:
        """Move every expired waiting message out of its queue; returns how many."""
        now = now_ms()
        count = 0
        for queue in list(self.queues.values()):
            for ref in take_expired(queue, now):
                self.expire(ref)
                count += 1
            if queue.cursor is not None and queue.cursor.backlog:
                queue.cursor.expire_scan(now)  # enqueues what expired in pages: the next scan
        return count

    # ------------------------------------------------------------------ recovery

    def recover(self, recovered: Recovered, fmt: MessageFormat) -> int:
        """Rebuild topology and queued messages from storage; returns messages restored."""
        self.page_recovery = recovered.pages
        self.message_format = fmt
        for description in recovered.addresses:
            self.create_address(
                description["name"],
                {RoutingType(r) for r in description["routing-types"]},
                auto_created=description.get("auto-created", False),
                record_id=description["id"],
            )
        by_id: dict[int, Any] = {}
        for description in recovered.queues:
            queue = self.create_queue(_queue_spec(description), record_id=description["id"])
            by_id[queue.id] = queue
        self._recover_ids(recovered.duplicate_ids)
        restored = 0
        for rec in recovered.messages:
            refs = self._restore(rec, by_id, fmt)
            for ref in refs:  # a message never delivered waits as itself, without a ref
                ref.queue.enqueue(ref if ref.delivery_count else ref.message)
            restored += bool(refs)
        for prepared in recovered.prepared:
            tx = Transaction(prepared.tx_id)
            for rec in prepared.messages:
                tx.held += self._restore(rec, by_id, fmt)
            for message_id, queue_id in prepared.acks:
                queues = [by_id[queue_id]] if queue_id in by_id else by_id.values()
                for queue in queues:
                    tx.acks += queue.take(lambda r, mid=message_id: r.message.id == mid)
            self.prepared[tx.id] = tx
        if self.prepared:
            log.warning(
                "prepared transactions recovered and held undecided",
                transactions=sorted(self.prepared),
            )
        return restored

    def _recover_ids(self, found: list[RecoveredDuplicateId]) -> None:
        """Rebuild the duplicate-id caches a block at a time, oldest id first, into the
        generations they were in; blocks of a generation dropped (a lowered
        id-cache-size), or all with persist-id-cache false, are deleted."""
        stale: list[int] = []
        for (address, record_id), recs in itertools.groupby(
            found, key=lambda rec: (rec.address, rec.record_id)
        ):
            cache = self._id_cache(address) if self.persist_id_cache else None
            if cache is None:
                stale.append(record_id)
            else:
                # keys of earlier data dirs as this version keys them
                stale += cache.add_block([current_key(rec.key) for rec in recs], record_id)
        try:
            for record_id in stale:
                self.storage.delete_record(record_id)
        except StorageFull:
            log.warning("stale duplicate ids not deleted: storage full (deleted at a restart)")
        if found:
            log.info(
                "duplicate ids recovered",
                ids=sum(len(cache) for cache in self.duplicate_ids.values()),
                addresses=len(self.duplicate_ids),
                records_dropped=len(stale),
            )

    def _restore(
        self, rec: RecoveredMessage, by_id: dict[int, Any], fmt: MessageFormat
    ) -> list[MessageRef]:
        """A recovered message's refs, accounted for but not yet enqueued."""
        queues = [(by_id[qid], count) for qid, count in rec.queues.items() if qid in by_id]
        if not queues:
            return []
        data = rec.data
        if rec.large is not None:
            body = self.large_messages.recovered(*rec.large)
            if body is None:
                # deleted after its last acknowledgement, before the record's deletion
                # reached the journal (or never synced, so never accepted)
                log.warning(
                    "large message dropped: its body is missing or short",
                    message=rec.id,
                    body=self.large_messages.describe(rec.large[0]),
                )
                self.storage.acknowledge(rec.id, queues[0][0].id, True)
                return []
            body.acquire()
            data = LargeHead(rec.data, body)
        message = Message(
            rec.id,
            data,
            rec.address,
            fmt,
            durable=True,
            priority=rec.priority,
            expiration=rec.expiration,
        ).shared(len(queues), len(queues))
        address = self.addresses.get(rec.address)
        if address is not None:
            address.add_memory(len(rec.data))
        return [MessageRef(message, queue, count) for queue, count in queues]

    def commit_prepared(self, tx_id: int, on_done: Completion | None = None) -> None:
        """Decide a recovered prepared transaction: its messages appear, its acks apply."""
        tx = self.prepared.pop(tx_id)

        def finish() -> None:
            for ref in tx.held:
                ref.queue.enqueue(ref)
            for ref in tx.acks:
                ref.message.drop_stored_ref()
                ref.queue.remove_delivering(ref)
                self._release_memory(ref)
            if on_done is not None:
                on_done()

        self.storage.commit(tx_id, finish)

    def rollback_prepared(self, tx_id: int) -> None:
        """Undo a recovered prepared transaction: its acknowledged messages come back."""
        tx = self.prepared.pop(tx_id)
        self.storage.rollback(tx_id)
        for ref in tx.held:
            self._release_memory(ref)
        for ref in tx.acks:
            ref.queue.release(ref, delivered=False)

    # ------------------------------------------------------------------ introspection

    def stats(self, *, each: bool = True) -> dict[str, Any]:
        """Broker-wide figures, every queue's, and every address's (memory and paging),
        and those of plugins that registered some in `stats_sections`. Without `each`,
        "queues" and "address-stats" are left empty for the caller to fill from
        `queue.stats()` and `address_stats` (a few at a time, with many)."""
        if not each:
            return {**self._broker_stats(), "address-stats": {}, "queues": {}}
        return {
            **self._broker_stats(),
            "address-stats": {name: self.address_stats(a) for name, a in self.addresses.items()},
            "queues": {name: q.stats() for name, q in self.queues.items()},
        }

    def _broker_stats(self) -> dict[str, Any]:
        return {
            **self.limits.stats(),
            **{name: section() for name, section in self.stats_sections.items()},
            "connections": len(self.connections),
            "client-sockets": self.security.sockets,
            "max-client-sockets": self.security.max_sockets,
            "client-sockets-refused": self.security.sockets_refused,
            "addresses": len(self.addresses),
            "messages-routed": self.messages_routed,
            "messages-unrouted": self.messages_unrouted,
            "messages-expired": self.messages_expired,
            "messages-dead-lettered": self.messages_dead_lettered,
            "messages-duplicate": self.messages_duplicate,
            "commits-running": len(self.commits),
            "rollbacks-running": len(self.rollbacks),
            "rollback-slices": self.rollback_slices,
            "large-messages": self.large_messages.stats(),
        }

    def address_stats(self, address: AddressInfo) -> dict[str, Any]:
        """One address: memory held, paging state and figures, whether producers block."""
        policy = address.full_policy
        out: dict[str, Any] = {
            "routing-types": sorted(r.value for r in address.routing_types),
            "queues": sorted(address.queues),
            "memory-bytes": address.size,
            "messages-in-memory": address.message_count,
            "full": policy is not None and address.is_full(),
            "blocked": policy is not None and policy.blocks_producers(),
            "paging": False,
        }
        cache = self.duplicate_ids.get(address.name)
        out["duplicate-ids"] = len(cache) if cache is not None else 0
        if address.pager is not None:
            out.update(address.pager.stats())
        return out


def _confirming_resends(
    cache: DuplicateIdCache, key: bytes, resends: list[Completion], on_stored: Completion
) -> Completion:
    """`on_stored` of a message admitting `key` on its own, which also confirms the resends
    of it that arrived while it was not durable yet (`cache.pending[key]`)."""

    def stored() -> None:
        if cache.pending.get(key) is resends:
            del cache.pending[key]
        on_stored()
        for resent in resends:
            resent()

    return stored


def _place(
    routed: tuple[Message, list[Any], bool],
    address: AddressInfo,
    kept: list[tuple[Message, list[Any], AddressInfo]],
    paged: list[tuple[Message, list[Any], Any]],
) -> None:
    """Sort a routed message of a transaction: for its address's pages, or for memory."""
    message, queues, full = routed
    pager = address.pager
    if pager is not None and (full or pager.paging):
        paged.append((message, queues, pager))
    else:
        kept.append((message, queues, address))


#: What became of a failed delivery (`Broker._count_attempt`).
_GONE, _NOW, _LATER = range(3)


def _note_new_id(
    cache: DuplicateIdCache, address_name: str, key: bytes, seen: set[tuple[str, bytes]]
) -> None:
    """Note a commit's duplicate id `key` for `address_name` in `seen`; DuplicateMessage
    when its address's `cache` admitted it before or an earlier send of the commit
    carries it (`seen`)."""
    if key in cache or (address_name, key) in seen:
        raise duplicate_error(key, address_name)
    seen.add((address_name, key))


def _takes_packs(address: AddressInfo, routing_type: RoutingType | None) -> bool:
    """Whether a pack sent to `address` (`Transaction.packed`) goes whole now: it has
    queues, each takes packs and none filters, routing it creates none (a queue
    auto-created for it takes messages), and it does not page (its pages take messages)."""
    queues = [*address.anycast, *address.multicast]
    pager = address.pager
    creates_queue = (
        not address.anycast
        and routing_type is not _MULTICAST
        and _ANYCAST in address.routing_types
        and address.settings.auto_create_queues
    )
    return (
        bool(queues)
        and not creates_queue
        and len(address.anycast) <= 1  # else its rows would take turns among them
        and all(getattr(q, "takes_packs", False) and q.filter is None for q in queues)
        and not (pager is not None and pager.paging)
        and not (address.full_policy is not None and address.is_full())
    )


def _large_bodies(tx: Transaction) -> list[Any]:
    """The files of the large messages a transaction sends (it holds each)."""
    return [body for send in tx.sends if (body := large_body(send[0])) is not None]


def _after_files(bodies: list[Any], on_done: Completion) -> Completion:
    """`on_done`, held back until every file in `bodies` is synced (large-message-sync)."""
    barrier = _Barrier()
    for body in bodies:
        body.when_synced(barrier.add())
    done = barrier.add()
    barrier.arm(on_done)
    return done


def _enqueue(visible: list[tuple[Message, list[Any]]], start: int, end: int) -> None:
    for message, queues in visible[start:end]:
        for queue in queues:
            queue.enqueue(message)


class _Rollback:
    """`Broker.rollback` of `acks` (in id order): COMMIT_SLICE per pass of the loop, each
    slice put back once its delivery counts are durable; `on_done` once all are. Kept in
    `Broker.rollbacks` while slices are left (`Broker.finish_rollbacks`)."""

    __slots__ = ("acks", "back", "broker", "handle", "on_done", "start")

    def __init__(self, broker: Broker, acks: list[MessageRef], on_done: Completion | None) -> None:
        self.broker = broker
        self.acks = acks
        self.on_done = on_done
        self.start = 0
        self.back = _Barrier()
        #: The next slice, scheduled on the loop (None: it runs now, or none is left).
        self.handle: asyncio.Handle | None = None

    def step(self) -> None:
        """Roll back a slice; the next one at the next pass of the loop."""
        self.handle = None  # the handle holds this method: no cycle is left behind
        if self._slice():
            self.handle = asyncio.get_running_loop().call_soon(self.step)
            self.broker.rollbacks.add(self)

    def finish(self) -> None:
        """Roll back every slice left now."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        while self._slice():
            pass

    def _slice(self) -> bool:
        """Roll back the next slice; whether slices are left (else it is done)."""
        broker = self.broker
        end = self.start + COMMIT_SLICE
        broker._roll_back(self.acks[self.start : end], self.back.add())
        broker.rollback_slices += 1
        self.start = end
        if end < len(self.acks):
            return True
        broker.rollbacks.discard(self)
        self.back.arm(self.on_done or _nothing)
        return False


def _nothing() -> None:
    pass


class _Taken:
    """What a commit has journaled so far, undone together if storage refuses the rest."""

    __slots__ = ("acks", "journaled", "stored", "visible")

    def __init__(self) -> None:
        #: messages journaled and accounted for, with their address
        self.stored: list[tuple[Message, AddressInfo]] = []
        #: what the commit makes visible: each message (shared) and its queues
        self.visible: list[tuple[Message, list[Any]]] = []
        #: acknowledgements journaled
        self.acks: list[MessageRef] = []
        #: whether anything was written, so that there is a commit record to write
        self.journaled = False


class _SlicedCommit:
    """A large transaction's commit, a slice per pass of the event loop (`Broker.commit`
    with `on_failed`).

    Its messages are routed and journaled within the transaction COMMIT_SLICE at a time,
    then its acknowledgements; then, in one pass, its paged messages and duplicate ids,
    and the commit record, written once. Until that record is durable nothing of it is
    visible or acknowledged, and the journal's transaction makes it atomic: a crash
    before the record is on disk leaves none of it after recovery, one after leaves all
    of it. Its messages then become visible a slice per pass (a consumer may get the
    first before the last is in its queue), and `on_done` runs once all are. It is kept
    in `Broker.commits` until then (or until it failed), for `Broker.finish_commits`.
    """

    def __init__(
        self,
        broker: Broker,
        tx: Transaction,
        on_done: Completion,
        on_failed: Callable[[BrokerError], None],
    ) -> None:
        self.broker = broker
        self.tx = tx
        self.bodies = _large_bodies(tx)
        self.on_done = _after_files(self.bodies, on_done) if self.bodies else on_done
        self.on_failed = on_failed
        self.loop = asyncio.get_running_loop()
        self.taken = _Taken()
        self.ids: list[tuple[DuplicateIdCache, str, bytes]] = []
        self.seen: set[tuple[str, bytes]] = set()
        self.paged: list[tuple[Message, list[Any], Any]] = []
        #: messages routed (counted in `messages_routed`), sends and acks done
        self.routed = 0
        self.sent = 0
        self.acked = 0
        #: The next slice, scheduled on the loop (None: it runs now, none is left, or the
        #: commit record's sync is awaited).
        self.handle: asyncio.Handle | None = None
        #: Once it is committed (its record durable): its messages (enqueued up to
        #: `enqueued`) and what runs once all are.
        self.committed = False
        self.visible: list[tuple[Message, list[Any]]] = []
        self.enqueued = 0
        self.then: Callable[[], None] = _nothing
        #: Shutdown (`finish`): its messages are enqueued in one go.
        self.at_once = False
        #: Done once it is over (committed and enqueued, or failed).
        self.over: asyncio.Future[None] = self.loop.create_future()

    def start(self) -> None:
        self.broker.commits.add(self)
        self.handle = self.loop.call_soon(self._step)

    def finish(self) -> None:
        """Shutdown (`Broker.finish_commits`): undone if it is still journaling its
        slices, else its messages are enqueued at once (when its commit record is durable:
        `over` is done then)."""
        self.at_once = True
        if self.handle is None:
            return  # its commit record's sync is awaited: `_enqueue` comes after it
        self.handle.cancel()
        self.handle = None
        if not self.committed:
            self._fail(BrokerError(f"transaction {self.tx.id}: not committed: broker stopping"))
        else:
            self._enqueue_slice()

    def _step(self) -> None:
        self.handle = None  # the handle holds this method: no cycle is left behind
        tx = self.tx
        try:
            if self.sent < len(tx.sends):
                self._route_slice()
            elif self.acked < len(tx.acks):
                acks = tx.acks[self.acked : self.acked + COMMIT_SLICE]
                self.broker._store_acks(tx, acks, self.taken)
                self.acked += len(acks)
            else:
                self._last()
                return
        except BrokerError as exc:
            self._fail(exc)
            return
        except Exception as exc:  # a bug: the client must still get an outcome
            log.exception("transaction commit failed", tx=tx.id)
            self._fail(BrokerError(f"transaction {tx.id}: commit failed: {exc!r}"))
            return
        self.handle = self.loop.call_soon(self._step)

    def _route_slice(self) -> None:
        """Route and journal the next sends that weigh COMMIT_SLICE messages (a pack
        weighs its rows), one at least."""
        tx = self.tx
        start = end = self.sent
        weight = 0
        while end < len(tx.sends) and weight < COMMIT_SLICE:
            pack = tx.packed.get(end)
            weight += 1 if pack is None else pack.rows
            end += 1
        kept: list[tuple[Message, list[Any], AddressInfo]] = []
        ids, routed = self.broker._route_sends(tx, start, end, self.seen, kept, self.paged)
        self.ids += ids
        self.routed += routed
        self.sent = end
        self.broker._store_kept(tx, kept, self.taken)

    def _last(self) -> None:
        broker = self.broker
        for cache, address_name, key in self.ids:  # admitted by another since its slice
            if key in cache:
                raise duplicate_error(key, address_name)
        admitted = broker._store_last(self.tx, self.ids, self.paged, self.taken)
        broker._commit_stored(
            self.tx, self.on_done, admitted, self.paged, self.taken, self._enqueue
        )
        for body in self.bodies:  # its messages hold their files now (`_store`, the pages)
            body.release()

    def _enqueue(self, visible: list[tuple[Message, list[Any]]], then: Callable[[], None]) -> None:
        """Make the committed `visible` messages visible, then run `then`."""
        self.committed = True
        self.visible, self.then = visible, then
        self._enqueue_slice()

    def _enqueue_slice(self) -> None:
        """Enqueue the next COMMIT_SLICE messages (all that are left: `at_once`)."""
        self.handle = None
        start, visible = self.enqueued, self.visible
        end = len(visible) if self.at_once else start + COMMIT_SLICE
        _enqueue(visible, start, end)
        self.enqueued = end
        if end < len(visible):
            self.handle = self.loop.call_soon(self._enqueue_slice)
            return
        self._end()
        self.then()

    def _fail(self, error: BrokerError) -> None:
        taken = self.taken
        self._end()
        self.broker._abandon_commit(self.tx, taken.stored, taken.acks, self.routed)
        self.on_failed(error)

    def _end(self) -> None:
        self.broker.commits.discard(self)
        self.over.set_result(None)


class _Barrier:
    """Runs a function once every completion it handed out has been called."""

    __slots__ = ("_armed", "_pending", "_then")

    def __init__(self) -> None:
        self._pending = 0
        self._armed = False
        self._then: Callable[[], None] | None = None

    def add(self) -> Completion:
        self._pending += 1
        return self._done

    def _done(self) -> None:
        self._pending -= 1
        if self._armed and self._pending == 0 and self._then is not None:
            then, self._then = self._then, None
            then()

    def arm(self, then: Callable[[], None]) -> bool:
        """Run `then` once all are done; True when that was at once (nothing pending)."""
        self._armed = True
        if self._pending == 0:
            then()
            return True
        self._then = then
        return False


def _expiration(ttl: int, settings: AddressSettings) -> int:
    """Absolute expiry (ms) from the message TTL and the address's expiry-delay limits."""
    if ttl <= 0:
        if settings.expiry_delay < 0:
            return 0
        ttl = settings.expiry_delay
    if settings.min_expiry_delay >= 0:
        ttl = max(ttl, settings.min_expiry_delay)
    if settings.max_expiry_delay >= 0:
        ttl = min(ttl, settings.max_expiry_delay)
    return now_ms() + ttl if ttl > 0 else 0


def _subscription_queue_name(
    durable: bool, shared: bool, global_: bool, subscription: str | None, client_id: str
) -> str | None:
    if not subscription or not (durable or shared):
        return None
    if shared and global_:
        return subscription
    return f"{client_id}.{subscription}" if client_id else subscription


def _queue_description(spec: QueueSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "address": spec.address,
        "routing-type": spec.routing_type.value,
        "filter": spec.filter,
        "auto-created": spec.auto_created,
        "queue-type": spec.queue_type,
        "max-consumers": spec.max_consumers,
        "exclusive": spec.exclusive,
        "non-destructive": spec.non_destructive,
        "arguments": dict(spec.arguments),
    }


def _queue_spec(description: dict[str, Any]) -> QueueSpec:
    return QueueSpec(
        description["name"],
        description["address"],
        RoutingType(description["routing-type"]),
        filter=description.get("filter"),
        auto_created=description.get("auto-created", False),
        queue_type=description.get("queue-type", "standard"),
        max_consumers=description.get("max-consumers", -1),
        exclusive=description.get("exclusive", False),
        non_destructive=description.get("non-destructive", False),
        arguments=tuple(description.get("arguments", {}).items()),
    )
