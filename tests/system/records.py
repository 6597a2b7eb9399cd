"""What a client process did, as JSON lines it appends and flushes one event at a time.

A client may be SIGKILLed at any instant: each event is written and flushed to the OS
before the client goes on, so the file holds everything up to the kill (at worst a torn
last line, which `read_events` drops).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class EventLog:
    """Appends events (`kind` plus fields, stamped with wall time) to one file."""

    def __init__(self, path: Path | str, client: str) -> None:
        self.client = client
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def write(self, kind: str, **fields: Any) -> None:
        fields.update(t=time.time(), client=self.client, kind=kind)
        self._file.write(json.dumps(fields, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event in `path` (a line torn by a kill is skipped)."""
    if not path.exists():
        return []
    events = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if not line.endswith("\n"):
                break  # torn by a kill mid-write
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def read_all(directory: Path, pattern: str = "*.jsonl") -> list[dict[str, Any]]:
    """The events of every file in `directory` matching `pattern`, in time order."""
    events = [e for path in sorted(directory.glob(pattern)) for e in read_events(path)]
    events.sort(key=lambda e: e.get("t", 0.0))
    return events


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Tail:
    """New events of the files in a directory since the last `poll()` (reads each file
    from where it stopped, so a long schedule's logs are read once)."""

    def __init__(self, directory: Path, pattern: str = "*.jsonl") -> None:
        self.directory = directory
        self.pattern = pattern
        self.offsets: dict[Path, int] = {}

    def poll(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob(self.pattern)):
            offset = self.offsets.get(path, 0)
            with open(path, "rb") as data:
                data.seek(offset)
                chunk = data.read()
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for next time
            for line in chunk[:end].splitlines():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
            self.offsets[path] = offset + end
        return events
