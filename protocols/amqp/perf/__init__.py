"""`scow perf client` and `scow perf sink`: an AMQP 1.0 load generator and a trivial peer.

`client` is the load generator, `summary` its figures, `sink` the peer, `wire` the socket
and engine glue both use, `messages` the test messages and `commands` the command line.
"""

from __future__ import annotations

from scow.protocols.amqp.perf.client import parse_url, run_client
from scow.protocols.amqp.perf.commands import add_commands
from scow.protocols.amqp.perf.errors import PerfError
from scow.protocols.amqp.perf.messages import make_message, stamp_offset
from scow.protocols.amqp.perf.summary import percentiles

__all__ = [
    "PerfError",
    "add_commands",
    "make_message",
    "parse_url",
    "percentiles",
    "run_client",
    "stamp_offset",
]
