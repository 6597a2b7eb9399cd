"""What `scow run` tells its supervisor: systemd's notify protocol (`sd_notify`).

With `Type=notify` in its unit, systemd starts `scow run` with `$NOTIFY_SOCKET` set and
counts the broker as started only at READY=1, as it does for RabbitMQ; units ordered after
it (its clients) start then, not while it still recovers.

- READY=1 once the broker serves: recovered, its listeners up, the management API last.
  An HA member that waits for the store is ready when it starts waiting (waiting is its
  work); STATUS= says which (`systemctl status` shows it).
- STOPPING=1 when a stop begins; not when an HA member hands the store over, since the
  process then starts again in place (`os.execv`) and waits for it.
- WATCHDOG=1 from the event loop, every half of `$WATCHDOG_USEC`, once ready: with
  `WatchdogSec=` set, a loop that stops turning for that long gets the broker killed
  (SIGABRT) and, with `Restart=on-failure`, restarted; the journal recovers as from a
  crash.

Without `$NOTIFY_SOCKET` (any other way of running the broker) this does nothing. A
supervisor that does not read its socket never stops the broker: a failed send is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

#: The variables systemd sets for a service.
NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"


def notify(*assignments: str) -> None:
    """Send `assignments` ("READY=1", "STATUS=...") to the supervisor, if there is one."""
    address = os.environ.get(NOTIFY_SOCKET, "")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with (
        contextlib.suppress(OSError),
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock,
    ):
        sock.connect(address)
        sock.sendall("\n".join(assignments).encode())


def watchdog_period() -> float | None:
    """Seconds between two WATCHDOG=1, when the supervisor asks for them (else None)."""
    usec = os.environ.get(WATCHDOG_USEC, "")
    pid = os.environ.get(WATCHDOG_PID, "")
    if not usec.isdigit() or int(usec) == 0 or (pid.isdigit() and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


class Supervisor:
    """What `scow run` tells its supervisor, step by step (call on the event loop)."""

    def __init__(self) -> None:
        self._watchdog: asyncio.Task[None] | None = None

    def ready(self, status: str) -> None:
        """Started (serving, or waiting as an HA member): READY=1, and the watchdog's
        pings from now on, when asked for."""
        notify("READY=1", f"STATUS={status}")
        period = watchdog_period()
        if period is not None and self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(_watchdog(period))

    def status(self, status: str) -> None:
        notify(f"STATUS={status}")

    def stopping(self) -> None:
        """The process is about to end (not an HA step-down: that one waits again)."""
        notify("STOPPING=1", "STATUS=stopping: storing what clients sent")


async def _watchdog(period: float) -> None:
    """Tell the supervisor every `period` seconds that the event loop turns."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(period)
