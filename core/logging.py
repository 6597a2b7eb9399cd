"""structlog set-up: readable console lines by default, JSON lines on request."""

from __future__ import annotations

import logging
import sys
import threading
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


class _Background:
    """Log lines handed to a thread of their own, which writes them to `_Stderr`: a log
    reader that stalls (`scow run 2>&1 | less`, paused; a log shipper behind) blocks that
    thread, never the broker's event loop. While lines wait, those past `MAX_WAITING`
    bytes are dropped, and a line saying how many follows the ones written before them."""

    #: Bytes of lines that may wait for a stalled reader.
    MAX_WAITING = 1 << 20

    def __init__(self) -> None:
        self._out = _Stderr()
        self._cond = threading.Condition()
        self._lines: list[str] = []
        self._waiting = 0  # bytes in `_lines` and in the write under way
        self._dropped = 0
        threading.Thread(target=self._run, name="log writer", daemon=True).start()

    def write(self, text: str) -> int:
        with self._cond:
            if self._waiting + len(text) > self.MAX_WAITING:
                self._dropped += 1
            else:
                self._lines.append(text)
                self._waiting += len(text)
                self._cond.notify_all()
        return len(text)

    def flush(self) -> None:
        """Nothing to do here: the writer flushes what it writes."""

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` s until every line taken is written; False if the reader
        did not take them in time."""
        with self._cond:
            return self._cond.wait_for(lambda: self._waiting == 0, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._lines)
                lines, self._lines = self._lines, []
                dropped, self._dropped = self._dropped, 0
            text = "".join(lines)
            if dropped:
                text += f"scow: {dropped} log lines dropped: the log's reader did not keep up\n"
            self._out.write(text)
            self._out.flush()
            with self._cond:
                self._waiting -= sum(map(len, lines))
                self._cond.notify_all()


#: The sink `configure(background=True)` installed, if any.
_background: _Background | None = None


def drain(timeout: float = 5.0) -> None:
    """Before the process ends: let the log writer write what waits (at most `timeout` s
    of a stalled reader)."""
    if _background is not None:
        _background.drain(timeout)


def configure(
    log_format: str = "console", level: str = "info", *, background: bool = False
) -> None:
    """structlog for this process; `background`: lines written by a thread of their own
    (`scow run`: a stalled log reader must not stall the broker)."""
    global _background
    renderer: structlog.typing.Processor
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    if background and _background is None:
        _background = _Background()
    sink: _Stderr | _Background = _background if background and _background else _Stderr()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        # one write per line (`print` writes the text and its newline apart)
        logger_factory=structlog.WriteLoggerFactory(cast(TextIO, sink)),
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
