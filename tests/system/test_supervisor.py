"""`scow run` under systemd (`Type=notify`): what it tells its supervisor, and when.

Before, `scow run` told its supervisor nothing. A unit could only be `Type=simple`, counted
as started the moment the process was: the units ordered after it (its clients) started
while it still recovered and were refused. And nothing could tell a broker whose event
loop had stopped turning from one that served. Now it speaks systemd's notify protocol,
as RabbitMQ does: READY=1 once it serves (an HA member: once it waits for the store),
WATCHDOG=1 from the event loop when `WatchdogSec=` asks for it, and STOPPING=1.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from scow.core.testing import wait_for
from tests.system.broker import SystemBroker
from tests.system.ha import Pair
from tests.system.topology import BrokerSpec

#: The watchdog interval the tests ask for (WATCHDOG_USEC): a ping every 0.2 s.
WATCHDOG_USEC = 400_000
_UCRED = struct.Struct("3i")  # pid, uid, gid


class NotifySocket:
    """A supervisor's notify socket, read as systemd reads it: each datagram with its
    sender's pid (SO_PASSCRED). `on_ready(pid)` runs in the reading thread the moment a
    READY=1 arrives, before the test sees it."""

    def __init__(self, path: Path, on_ready: Callable[[int], None] = lambda pid: None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.settimeout(0.1)
        self.on_ready = on_ready
        #: (sender's pid, assignment), in the order they came.
        self.got: list[tuple[int, str]] = []
        self._open = True
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while self._open:
            try:
                data, ancillary, _flags, _address = self.sock.recvmsg(
                    4096, socket.CMSG_SPACE(_UCRED.size)
                )
            except TimeoutError:
                continue
            pid = next(
                _UCRED.unpack_from(payload)[0]
                for level, kind, payload in ancillary
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
            )
            for assignment in data.decode().split("\n"):
                if assignment == "READY=1":
                    self.on_ready(pid)
                self.got.append((pid, assignment))

    def of(self, pid: int) -> list[str]:
        """What `pid` sent, in order."""
        return [assignment for sender, assignment in self.got if sender == pid]

    def close(self) -> None:
        self._open = False
        self._thread.join()
        self.sock.close()


def _accepts(port: int | None) -> bool:
    with socket.socket() as sock:
        return port is not None and sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def supervised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Factory: a NotifySocket, and the variables systemd would set for the brokers the
    test starts (they inherit the environment)."""
    sockets: list[NotifySocket] = []

    def make(on_ready: Callable[[int], None] = lambda pid: None) -> NotifySocket:
        notify = NotifySocket(tmp_path / "notify", on_ready)
        sockets.append(notify)
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
        monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
        return notify

    yield make
    for notify in sockets:
        notify.close()


def test_scow_run_is_ready_once_it_serves_pings_its_watchdog_and_says_it_stops(
    supervised, tmp_path: Path
) -> None:
    broker: SystemBroker = BrokerSpec(lanes=("paged",)).create(tmp_path / "broker")
    serving_when_ready: list[tuple[bool, bool]] = []
    notify = supervised(
        lambda pid: serving_when_ready.append((_accepts(broker.port), _accepts(broker.http_port)))
    )
    try:
        broker.start()
        pid = broker.pid
        wait_for(lambda: "READY=1" in notify.of(pid), 30, 0.05, "READY=1")
        # AMQP listened and the management API (started last) answered when it came
        assert serving_when_ready == [(True, True)]
        assert notify.of(pid)[:2] == ["READY=1", "STATUS=serving"]
        wait_for(lambda: notify.of(pid).count("WATCHDOG=1") >= 5, 10, 0.05, "watchdog pings")
        assert broker.stop() == 0
        said = notify.of(pid)
        assert said[-2:] == ["STOPPING=1", "STATUS=stopping: storing what clients sent"]
        assert said.count("READY=1") == 1
    finally:
        broker.kill()


def test_an_ha_backup_is_ready_while_it_waits_says_when_it_serves_and_hands_over(
    supervised, tmp_path: Path
) -> None:
    """A backup's work is to wait: were it ready only once it served, systemd would give
    up on its start (TimeoutStartSec) while the primary is well. Handing the store back
    (failback) it starts again in place, same pid, to wait: a STOPPING=1 then would have
    had systemd kill it once TimeoutStopSec passed."""
    notify = supervised()
    pair = Pair(tmp_path / "pair")
    try:
        pair.start()
        primary, backup = pair.primary.pid, pair.backup.pid
        wait_for(lambda: "READY=1" in notify.of(backup), 30, 0.05, "the backup's READY=1")
        assert notify.of(primary)[:2] == ["READY=1", "STATUS=serving (HA primary)"]
        assert notify.of(backup)[:2] == ["READY=1", "STATUS=waiting for the store (HA backup)"]
        # waiting, its loop turns: it pings like a serving broker
        wait_for(lambda: notify.of(backup).count("WATCHDOG=1") >= 3, 10, 0.05, "pings")
        assert pair.backup.refuses()
        pair.kill(pair.primary)
        wait_for(
            lambda: "STATUS=serving (HA backup)" in notify.of(backup), 60, 0.05, "the takeover"
        )
        assert pair.backup.accepts()
        pings = notify.of(backup).count("WATCHDOG=1")
        wait_for(lambda: notify.of(backup).count("WATCHDOG=1") > pings + 2, 10, 0.05, "pings")

        pair.primary.launch()  # failback: the backup hands the store over, waits again
        waiting = "STATUS=waiting for the store (HA backup)"
        wait_for(lambda: notify.of(backup).count(waiting) == 2, 60, 0.05, "waiting again")
        assert pair.backup.pid == backup and pair.backup.refuses()
        said = notify.of(backup)
        assert "STATUS=handing the store over, then waiting for it" in said
        assert "STOPPING=1" not in said
    finally:
        assert not pair.close()
