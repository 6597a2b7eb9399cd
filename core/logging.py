"""structlog set-up: readable console lines by default, JSON lines on request.

`scow run`'s log is the process's: what the libraries it runs on log through Python's
`logging` (asyncio, aiohttp, proton) becomes a structlog line too, in the same format and
through the same writer (see `configure`)."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, cast

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


#: Whether debug lines are written: `configure`'s level (structlog unconfigured writes
#: every line). A debug line on a per-message path is skipped whole when they are not,
#: since even a filtered call through structlog's lazy logger costs about 2 us.
_debug = True


def debug_enabled() -> bool:
    """Whether a debug line would be written (see `_debug`)."""
    return _debug


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
        #: The line saying how many were dropped, in the log's format (`configure`).
        self.dropped_line: Callable[[int], str] = _console_dropped
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
                text += self.dropped_line(dropped)
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


_DROPPED = "log lines dropped: the log's reader did not keep up"


def _console_dropped(count: int) -> str:
    return f"scow: {count} {_DROPPED}\n"


#: The log lines' time stamp, for the line the writer adds itself.
_STAMP = structlog.processors.TimeStamper(fmt="iso", utc=True)


def _json_dropped(count: int) -> str:
    line = _STAMP(None, "", {"dropped": count, "event": _DROPPED, "level": "warning"})
    return json.dumps(line) + "\n"


class _ToStructlog(logging.Handler):
    """A record of Python's `logging` as a structlog line (its logger's name under
    `logger`), so that it has the log's format and goes through its writer."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            structlog.get_logger().log(
                record.levelno,
                record.getMessage(),
                logger=record.name,
                **({"exc_info": record.exc_info} if record.exc_info else {}),
            )
        except Exception:
            self.handleError(record)


def _thread_died(args: threading.ExceptHookArgs) -> None:
    """An exception no code of a thread caught: a bug, said in the log's format."""
    if args.exc_type is SystemExit:
        return
    thread = args.thread.name if args.thread is not None else "?"
    exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
    log = structlog.get_logger()
    log.critical("a thread died of an exception", thread=thread, exc_info=exc_info)


def _uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    """The exception that ends the process, said in the log's format and written out
    before it ends (the writer's thread would not outlive it)."""
    exc_info = (exc_type, exc, tb)
    structlog.get_logger().critical("the process ends on an exception", exc_info=exc_info)
    drain()


def configure(
    log_format: str = "console", level: str = "info", *, background: bool = False
) -> None:
    """structlog for this process. `background` (`scow run`: the log is the process's):
    lines are written by a thread of their own, since a stalled log reader must not stall
    the broker, and Python's `logging` records and uncaught exceptions (of the process,
    of a thread) become structlog lines."""
    global _background, _debug
    _debug = LEVELS[level] <= logging.DEBUG
    renderer: list[structlog.typing.Processor]
    if log_format == "json":  # a traceback as the string "exception", not exc_info=true
        renderer = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        renderer = [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    if background and _background is None:
        _background = _Background()
    sink: _Stderr | _Background = _background if background and _background else _Stderr()
    if background:
        assert _background is not None
        _background.dropped_line = _json_dropped if log_format == "json" else _console_dropped
        root = logging.getLogger()
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        root.addHandler(_ToStructlog())
        root.setLevel(LEVELS[level])
        threading.excepthook = _thread_died
        sys.excepthook = _uncaught
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _STAMP,
            *renderer,
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
