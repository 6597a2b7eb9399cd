"""The JSON log: a traceback is a string in its line, and the writer's own notice is JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import structlog

from scow.core import logging as scow_logging


@pytest.fixture
def json_log() -> Iterator[None]:
    scow_logging.configure("json")
    yield
    scow_logging.configure("console")


def test_an_error_with_its_exception_is_one_json_line_carrying_the_traceback(
    json_log: None, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        raise ValueError("the cause")
    except ValueError as exc:
        structlog.get_logger().error("storage failed", exc_info=exc)
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["event"] == "storage failed" and record["level"] == "error"
    # before, JSON lines said "exc_info": true, and the traceback was lost
    assert "exc_info" not in record
    assert record["exception"].startswith("Traceback (most recent call last):")
    assert record["exception"].endswith("ValueError: the cause")


def test_the_notice_of_dropped_lines_is_a_json_line_too() -> None:
    record = json.loads(scow_logging._json_dropped(7))
    assert record["dropped"] == 7 and record["level"] == "warning"
    assert record["event"] == "log lines dropped: the log's reader did not keep up"


_PROGRAM = """
import logging, threading
from scow.core import logging as scow_logging
scow_logging.configure("json", background=True)
logging.getLogger("asyncio").error("Task exception was never retrieved")
thread = threading.Thread(target=lambda: 1 / 0, name="page writer")
thread.start()
thread.join()
raise RuntimeError("the end")
"""


def test_a_process_logging_in_json_writes_only_json_lines_whoever_logs() -> None:
    """Python's own logging, a thread's uncaught exception and the process's last one
    wrote plain text (a traceback per line) into a JSON log."""
    import subprocess
    import sys

    ended = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert ended.returncode == 1
    records = [json.loads(line) for line in ended.stderr.splitlines()]  # each one JSON
    assert [(r["event"], r["level"]) for r in records] == [
        ("Task exception was never retrieved", "error"),
        ("a thread died of an exception", "critical"),
        ("the process ends on an exception", "critical"),
    ]
    assert records[0]["logger"] == "asyncio"
    assert records[1]["thread"] == "page writer"
    assert records[1]["exception"].endswith("ZeroDivisionError: division by zero")
    assert records[2]["exception"].endswith("RuntimeError: the end")
