"""Scow's public plugin API: everything a plugin may import, from this one module.

A plugin (built-in or third-party) imports only names listed in `__all__`; every other
module under `scow.core` is private and may change between releases. The hook API
itself carries a version (`HOOK_API_VERSION`); a plugin declares the range it works with
in a module attribute, e.g. `SCOW_HOOK_API = ">=1.0,<2"`, and a broker whose version
falls outside it refuses to start, naming both. `docs/plugins.md` is the guide.
"""

from __future__ import annotations

from typing import Any

import pluggy

from scow.core.broker import Broker, Transaction
from scow.core.config import Config, ConfigSection, Setting, parse_host_port
from scow.core.descriptors import (
    FullPolicyType,
    JournalBackend,
    LargeMessageStoreBackend,
    PageStoreBackend,
    ProtocolType,
    QueueType,
    StreamStoreBackend,
)
from scow.core.hookspecs import HOOK_API_VERSION
from scow.core.interfaces import (
    Completion,
    Consumer,
    Cursor,
    FullPolicy,
    Journal,
    LoadResult,
    Pager,
    PageStore,
    PreparedTransaction,
    ProtocolServer,
    Queue,
    RecordInfo,
    Service,
    StreamAppended,
    StreamContents,
    StreamRecord,
    StreamSegment,
    StreamStore,
)
from scow.core.large_messages import (
    DEFAULT_MIN_LARGE_MESSAGE_SIZE,
    Arrival,
    LargeBody,
    LargeHead,
    LargeMessageStore,
    with_body,
)
from scow.core.management import ManagementOperation
from scow.core.message import Entry, Message, MessageFormat, MessageRef
from scow.core.model import (
    AddressInfo,
    BrokerError,
    ConnectionInfo,
    InvalidField,
    NotAllowed,
    NotFound,
    QueueSpec,
    ResourceLimitExceeded,
    ResourceLocked,
    RouteStatus,
    RoutingType,
    Unauthorized,
    host_port,
    remote_of,
)
from scow.core.page_frames import frame_all, iter_frames, valid_length
from scow.core.security import PERMISSIONS, Principal

#: Marks a function as a Scow hook implementation.
hookimpl = pluggy.HookimplMarker("scow")


def version() -> str:
    """The installed Scow's version ("unknown" when it runs from sources not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("scow")
    except PackageNotFoundError:
        return "unknown"


def __getattr__(name: str) -> Any:
    # the CLI module imports the app, which imports this module: load it on first use
    if name == "command_group":
        from scow.core.cli import command_group

        return command_group
    raise AttributeError(f"module 'scow.core' has no attribute {name!r}")


__all__ = [
    "DEFAULT_MIN_LARGE_MESSAGE_SIZE",
    "HOOK_API_VERSION",
    "PERMISSIONS",
    "AddressInfo",
    "Arrival",
    "Broker",
    "BrokerError",
    "Completion",
    "Config",
    "ConfigSection",
    "ConnectionInfo",
    "Consumer",
    "Cursor",
    "Entry",
    "FullPolicy",
    "FullPolicyType",
    "InvalidField",
    "Journal",
    "JournalBackend",
    "LargeBody",
    "LargeHead",
    "LargeMessageStore",
    "LargeMessageStoreBackend",
    "LoadResult",
    "ManagementOperation",
    "Message",
    "MessageFormat",
    "MessageRef",
    "NotAllowed",
    "NotFound",
    "PageStore",
    "PageStoreBackend",
    "Pager",
    "PreparedTransaction",
    "Principal",
    "ProtocolServer",
    "ProtocolType",
    "Queue",
    "QueueSpec",
    "QueueType",
    "RecordInfo",
    "ResourceLimitExceeded",
    "ResourceLocked",
    "RouteStatus",
    "RoutingType",
    "Service",
    "Setting",
    "StreamAppended",
    "StreamContents",
    "StreamRecord",
    "StreamSegment",
    "StreamStore",
    "StreamStoreBackend",
    "Transaction",
    "Unauthorized",
    "command_group",
    "frame_all",
    "hookimpl",
    "host_port",
    "iter_frames",
    "parse_host_port",
    "remote_of",
    "valid_length",
    "version",
    "with_body",
]
