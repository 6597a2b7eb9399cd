"""The client processes of a schedule, and what /proc says about them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: The repository: client programs run as `python -m tests.system.clients` from here.
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    name: str
    role: str
    popen: subprocess.Popen[bytes]
    group: str | None = None
    started: float = field(default_factory=time.time)
    #: A transient client is stopped (SIGTERM) at this monotonic time.
    until: float | None = None
    stopped_at: float | None = None
    terminated: bool = False
    killed: bool = False
    out: Path | None = None
    #: Wall time the schedule saw it exited.
    ended: float | None = None

    @property
    def live(self) -> bool:
        return self.popen.poll() is None and self.stopped_at is None


def local_ports(pid: int) -> list[int]:
    """The local TCP ports of `pid`'s sockets (from /proc: its fds' inodes in net/tcp)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)
