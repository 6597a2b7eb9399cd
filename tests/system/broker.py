"""The broker under test: the installed `scow run`, watched from outside.

`SystemBroker` adds to `scow.core.testing.BrokerProcess` what a fault schedule needs to
know: whether the broker died on its own (and how), its open file descriptors and RSS
from /proc, its management API, and the tail of its log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from scow.core.testing import BrokerProcess, scow_command, wait_for


def describe_status(returncode: int) -> str:
    """`-13` -> 'killed by signal 13 (SIGPIPE)'; `1` -> 'exit status 1'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "?"
        return f"killed by signal {-returncode} ({name})"
    if returncode > 128:
        try:
            return f"exit status {returncode} (128 + {signal.Signals(returncode - 128).name})"
        except ValueError:
            pass
    return f"exit status {returncode}"


class SystemBroker(BrokerProcess):
    """`scow run --config CONFIG` on fixed ports; a kill or stop through it is deliberate."""

    def __init__(
        self,
        config_path: Path,
        port: int,
        log_path: Path,
        *,
        http_port: int | None = None,
        command: str | None = None,
    ) -> None:
        super().__init__(config_path, port, log_path, command)
        self.http_port = http_port
        #: The TLS listener's port, when the config has one.
        self.tls_port: int | None = None
        self.data_dir: Path | None = None
        #: Set by kill()/stop(): the schedule ended the process, so its exit is no fault.
        self.deliberate = False
        self.starts = 0

    def start(self, timeout: float = 60) -> SystemBroker:
        self.deliberate = False
        super().start(timeout)
        self.starts += 1
        if self.http_port:
            wait_for(
                lambda: listening(self.http_port), timeout, 0.05, "the management API to listen"
            )
        return self

    def kill(self) -> None:
        self.deliberate = True
        super().kill()

    def stop(self) -> int:
        self.deliberate = True
        return super().stop()

    # ------------------------------------------------------------------ state

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def died(self) -> int | None:
        """The return code if the broker exited without the schedule ending it, else None."""
        if self.proc is None or self.deliberate:
            return None
        return self.proc.poll()

    def fds(self) -> int:
        """Open file descriptors, from /proc/<pid>/fd."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss_kib(self, field: str = "VmRSS") -> int:
        """Resident set size (VmRSS) in KiB; `field="VmHWM"`: its peak so far."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.pid}/status")

    def api(self, path: str, timeout: float = 10) -> Any:
        """GET `path` from the management API (anonymous, loopback) as JSON."""
        assert self.http_port, "the broker was started without the management API"
        url = f"http://127.0.0.1:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_lines(self, *needles: str, limit: int = 20) -> list[str]:
        """Log lines containing any of `needles` (the first `limit`)."""
        if not self.log_path.exists():
            return []
        found = [
            line
            for line in self.log_path.read_text(errors="replace").splitlines()
            if any(n in line for n in needles)
        ]
        return found[:limit]

    def death_report(self) -> str:
        assert self.proc is not None and self.proc.returncode is not None
        return (
            f"the broker (pid {self.pid}) exited on its own: "
            f"{describe_status(self.proc.returncode)}\n--- broker log tail ---\n"
            f"{self.log_tail()}"
        )


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the broker closed `sock` (what it sent before is read and dropped)."""
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
        return True
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except (ConnectionResetError, ssl.SSLEOFError):
        return True


def scow_behind(path: Path, prelude: str) -> str:
    """A program at `path` that runs the shell line `prelude` (a limit, a cgroup) and then
    becomes the installed `scow` with its arguments: a `command` for `SystemBroker`."""
    path.write_text(f'#!/bin/bash\n{prelude}\nexec {scow_command()} "$@"\n')
    path.chmod(0o755)
    return str(path)


def perf_send(broker: BrokerProcess, address: str, count: int) -> None:
    """`count` durable messages, confirmed, from a client in a process of its own."""
    sent = subprocess.run(
        [
            *(scow_command(), "perf", "client", "--url", f"{broker.url}/{address}", "--json"),
            *("--mode", "send", "--durable", "--count", str(count), "--warmup", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sent.returncode == 0 and json.loads(sent.stdout)["sent"] == count, sent.stderr
