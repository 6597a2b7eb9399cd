"""structlog set-up: readable console lines by default, JSON lines on request."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, TextIO, cast

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _Stderr:
    """`sys.stderr` as it is when a line is written, not when logging was configured: a
    program that runs `scow` commands in-process (a test runner capturing output) may
    replace and close the one that was current then.

    A log whose reader went away (`scow run 2>&1 | tee broker.log`, and tee ended; the
    terminal closed) costs its lines, never the broker: the write error (EPIPE, EIO) would
    otherwise surface in whatever the broker was doing when it logged. The lines after it
    are dropped."""

    lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return sys.stderr.write(text)
            except OSError:
                self.lost = True
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                sys.stderr.flush()
            except OSError:
                self.lost = True


def configure(log_format: str = "console", level: str = "info") -> None:
    renderer: structlog.typing.Processor
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(cast(TextIO, _Stderr())),
        cache_logger_on_first_use=False,
    )


AUDIT_LOGGER = "scow.audit"


def audit_logger(path: str | Path | None) -> Any:
    """The audit stream: JSON lines appended to `path`, kept apart from the broker's log
    whatever `configure` set; without a path, the broker's log under `scow.audit`."""
    if not path:
        return structlog.get_logger(AUDIT_LOGGER)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    out = open(target, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives with the broker
    return structlog.wrap_logger(
        structlog.PrintLogger(out),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        logger_name=AUDIT_LOGGER,
    )
