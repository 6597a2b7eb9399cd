"""An HA pair under test: two `scow run` members on one store, clients that reconnect over
both URLs, a TCP proxy that can cut a member off its database, and the checker.

    python -m tests.system.ha produce --urls U1,U2 --address A --log FILE [--rate R]
    python -m tests.system.ha consume --urls U1,U2 --address A --log FILE

The clients try URL after URL until one accepts (a waiting member refuses connections),
and go on there after a failover. They append JSON lines (`records.EventLog`):

- producer `accepted`: the broker settled this send as accepted (id, attempt). A send whose
  outcome was lost to a failover (or refused) is sent again as the next *attempt* of its
  id, so one id may be stored twice: the checker tells sends apart by (id, attempt);
- consumer `connected` (conn number, url), `delivered` (id, attempt, delivery count, conn,
  url), `acked`: the broker settled the consumer's accept (the consumer accepts without
  settling and waits for the broker's settlement, so `acked` means the broker took it).

The checker (`check`) holds a history to three rules:

- every accepted id is delivered (to the consumer or to the final drain);
- no send is delivered for the first time (delivery count 0) twice by one broker process
  (a failover may repeat a delivery the dead member had not counted);
- no send the broker acknowledged is delivered again, unless the member that acknowledged
  it was SIGKILLed within `ACK_GRACE` seconds after, or cut off its store then or later
  while it still served (the broker settles an accept before the journal has it on disk;
  a clean stop or step-down writes it first).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from proton import Delivery, Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from scow.core.testing import free_port, scow_command, wait_for, write_config
from tests.system.broker import SystemBroker, describe_status, listening
from tests.system.processes import ROOT
from tests.system.records import EventLog, read_events

#: File store members; the database store adds "database-store".
PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging", "management"]
ADDRESS = "ha.orders"
#: Seconds an acknowledgement may precede a SIGKILL and still be lost with the member.
ACK_GRACE = 1.0

SERVING = "ha: serving"
WAITING = "ha: waiting for the store"
STEPPING_DOWN = "ha: stepping down"
ASKING = "ha: asking the serving broker for the store back"

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?)")


# --------------------------------------------------------------------------- members


class Member(SystemBroker):
    """One member of a pair: a `scow run` that may wait for the store (not listening)
    before it serves, and that may re-exec itself (same pid, same log) to wait again."""

    def __init__(
        self, name: str, role: str, config_path: Path, port: int, http_port: int, log_path: Path
    ) -> None:
        super().__init__(config_path, port, log_path, http_port=http_port)
        self.name = name
        self.role = role

    def launch(self) -> Member:
        """Start the process without waiting for it to listen (a backup waits)."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.deliberate = False
        self.proc = subprocess.Popen(
            [scow_command(), "run", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        self.starts += 1
        return self

    def accepts(self) -> bool:
        """Its AMQP port accepts a TCP connection (fails the test if it died on its own)."""
        if self.died() is not None:
            raise AssertionError(self.death_report())
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def refuses(self) -> bool:
        return not self.accepts()

    def logged(self, needle: str) -> int:
        """How many of its log lines contain `needle` (over every start of it)."""
        if not self.log_path.exists():
            return 0
        return self.log_path.read_text(errors="replace").count(needle)

    def logged_at(self, needle: str) -> list[float]:
        """The times (seconds since the epoch) of its log lines that contain `needle`."""
        times = []
        if self.log_path.exists():
            for line in self.log_path.read_text(errors="replace").splitlines():
                if needle in line and (stamp := _STAMP.match(line)):
                    text = stamp.group(1).rstrip("Z")
                    times.append(datetime.fromisoformat(text + "+00:00").timestamp())
        return times

    def wait_logged(self, needle: str, count: int = 1, timeout: float = 30) -> None:
        def seen() -> bool:
            if self.died() is not None:
                raise AssertionError(self.death_report())
            return self.logged(needle) >= count

        try:
            wait_for(seen, timeout, 0.05, f"{self.name} to log {needle!r} ({count}x)")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {self.name} log ---\n{self.log_tail()}") from None

    def wait_serving(self, timeout: float = 30) -> float:
        """Wait until it serves (its port accepts, then its management API: that starts
        just after); the seconds it took."""
        started = time.monotonic()
        try:
            wait_for(self.accepts, timeout, 0.02, f"{self.name} to serve")
            wait_for(lambda: listening(self.http_port), timeout, 0.02, "its management API")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {self.name} log ---\n{self.log_tail()}") from None
        return time.monotonic() - started

    def keeps(self, condition: Any, seconds: float, what: str) -> None:
        """`condition()` holds for `seconds` (polled); fails the moment it does not."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert condition(), f"{self.name}: {what} stopped holding\n{self.log_tail()}"
            time.sleep(0.1)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, and wait for the exit status."""
        assert self.proc is not None
        self.deliberate = True
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


@dataclass
class Move:
    """A member stopped serving at `t`: `kill` (SIGKILL), `lost` (cut off its store since
    `since`: what it did not write by then is lost, as with a kill) or `stop` (a clean stop
    or step-down, which writes what it acknowledged)."""

    url: str
    t: float
    kind: str
    since: float | None = None

    def took(self, ack: float) -> bool:
        """Whether an acknowledgement at `ack` may have been lost with this move."""
        if self.kind == "stop":
            return False
        since = self.t if self.since is None else self.since
        return since - ACK_GRACE <= ack <= self.t + 1


def member_tables(
    name: str,
    role: str,
    data_dir: Path,
    port: int,
    http_port: int,
    ha: Mapping[str, Any],
    database: Mapping[str, Any] | None = None,
    address_settings: Mapping[str, Mapping[str, Any]] | None = None,
    streams: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    """The config of one member. With `database` ([database] settings), the journal and
    the pages (and streams) live in that database and `data_dir` is the member's own;
    `address_settings` adds to the default (anycast) ones; `streams` names stream queues
    to declare (with the spark plugin)."""
    plugins = [*PLUGINS, "database-store"] if database else list(PLUGINS)
    if streams:
        plugins.append("spark")
    tables: dict[str, dict[str, Any]] = {
        "plugins": {"enable": plugins},
        "broker": {"data-dir": str(data_dir), "name": name},
        "amqp": {"listen": [f"127.0.0.1:{port}"]},
        "management": {"listen": f"127.0.0.1:{http_port}"},
        "ha": {"policy": role, "lock-poll-period": 100, **ha},
        "address-settings": {
            "#": {"default-address-routing-type": "ANYCAST"},
            **(address_settings or {}),
        },
        "queues": {ADDRESS: {"address": ADDRESS, "routing-type": "ANYCAST"}},
    }
    for name in streams:
        tables["queues"][name] = {
            "routing-type": "ANYCAST",
            "arguments": {"x-queue-type": "stream"},
        }
    if database:
        tables["broker"]["journal"] = "database"
        tables["paging"] = {"store": "database"}
        tables["database"] = dict(database)
    return tables


class Pair:
    """A primary and a backup in `directory`, on one store.

    File store (`database` None): both members' data dir is `directory/data`. Database
    store: each member has its own data dir and `database[role]` as its [database] table
    (the same database, maybe reached through different routes)."""

    def __init__(
        self,
        directory: Path,
        *,
        ha: Mapping[str, Any] | None = None,
        primary_ha: Mapping[str, Any] | None = None,
        backup_ha: Mapping[str, Any] | None = None,
        database: Mapping[str, Mapping[str, Any]] | None = None,
        address_settings: Mapping[str, Mapping[str, Any]] | None = None,
        streams: Sequence[str] = (),
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.database = database
        members = {}
        for role, own in (("primary", primary_ha), ("backup", backup_ha)):
            port, http_port = free_port(), free_port()
            data_dir = directory / (f"data-{role}" if database else "data")
            tables = member_tables(
                role,
                role,
                data_dir,
                port,
                http_port,
                {**(ha or {}), **(own or {})},
                database[role] if database else None,
                address_settings,
                streams,
            )
            config = write_config(directory / f"{role}.toml", tables)
            members[role] = Member(role, role, config, port, http_port, directory / f"{role}.log")
            members[role].data_dir = data_dir
        self.primary: Member = members["primary"]
        self.backup: Member = members["backup"]
        self.moves: list[Move] = []

    @property
    def members(self) -> list[Member]:
        return [self.primary, self.backup]

    @property
    def urls(self) -> list[str]:
        return [self.primary.url, self.backup.url]

    def start(self, timeout: float = 60) -> Pair:
        """The primary serving, then the backup waiting for the store."""
        self.primary.launch().wait_serving(timeout)
        self.primary.wait_logged(SERVING, timeout=timeout)
        self.backup.launch().wait_logged(WAITING, timeout=timeout)
        return self

    def kill(self, member: Member) -> None:
        """SIGKILL `member` (recorded as a move for the checker)."""
        self.moves.append(Move(member.url, time.time(), "kill"))
        member.kill()

    def stop(self, member: Member) -> int:
        """SIGTERM `member` and wait for it (recorded as a move)."""
        self.moves.append(Move(member.url, time.time(), "stop"))
        return member.terminate()

    def close(self) -> list[str]:
        """Kill both; the death reports of members that exited on their own."""
        deaths = [m.death_report() for m in self.members if m.died() not in (None, 0)]
        for member in self.members:
            member.kill()
        return deaths


def remote_properties(url: str) -> dict[str, Any]:
    """The connection properties of `url`'s Open frame (keys as plain strings)."""
    conn = BlockingConnection(url, timeout=10)
    try:
        return {str(k): v for k, v in (conn.conn.remote_properties or {}).items()}
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def ha_status(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [scow_command(), "ha", "status", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


# --------------------------------------------------------------------------- TCP proxy


class _Link:
    """One proxied connection: whether it flows, and whether its server said last that
    no transaction is open."""

    def __init__(self) -> None:
        self.flowing = threading.Event()
        self.flowing.set()
        self.idle = False


class CutProxy:
    """A TCP proxy to a PostgreSQL server `upstream`, on a free local port.

    `cut()` makes it a black hole, as a network partition does: nothing more is forwarded,
    either way, on the open connections nor on new ones, and nothing is closed (not even
    when a peer closes its end: the other never hears of it). `restore()` lets the held
    bytes through. Where the cut falls:

    - `cut()`: at once, wherever each connection is (maybe inside a transaction);
    - `cut(after=b"...")`: right after the client sends a chunk holding those bytes (say
      the lock row's table name: the cut falls inside the transaction that renews it);
    - `cut(between_transactions=True)`: each connection is held once no transaction is
      open on it (its server's last message was ReadyForQuery, status idle), so the cut
      leaves no row locked behind it.
    """

    #: A ReadyForQuery message with status idle: the server waits, no transaction open.
    IDLE = b"Z\x00\x00\x00\x05I"

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._new = threading.Event()  # new connections may be opened
        self._new.set()
        self._closed = False
        self._after: bytes | None = None
        self._between = False
        self._links: list[_Link] = []
        self._cutting = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.cut_at: float | None = None
        threading.Thread(target=self._accept, daemon=True, name="cut-proxy").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client: socket.socket) -> None:
        self._new.wait()  # a connection made during a cut goes nowhere
        if self._closed:
            return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        self._sockets.append(server)
        link = _Link()
        with self._cutting:  # a cut that fell while this one was being made holds it too
            self._links.append(link)
            if not self._new.is_set():
                link.flowing.clear()
        for args in ((client, server, link, True), (server, client, link, False)):
            threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, link: _Link, upward: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if upward:
                    if self._between and link.idle:
                        link.flowing.clear()  # at rest: held here, with no row locked
                    link.idle = False
                else:  # set before the client can have answered these bytes
                    link.idle = data.endswith(self.IDLE)
                link.flowing.wait()
                if self._closed:
                    return
                dst.sendall(data)
                if upward and self._after is not None and self._after in data:
                    self._hold()
        link.flowing.wait()  # a peer's close, too, is news that a cut keeps
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _hold(self) -> None:
        with self._cutting:
            if self.cut_at is None:
                self.cut_at = time.time()
            self._new.clear()
            for link in self._links:
                link.flowing.clear()

    def cut(self, *, after: bytes | None = None, between_transactions: bool = False) -> None:
        if after is not None:
            self._after = after
        elif between_transactions:
            self.cut_at = time.time()
            self._new.clear()
            self._between = True
        else:
            self._hold()

    def restore(self) -> None:
        self._after, self._between, self.cut_at = None, False, None
        self._new.set()
        for link in self._links:
            link.flowing.set()

    def close(self) -> None:
        self._closed = True
        self.restore()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


# --------------------------------------------------------------------------- clients


class _Reconnecting(MessagingHandler):
    """A client that connects to the first of `urls` that accepts, and after losing a
    connection tries them again in turn (a waiting member refuses), until SIGTERM."""

    tick = 0.05

    def __init__(self, args: argparse.Namespace, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.args = args
        self.urls = args.urls.split(",")
        self.log = EventLog(args.log, args.name)
        self.conn: Any = None
        self.conn_no = 0
        self.opened = False
        self.url_index = 0
        self.retry_at = 0.0
        self.stop_requested = False
        self.stopping_since: float | None = None
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.log.write("started", pid=os.getpid())
        event.container.schedule(0, self)

    def on_timer_task(self, event: Any) -> None:
        now = time.monotonic()
        if self.stop_requested and self.stopping_since is None:
            self.stopping_since = now
            self.log.write("stopping")
        if self.stopping_since is not None and (
            self.conn is None or self.idle() or now - self.stopping_since > 5
        ):
            self.finish()
            return
        if self.conn is None and self.stopping_since is None and now >= self.retry_at:
            url = self.urls[self.url_index % len(self.urls)]
            self.url_index += 1
            if self.url_index % len(self.urls) == 0:
                self.retry_at = now + 0.1  # a round of refusals: pause before the next
            self.conn_url = url
            self.conn = self.container.connect(url, reconnect=False)
            self.attach(self.conn)
        self.on_tick()
        event.container.schedule(self.tick, self)

    def on_connection_opened(self, event: Any) -> None:
        if event.connection == self.conn:
            self.conn_no += 1
            self.opened = True
            self.log.write("connected", conn=self.conn_no, url=self.conn_url)

    def on_connection_remote_close(self, event: Any) -> None:
        event.connection.close()  # the member stepped down or stopped: try the others

    def on_transport_closed(self, event: Any) -> None:
        if event.connection is not None and event.connection == self.conn:
            self.conn = None
            self.lost()
            if self.opened:
                self.log.write("disconnected", conn=self.conn_no)
            self.opened = False

    def finish(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.log.write("stopped")
        self.container.stop()

    # hooks
    def attach(self, conn: Any) -> None: ...
    def lost(self) -> None: ...
    def on_tick(self) -> None: ...
    def idle(self) -> bool:
        return True


class Producer(_Reconnecting):
    """Durable messages `<name>-<seq>` at `--rate` per second, `--window` unsettled; a
    send whose outcome was lost or refused goes again as the next attempt of its id."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, auto_settle=True)
        self.sender: Any = None
        self.seq = 0
        self.accepted = 0
        self.attempts: dict[int, int] = defaultdict(int)
        self.resend: list[int] = []
        self.pending: dict[Any, int] = {}
        self.budget = 1.0
        self.last = time.monotonic()

    def attach(self, conn: Any) -> None:
        self.sender = self.container.create_sender(conn, self.args.address)

    def lost(self) -> None:
        interrupted = sorted(self.pending.values())
        self.pending.clear()
        self.resend = sorted({*self.resend, *interrupted})
        self.sender = None
        if interrupted:
            self.log.write("interrupted", seqs=interrupted)

    def on_tick(self) -> None:
        now = time.monotonic()
        self.budget = min(self.budget + (now - self.last) * self.args.rate, 1 + self.args.rate / 10)
        self.last = now
        self.pump()

    def on_sendable(self, event: Any) -> None:
        self.pump()

    def pump(self) -> None:
        sender = self.sender
        while (
            sender is not None
            and self.stopping_since is None
            and sender.credit > 0
            and len(self.pending) < self.args.window
            and (self.resend or self.budget >= 1)
            and (self.args.count is None or self.resend or self.seq < self.args.count)
        ):
            if self.resend:
                seq = self.resend.pop(0)
            else:
                self.budget -= 1
                self.seq += 1
                seq = self.seq
            self.attempts[seq] += 1
            message = Message(
                id=f"{self.args.name}-{seq}",
                durable=True,
                properties={"attempt": self.attempts[seq]},
                body=f"message {seq}",
            )
            self.pending[sender.send(message)] = seq

    def _settled(self, event: Any, outcome: str) -> None:
        seq = self.pending.pop(event.delivery, None)
        if seq is None:
            return
        fields = {"id": f"{self.args.name}-{seq}", "attempt": self.attempts[seq]}
        if outcome == "accepted":
            self.accepted += 1
            self.log.write("accepted", **fields)
        else:
            self.log.write("refused", outcome=outcome, **fields)
            self.resend.append(seq)

    def on_accepted(self, event: Any) -> None:
        self._settled(event, "accepted")

    def on_rejected(self, event: Any) -> None:
        self._settled(event, "rejected")

    def on_released(self, event: Any) -> None:
        self._settled(event, "released")

    def on_modified(self, event: Any) -> None:
        self._settled(event, "modified")

    def idle(self) -> bool:
        return not self.pending


class Consumer(_Reconnecting):
    """Receives from `--address`, `--credit` at a time; accepts each message without
    settling it and logs `acked` once the broker settled it."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, prefetch=args.credit, auto_accept=False)
        self.unacked: dict[Any, tuple[str, int]] = {}

    def attach(self, conn: Any) -> None:
        self.container.create_receiver(conn, self.args.address)

    def lost(self) -> None:
        self.unacked.clear()  # given back by the broker (or lost with it)

    def on_message(self, event: Any) -> None:
        if self.stopping_since is not None:  # given back untouched: the drain takes it
            event.delivery.update(Delivery.RELEASED)
            event.delivery.settle()
            return
        message = event.message
        key = (str(message.id), int((message.properties or {}).get("attempt", 0)))
        self.log.write(
            "delivered",
            id=key[0],
            attempt=key[1],
            count=message.delivery_count,
            conn=self.conn_no,
            url=self.conn_url,
        )
        event.delivery.update(Delivery.ACCEPTED)
        self.unacked[event.delivery] = key

    def on_settled(self, event: Any) -> None:
        key = self.unacked.pop(event.delivery, None)
        if key is not None:
            self.log.write("acked", id=key[0], attempt=key[1], conn=self.conn_no)
            event.delivery.settle()

    def idle(self) -> bool:
        return not self.unacked


class Client:
    """A client program of this module in its own process."""

    def __init__(self, kind: str, name: str, urls: Sequence[str], log: Path, *args: str) -> None:
        self.kind, self.name, self.log = kind, name, log
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.system.ha",
                kind,
                "--name",
                name,
                "--urls",
                ",".join(urls),
                "--log",
                str(log),
                *args,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(log.with_suffix(".err"), "wb"),  # noqa: SIM115 - the child owns it
        )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_events(self.log) if kind is None or e["kind"] == kind]

    def count(self, kind: str) -> int:
        return len(self.events(kind))

    def stop(self, timeout: float = 20) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            status = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f"{self.name} did not stop on SIGTERM") from None
        assert status == 0, (
            f"{self.name}: {describe_status(status)}\n"
            + self.log.with_suffix(".err").read_text(errors="replace")[-3000:]
        )

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


class Traffic:
    """A producer and a consumer on `address`, both over `urls`, logging under `directory`.
    With `consume=False` the consumer starts at `start_consumer()` (a backlog builds up)."""

    def __init__(
        self,
        directory: Path,
        urls: Sequence[str],
        *,
        rate: int = 200,
        address: str = ADDRESS,
        consume: bool = True,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.urls = list(urls)
        self.address = address
        self.producer = Client(
            "produce",
            "p",
            urls,
            directory / "producer.jsonl",
            "--address",
            address,
            "--rate",
            str(rate),
        )
        self.consumer: Client | None = None
        if consume:
            self.start_consumer()

    def start_consumer(self) -> None:
        self.consumer = Client(
            "consume",
            "c",
            self.urls,
            self.directory / "consumer.jsonl",
            "--address",
            self.address,
        )

    def wait_accepted(self, more: int = 1, timeout: float = 30) -> int:
        """Wait until `more` further sends were accepted; the total accepted."""
        target = self.producer.count("accepted") + more
        return wait_for(
            lambda: (n := self.producer.count("accepted")) >= target and n,
            timeout,
            0.05,
            f"{more} more accepted sends",
        )

    def wait_acked(self, more: int = 1, timeout: float = 30) -> int:
        consumer = self.consumer
        assert consumer is not None
        target = consumer.count("acked") + more
        return wait_for(
            lambda: (n := consumer.count("acked")) >= target and n,
            timeout,
            0.05,
            f"{more} more acknowledged deliveries",
        )

    def stop(self) -> None:
        self.producer.stop()
        if self.consumer is not None:
            self.consumer.stop()

    def kill(self) -> None:
        self.producer.kill()
        if self.consumer is not None:
            self.consumer.kill()

    def drain(self, url: str) -> int:
        return drain(url, self.address, self.directory / "drain.jsonl")

    def events(self) -> list[dict[str, Any]]:
        found = [e for path in self.directory.glob("*.jsonl") for e in read_events(path)]
        return sorted(found, key=lambda e: e["t"])


def drain(url: str, address: str, log_path: Path, quiet: float = 1.5) -> int:
    """Take every message `address` holds at `url`, logged as the consumer logs them (as
    connection `drain`); how many."""
    log = EventLog(log_path, "drain")
    conn = BlockingConnection(url, timeout=15)
    taken = 0
    try:
        log.write("connected", conn="drain", url=url)
        receiver = conn.create_receiver(address, credit=100)
        while True:
            try:
                message = receiver.receive(timeout=quiet)
            except Timeout:
                return taken
            log.write(
                "delivered",
                id=str(message.id),
                attempt=int((message.properties or {}).get("attempt", 0)),
                count=message.delivery_count,
                conn="drain",
                url=url,
            )
            receiver.accept()
            taken += 1
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        log.close()


# --------------------------------------------------------------------------- checker


@dataclass
class Findings:
    accepted: int = 0
    delivered: int = 0
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    acked_twice: list[str] = field(default_factory=list)
    #: Acknowledged sends delivered again because their member was killed just after.
    ack_lost_with_kill: int = 0
    #: Sends delivered by more than one member process (a failover repeats what the
    #: member that left had not seen acknowledged).
    repeated: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.acked_twice)

    def __str__(self) -> str:
        return (
            f"accepted {self.accepted}, delivered {self.delivered}, lost {len(self.lost)} "
            f"{self.lost[:10]}, first deliveries doubled {len(self.doubled)} "
            f"{self.doubled[:5]}, acknowledged twice {len(self.acked_twice)} "
            f"{self.acked_twice[:5]}, acknowledgements lost with a kill "
            f"{self.ack_lost_with_kill}, sends delivered by two processes {self.repeated}"
        )


def check(events: Iterable[dict[str, Any]], moves: Sequence[Move]) -> Findings:
    """The module's three rules over the clients' and the drain's events. `moves` are the
    pair's kills and stops: each ends the process behind a URL (a connection belongs to
    the process its URL had when it opened)."""
    events = sorted(events, key=lambda e: e["t"])
    f = Findings()
    conns: dict[tuple[str, Any], tuple[str, float]] = {}
    deliveries: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    acks: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    accepted = set()
    for e in events:
        if e["kind"] == "connected":
            conns[(e["client"], e["conn"])] = (e["url"], e["t"])
        elif e["kind"] == "accepted":
            accepted.add(e["id"])
        elif e["kind"] == "delivered":
            deliveries[(e["id"], e["attempt"])].append(e)
        elif e["kind"] == "acked":
            acks[(e["id"], e["attempt"])].append(e)

    def process(e: dict[str, Any]) -> tuple[str, int]:
        url, since = conns[(e["client"], e["conn"])]
        return url, sum(1 for m in moves if m.url == url and m.t < since)

    def ended_by(e: dict[str, Any]) -> Move | None:
        url, since = conns[(e["client"], e["conn"])]
        later = [m for m in moves if m.url == url and m.t >= since]
        return min(later, key=lambda m: m.t) if later else None

    delivered_ids = {ident for ident, _ in deliveries}
    f.accepted, f.delivered = len(accepted), len(delivered_ids)
    f.lost = sorted(accepted - delivered_ids, key=_natural)
    for (ident, attempt), seen in deliveries.items():
        firsts: dict[tuple[str, int], int] = defaultdict(int)
        for e in seen:
            if not e["count"]:
                firsts[process(e)] += 1
        f.doubled += [
            f"{ident}#{attempt} by {url} (its process {n + 1})"
            for (url, n), times in firsts.items()
            if times > 1
        ]
        f.repeated += len({process(e) for e in seen}) > 1
        for ack in acks.get((ident, attempt), []):
            again = [e for e in seen if e["t"] > ack["t"]]
            if not again:
                continue
            end = ended_by(ack)
            if end is not None and end.took(ack["t"]):
                f.ack_lost_with_kill += 1
            else:
                f.acked_twice.append(
                    f"{ident}#{attempt} acknowledged on {conns[(ack['client'], ack['conn'])][0]}"
                    f", then delivered on {again[0]['url']}"
                )
    return f


def _natural(ident: str) -> tuple[str, int]:
    name, _, seq = ident.rpartition("-")
    return (name, int(seq)) if seq.isdigit() else (ident, 0)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.system.ha")
    parser.add_argument("kind", choices=("produce", "consume"))
    parser.add_argument("--name", required=True)
    parser.add_argument("--urls", required=True, help="comma-separated, tried in turn")
    parser.add_argument("--address", default=ADDRESS)
    parser.add_argument("--log", required=True)
    parser.add_argument("--rate", type=float, default=100, help="messages per second")
    parser.add_argument("--window", type=int, default=10, help="unsettled sends at most")
    parser.add_argument("--count", type=int, default=None, help="ids to send, then stop")
    parser.add_argument("--credit", type=int, default=10)
    args = parser.parse_args(argv)
    client = Producer(args) if args.kind == "produce" else Consumer(args)
    Container(client).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
