"""Every hook a Scow plugin can implement, in the order the broker calls them.

Hooks run at startup, per connection and at shutdown; never per message. Implementations
must be plain functions (the plugin manager rejects coroutines): long-running work goes
into a `Service` returned from `scow_services`.

The hook API is versioned (`HOOK_API_VERSION`, major.minor): a new hook or a new
optional descriptor field raises the minor version, a changed or removed one the major.
A plugin declares the versions it works with in a module attribute,
`SCOW_HOOK_API = ">=1.0,<2"`, and is refused at startup outside that range.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.config import Config, ConfigSection
    from scow.core.descriptors import (
        FullPolicyType,
        JournalBackend,
        LargeMessageStoreBackend,
        PageStoreBackend,
        ProtocolType,
        QueueType,
        StreamStoreBackend,
    )
    from scow.core.interfaces import Service
    from scow.core.management import ManagementOperation
    from scow.core.model import ConnectionInfo

#: The version of the hooks below and of what they take and return (see the module doc).
HOOK_API_VERSION = "1.1"

hookspec = pluggy.HookspecMarker("scow")

# --------------------------------------------------------------------------- configuration


@hookspec
def scow_config_sections() -> list[ConfigSection]:
    """The config sections this plugin owns, so `[name]` tables validate against them.

    Called once, before the config file is read. Results are concatenated; two plugins
    declaring the same section stop startup.
    """
    raise NotImplementedError


@hookspec
def scow_add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add sub-commands to the `scow` command line (e.g. `scow data ...`).

    Called once when the CLI starts, for every *installed* plugin (commands are tools,
    available whether or not a config enables the plugin). A command sets its handler with
    `parser.set_defaults(handler=fn)`; `fn(args) -> int` returns the exit status.
    """
    raise NotImplementedError


# --------------------------------------------------------------------------- registration


@hookspec
def scow_register_queue_types() -> list[QueueType]:
    """Queue types this plugin provides. Results are concatenated; names must be unique."""
    raise NotImplementedError


@hookspec
def scow_register_journals() -> list[JournalBackend]:
    """Journal backends this plugin provides. Results are concatenated."""
    raise NotImplementedError


@hookspec
def scow_register_page_stores() -> list[PageStoreBackend]:
    """Page store backends this plugin provides. Results are concatenated."""
    raise NotImplementedError


@hookspec
def scow_register_stream_stores() -> list[StreamStoreBackend]:
    """Stream store backends this plugin provides (where stream queues keep their
    records). Results are concatenated; names must be unique."""
    raise NotImplementedError


@hookspec
def scow_register_large_message_stores() -> list[LargeMessageStoreBackend]:
    """Large message stores this plugin provides (where the bodies of large messages go
    when `[broker] journal` names the store). Results are concatenated; names must be
    unique."""
    raise NotImplementedError


@hookspec
def scow_register_full_policies() -> list[FullPolicyType]:
    """Address-full policies (PAGE, DROP, FAIL, BLOCK, ...). Results are concatenated."""
    raise NotImplementedError


@hookspec
def scow_register_protocols() -> list[ProtocolType]:
    """Wire protocols this plugin serves. Results are concatenated."""
    raise NotImplementedError


@hookspec
def scow_management_operations(broker: Broker) -> dict[str, dict[str, ManagementOperation]]:
    """Management operations this plugin adds: per managed type (e.g. "stream"), per
    operation name (upper case, e.g. "READ"), a function (name, body, properties) ->
    (statusCode, statusDescription, body) as `scow.core.management.ManagementOperation`,
    or an awaitable of it for an operation that hands the loop back while it works (the
    reply is sent when it is done).

    Called once per management client (AMQP `$management` link). Results are merged; a
    plugin may add operations to a built-in type but not replace one.
    """
    raise NotImplementedError


# --------------------------------------------------------------------------- lifecycle


@hookspec
def scow_configure(config: Config) -> None:
    """Called once with the validated config, after registration, before the broker starts."""


@hookspec
def scow_services(broker: Broker) -> list[Service]:
    """Background services to run with the broker (started in order, stopped in reverse).

    Called once after the broker recovered its storage, before protocols listen.
    Results are concatenated.
    """
    raise NotImplementedError


@hookspec
def scow_broker_started(broker: Broker) -> None:
    """Called once every protocol listens and every service runs."""


@hookspec
def scow_connection_opened(info: ConnectionInfo) -> None:
    """Called when a client connection is open (after authentication). Per connection."""


@hookspec
def scow_connection_closed(info: ConnectionInfo) -> None:
    """Called when a client connection has gone, for whatever reason. Per connection."""


@hookspec
def scow_broker_stopping(broker: Broker) -> None:
    """Called once at shutdown, before services and protocols stop."""
