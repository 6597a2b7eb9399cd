"""Scow's kernel: what a plugin author needs, re-exported from one place."""

from __future__ import annotations

import pluggy

from scow.core.descriptors import (
    FullPolicyType,
    JournalBackend,
    PageStoreBackend,
    ProtocolType,
    QueueType,
)
from scow.core.interfaces import (
    Consumer,
    FullPolicy,
    Journal,
    LoadResult,
    PageStore,
    PreparedTransaction,
    ProtocolServer,
    Queue,
    RecordInfo,
    Service,
)
from scow.core.message import Message, MessageFormat, MessageRef
from scow.core.model import QueueSpec, RoutingType

#: Marks a function as a Scow hook implementation.
hookimpl = pluggy.HookimplMarker("scow")

__all__ = [
    "Consumer",
    "FullPolicy",
    "FullPolicyType",
    "Journal",
    "JournalBackend",
    "LoadResult",
    "Message",
    "MessageFormat",
    "MessageRef",
    "PageStore",
    "PageStoreBackend",
    "PreparedTransaction",
    "ProtocolServer",
    "ProtocolType",
    "Queue",
    "QueueSpec",
    "QueueType",
    "RecordInfo",
    "RoutingType",
    "Service",
    "hookimpl",
]
