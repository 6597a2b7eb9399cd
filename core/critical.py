"""Storage that fails for good, and what the broker does then.

A journal whose writes meet an error that does not pass (EIO, its directory removed under
it, a bug) can store nothing more, and cannot even say so to what it was already given:
producers would wait for outcomes that never come, and every acknowledgement would fail.
A broker must not serve on like that. Artemis stops on such a critical IO error; `scow run`
ends at once with `EXIT_STORAGE_FAILED`, as if killed: the journal is built to recover from
exactly that, clients see their connections drop and send again what was not confirmed,
and a supervisor (systemd's `Restart=on-failure`) or an HA backup takes over.

Storage calls `storage_failed` from whatever thread met the error. It logs, then calls the
handler the process installed (`scow run`: `halt`); with none (a broker embedded in another
program, the tests' in-process brokers) the embedding program decides.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

import structlog

from scow.core import logging as scow_logging

#: `scow run`'s exit status after a storage failure (sysexits' EX_IOERR).
EXIT_STORAGE_FAILED = 74

_handler: Callable[[], None] | None = None


def on_storage_failure(handler: Callable[[], None] | None) -> None:
    """What `storage_failed` does after logging (None: nothing)."""
    global _handler
    _handler = handler


def storage_failed(what: str, error: BaseException) -> None:
    """`what` (e.g. "journal /data/journal") can store nothing more because of `error`."""
    structlog.get_logger().critical(
        "storage failed; the broker cannot go on", storage=what, error=repr(error)
    )
    if _handler is not None:
        _handler()


def halt(status: int = EXIT_STORAGE_FAILED) -> None:
    """End the process now, with `status`, as a crash would (nothing more is written:
    what is on disk is what the next start recovers)."""
    scow_logging.drain(1.0)  # the log's last lines, this failure's among them
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a log reader gone, a closed stream
            stream.flush()
    os._exit(status)
