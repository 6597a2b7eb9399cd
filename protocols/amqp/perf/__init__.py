"""`scow perf client` and `scow perf sink`: an AMQP 1.0 load generator and a trivial peer."""

from __future__ import annotations

from scow.protocols.amqp.perf.client import (
    PerfError,
    add_commands,
    id_offset,
    make_message,
    parse_url,
    percentiles,
    run_client,
    stamp_offset,
)

__all__ = [
    "PerfError",
    "add_commands",
    "id_offset",
    "make_message",
    "parse_url",
    "percentiles",
    "run_client",
    "stamp_offset",
]
