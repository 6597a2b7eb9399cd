"""HA failover time: a primary holding N durable messages SIGKILLed, until its backup serves.

For the file store (both members on one data dir) and the database store (PostgreSQL: a
private server started with initdb/pg_ctl like the tests', or `--database-url`), each run
starts a pair of the installed `scow run` (tests/system/ha.py's `Pair`), stores N durable
messages on the primary (each one accepted, so on disk), SIGKILLs it, and times from the
SIGKILL until the backup completes a new AMQP connection (Open answered). Then it drains
the backup and counts the accepted messages it does not hand out (lost, goal 0).

Both members run on this host, so the database store's backup sees at once that the lock
row's holder process is gone (the killed primary is reaped at once, as a service manager
does); a primary on another host is taken over when its lease expires.

    .venv/bin/python benchmarks/failover.py                      # 100 000 messages, 3 runs
    .venv/bin/python benchmarks/failover.py --messages 10000 --runs 1 --stores file
    .venv/bin/python benchmarks/failover.py --database-url postgresql+psycopg://u:p@h/db

Goals (issue 20): file store <= 3 s; database store <= jdbc-lock-expiration + 3 s.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository, for the system tests' helpers

from tests.database.postgres import PostgresServer, binaries  # noqa: E402
from tests.system.ha import ADDRESS, SERVING, Pair  # noqa: E402

GOAL_FILE = 3.0
GOAL_DATABASE_MARGIN = 3.0


class _Fill(MessagingHandler):
    """Sends `count` durable messages `m-<i>` with `window` unsettled; notes the accepted."""

    def __init__(self, url: str, count: int, size: int, window: int = 1000) -> None:
        super().__init__(auto_settle=True)
        self.url, self.count, self.window = url, count, window
        self.body = b"." * size
        self.sent = 0
        self.accepted: set[int] = set()
        self.refused = 0
        self.pending: dict[Any, int] = {}

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, reconnect=False)
        event.container.create_sender(conn, ADDRESS)

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit and self.sent < self.count and len(self.pending) < self.window:
            message = Message(id=f"m-{self.sent}", durable=True, body=self.body)
            self.pending[sender.send(message)] = self.sent
            self.sent += 1

    def _settled(self, event: Any, accepted: bool) -> None:
        i = self.pending.pop(event.delivery, None)
        if i is None:
            return
        if accepted:
            self.accepted.add(i)
        else:
            self.refused += 1
        if len(self.accepted) + self.refused == self.count:
            event.connection.close()
        else:
            self.on_sendable(event)

    def on_accepted(self, event: Any) -> None:
        self._settled(event, True)

    def on_rejected(self, event: Any) -> None:
        self._settled(event, False)

    def on_released(self, event: Any) -> None:
        self._settled(event, False)

    def on_modified(self, event: Any) -> None:
        self._settled(event, False)

    def on_transport_error(self, event: Any) -> None:
        raise RuntimeError(f"filling {self.url}: {event.transport.condition}")


class _Drain(MessagingHandler):
    """Takes every message of the address until none came for `quiet` seconds."""

    def __init__(self, url: str, quiet: float = 3.0) -> None:
        super().__init__(prefetch=1000)
        self.url, self.quiet = url, quiet
        self.ids: list[str] = []
        self.last = time.monotonic()

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, reconnect=False)
        event.container.create_receiver(self.conn, ADDRESS)
        event.container.schedule(0.5, self)

    def on_message(self, event: Any) -> None:
        self.ids.append(str(event.message.id))
        self.last = time.monotonic()

    def on_timer_task(self, event: Any) -> None:
        if time.monotonic() - self.last > self.quiet:
            self.conn.close()
        else:
            event.container.schedule(0.5, self)

    def on_transport_error(self, event: Any) -> None:
        raise RuntimeError(f"draining {self.url}: {event.transport.condition}")


@dataclass
class Run:
    accepted: int
    fill_seconds: float
    takeover: float
    serving_logged: float
    drained: int
    lost: int
    duplicated: int


def _open_when_serving(url: str, timeout: float) -> None:
    """Return once an AMQP connection to `url` opens (a waiting member refuses)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            BlockingConnection(url, timeout=10).close()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def run_once(pair: Pair, args: argparse.Namespace, timeout: float) -> Run:
    pair.start(timeout=120)
    try:
        fill = _Fill(pair.primary.url, args.messages, args.size)
        started = time.monotonic()
        Container(fill).run()
        fill_seconds = time.monotonic() - started
        assert pair.primary.proc is not None
        killed_wall = time.time()
        killed = time.monotonic()
        pair.primary.proc.send_signal(signal.SIGKILL)
        pair.primary.proc.wait(10)  # reaped at once, as a service manager does
        _open_when_serving(pair.backup.url, timeout)
        takeover = time.monotonic() - killed
        pair.backup.wait_logged(SERVING, timeout=30)
        serving_logged = pair.backup.logged_at(SERVING)[0] - killed_wall
        drain = _Drain(pair.backup.url)
        Container(drain).run()
        got = {int(i.rsplit("-", 1)[1]) for i in drain.ids}
        return Run(
            accepted=len(fill.accepted),
            fill_seconds=fill_seconds,
            takeover=takeover,
            serving_logged=serving_logged,
            drained=len(drain.ids),
            lost=len(fill.accepted - got),
            duplicated=len(drain.ids) - len(set(drain.ids)),
        )
    finally:
        pair.close()


def _database(url: str, args: argparse.Namespace, run: int, external: bool) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "url": url,
        "jdbc-lock-renew-period": args.lock_renew_period,
        "jdbc-lock-expiration": args.lock_expiration,
    }
    if external:  # tables of their own in a database we did not create
        suffix = f"_FAILOVER{int(time.time())}_{run}"
        for key, table in (
            ("bindings-table-name", "BINDINGS"),
            ("message-table-name", "MESSAGES"),
            ("page-store-table-name", "PAGE_STORE"),
            ("node-manager-store-table-name", "NODE_MANAGER_STORE"),
        ):
            settings[key] = table + suffix
    return settings


def report(store: str, runs: list[Run], goal: float) -> None:
    for i, r in enumerate(runs, 1):
        print(
            f"  run {i}: {r.accepted} accepted in {r.fill_seconds:.1f} s; SIGKILL -> backup "
            f"accepts a connection {r.takeover:.2f} s ('ha: serving' logged at "
            f"{r.serving_logged:.2f} s); drained {r.drained}, lost {r.lost}, "
            f"duplicated {r.duplicated}",
            flush=True,
        )
    median = statistics.median(r.takeover for r in runs)
    lost = sum(r.lost for r in runs)
    verdict = "meets" if median <= goal and lost == 0 else "MISSES"
    print(
        f"{store}: median takeover {median:.2f} s (goal <= {goal:g} s), messages lost {lost} "
        f"over {len(runs)} runs: {verdict} the goal",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stores", default="file,database", help="file, database or both")
    parser.add_argument(
        "--database-url", help="a PostgreSQL SQLAlchemy URL (default: a private server)"
    )
    parser.add_argument(
        "--lock-poll-period", type=int, default=200, help="[ha] lock-poll-period, ms"
    )
    parser.add_argument("--lock-expiration", type=int, default=20_000, help="ms")
    parser.add_argument("--lock-renew-period", type=int, default=2_000, help="ms")
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir)")
    args = parser.parse_args()
    stores = args.stores.split(",")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scow-failover-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.messages} durable messages of {args.size} bytes, {args.runs} runs, "
        f"lock-poll-period {args.lock_poll_period} ms; logs under {workdir}",
        flush=True,
    )
    server: PostgresServer | None = None
    ha = {"lock-poll-period": args.lock_poll_period}
    try:
        if "file" in stores:
            runs = [
                run_once(Pair(workdir / f"file-{i}", ha=ha), args, timeout=120)
                for i in range(1, args.runs + 1)
            ]
            report("file store", runs, GOAL_FILE)
        if "database" in stores:
            url = args.database_url
            if url is None:
                bin_dir = binaries()
                if bin_dir is None:
                    print("database store left out: no PostgreSQL server binaries")
                    return 0
                server = PostgresServer(Path(tempfile.mkdtemp(prefix="scow-pg-")), bin_dir)
                server.init()
                server.start()
            goal = args.lock_expiration / 1000 + GOAL_DATABASE_MARGIN
            runs = []
            for i in range(1, args.runs + 1):
                run_url = url or server.url(server.create_database())  # type: ignore[union-attr]
                settings = _database(run_url, args, i, external=url is not None)
                pair = Pair(
                    workdir / f"database-{i}",
                    ha=ha,
                    database={"primary": settings, "backup": settings},
                )
                runs.append(run_once(pair, args, timeout=goal + 120))
            print(
                f"  (jdbc-lock-renew-period {args.lock_renew_period} ms, "
                f"jdbc-lock-expiration {args.lock_expiration} ms)"
            )
            report("database store (PostgreSQL)", runs, goal)
    finally:
        if server is not None:
            server.stop("immediate")
            shutil.rmtree(server.directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
