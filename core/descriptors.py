"""Frozen descriptors that registration hooks return.

A descriptor names a backend and carries the factory that builds it. Hooks run once at
startup; the objects the factories build are what the hot path calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.interfaces import (
        FullPolicy,
        Journal,
        PageStore,
        ProtocolServer,
        Queue,
        StreamStore,
    )
    from scow.core.large_messages import LargeMessageStore
    from scow.core.message import MessageFormat
    from scow.core.model import AddressInfo, QueueSpec


@dataclass(frozen=True)
class QueueType:
    """A kind of queue (standard FIFO, priority, last-value, ...).

    Queues are declared with arguments (config, attach, management); the broker picks
    the type whose `selected_by` arguments are present (or the one `x-queue-type`
    names), refuses arguments of two types together and arguments the type does not
    list in `arguments`, then lets `check` normalize them (ValueError saying what is
    accepted) before `factory` builds the queue from `spec.arguments`.
    """

    name: str
    factory: Callable[[QueueSpec, Broker], Queue]
    doc: str = ""
    #: Arguments whose presence makes a queue of this type (e.g. "qpid.priorities").
    selected_by: tuple[str, ...] = ()
    #: Every argument the type accepts, with what it means.
    arguments: Mapping[str, str] = field(default_factory=dict)
    check: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class JournalBackend:
    """A journal implementation, chosen by `[broker] journal`.

    `factory(directory, kind, settings)` builds one journal; `kind` is "bindings" or
    "messages"; `settings` is the backend's own validated config section (may be empty).
    """

    name: str
    factory: Callable[[Path, str, Mapping[str, Any]], Journal]
    doc: str = ""
    #: False for backends that keep nothing across restarts (the in-memory journal).
    persistent: bool = True
    #: The config section whose validated values the factory receives, if any.
    config_section: str | None = None
    #: For HA over a store shared beyond the data dir (a database):
    #: `store_lock(data_dir, settings)` builds its `scow.core.ha.StoreLock`. None: the
    #: data dir's lock is the store's (the file journal).
    store_lock: Callable[[Path, Mapping[str, Any]], Any] | None = None
    #: `discard(data_dir, settings)` empties a stopped broker's journals, and the rest of
    #: the store they live in (a database's every table): how a `scow data import` that
    #: failed or was cut short leaves its target as it found it. None: nothing to empty.
    discard: Callable[[Path, Mapping[str, Any]], None] | None = None


@dataclass(frozen=True)
class PageStoreBackend:
    """Storage for the pages of paged addresses, chosen by `[paging] store`.

    `factory(directory, address, settings)` opens (creating if needed) the store of one
    address under `directory` (the paging directory); `discover(directory, settings)` lists
    the addresses that have a store there, for recovery. `settings` is the backend's own
    validated config section (may be empty) plus `"data-dir"`, the broker's data dir.
    """

    name: str
    factory: Callable[[Path, str, Mapping[str, Any]], PageStore]
    discover: Callable[[Path, Mapping[str, Any]], list[str]]
    doc: str = ""
    #: The config section whose validated values the factory receives, if any.
    config_section: str | None = None
    #: `max_page_size(settings)`: the largest page the store takes, capping every
    #: address's page-size-bytes (Artemis's jdbc-max-page-size-bytes); None: no cap.
    max_page_size: Callable[[Mapping[str, Any]], int] | None = None


@dataclass(frozen=True)
class StreamStoreBackend:
    """Storage for stream queues (the spark plugin's), chosen by `[spark] stream-store`.

    `factory(data_dir, stream, segment_bytes, settings)` builds (without opening) the
    store of one stream: segments of about `segment_bytes`; `settings` is the backend's
    own validated config section (may be empty). By default a broker keeps its streams
    in the store its journal uses: the backend named like `[broker] journal`.
    """

    name: str
    factory: Callable[[Path, str, int, Mapping[str, Any]], StreamStore]
    doc: str = ""
    #: The config section whose validated values the factory receives, if any.
    config_section: str | None = None
    #: `discard(data_dir, settings)` removes every stream of a stopped broker (see
    #: `JournalBackend.discard`); None: nothing to empty.
    discard: Callable[[Path, Mapping[str, Any]], None] | None = None


@dataclass(frozen=True)
class LargeMessageStoreBackend:
    """Where large messages' bodies live, beside the journal of the same name.

    `factory(data_dir, settings, sync)` builds (without opening: `open` runs off the
    event loop before recovery) the store of one broker; `settings` is the backend's own
    validated config section (may be empty); `sync` is `[broker] large-message-sync` (false
    for a broker without persistence). A broker keeps its bodies in the store named like
    `[broker] journal`, else in files (`scow.core.large_message_files`): bodies go where
    the records that refer to them go, so that a failover or a restore finds both.
    """

    name: str
    factory: Callable[[Path, Mapping[str, Any], bool], LargeMessageStore]
    doc: str = ""
    #: The config section whose validated values the factory receives, if any.
    config_section: str | None = None


@dataclass(frozen=True)
class FullPolicyType:
    """What an address does once full: PAGE, DROP, FAIL, BLOCK, ..."""

    name: str
    #: factory(address, broker); a policy that pages also sets `address.pager`.
    factory: Callable[[AddressInfo, Broker], FullPolicy]
    doc: str = ""


@dataclass(frozen=True)
class ProtocolType:
    """A wire protocol the broker can listen for."""

    name: str
    factory: Callable[[Broker, Mapping[str, Any]], ProtocolServer]
    doc: str = ""
    #: How this protocol's messages are read; used to restore them from the journal.
    message_format: MessageFormat | None = None
