"""Large messages through `scow run`: MB/s each way and the broker's RSS growth.

Starts `scow run` (amqp, file journal, standard queues) on a free loopback port with a
temporary data dir, then one producer sends --count durable messages of --size bytes
(each accepted only once its file and journal record are synced), and one consumer
receives and accepts them all. Both clients stream: they are built on proton's engine
and never hold a message whole, so the figures are the broker's (and the disk's). The
broker's RSS is sampled every 50 ms; growth is its peak less its RSS before the first
message.

    .venv/bin/python benchmarks/large_messages.py                      # 10 x 1 GiB
    .venv/bin/python benchmarks/large_messages.py --count 1000 --size 1MiB
    .venv/bin/python benchmarks/large_messages.py --together           # both at once
    .venv/bin/python benchmarks/large_messages.py --store postgresql   # bodies as rows

`--store sqlite|postgresql` runs the broker on the database store (journal and bodies in
the database); postgresql starts a private server from the installed binaries (as the
tests do) unless --postgres-url names one.

Goals (issue 18): >= 150 MB/s each way, RSS growth <= 64 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_perf import free_port, platform_line, scow_command, stop, wait_listening

from scow.core.address_settings import parse_size
from scow.protocols.amqp import engine

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "database-store"]
CONFIG = """\
[plugins]
enable = {plugins}

[broker]
data-dir = "{data_dir}"
log-level = "warning"
large-message-sync = {sync}
journal = "{journal}"

[database]
url = "{database_url}"

[amqp]
listen = ["127.0.0.1:{port}"]
max-message-size = "2GiB"

[address-settings."#"]
default-address-routing-type = "ANYCAST"
"""

#: A durable header, then a data section of a 32-bit length: what a client sends for a
#: durable message with a binary body; the body follows in chunks.
_HEADER = b"\x00\x53\x70\xc0\x02\x01\x41"
_DATA = struct.Struct(">4sI")
CHUNK = 1 << 20
#: Bytes a client lets its session hold beyond what the peer's window lets out.
WINDOW = 4 << 20
#: proton (0.40) crashes (in pn_transport_peek) the sending side of a connection once
#: about 2 GiB in all went out on it: the producer connects again before that.
CONNECTION_BYTES = 1 << 30


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Sampler(threading.Thread):
    """The broker's RSS every 50 ms: its value at start and its peak."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.start_rss = self.peak = rss_bytes(pid)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_bytes(self.pid))


class Client:
    """One AMQP connection on proton's engine over a non-blocking socket."""

    def __init__(self, port: int, name: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.engine = engine.Engine(max_frame=1 << 20, idle_timeout_ms=0, server=False)
        engine.stop_events(self.engine)
        engine.client_open(self.engine.connection, name)
        self.session = engine.new_session(self.engine.connection)
        self.out = memoryview(b"")

    def io(self, timeout: float) -> None:
        """Write what the engine has; read what has arrived (waiting up to `timeout`)."""
        if not self.out:
            self.out = memoryview(self.engine.output() or b"")
        want_write = [self.sock] if self.out else []
        readable, writable, _ = select.select([self.sock], want_write, [], timeout)
        if writable:
            try:
                sent = self.sock.send(self.out)
                self.out = self.out[sent:]  # a view: no copy of what is left
            except BlockingIOError:
                pass
        if readable:
            data = self.sock.recv(1 << 20)
            if not data:
                raise SystemExit("the broker closed the connection")
            self.engine.push(data)

    def close(self) -> None:
        self.sock.close()


def produce(port: int, address: str, count: int, size: int) -> float:
    """Send `count` durable messages of `size` body bytes; seconds until all accepted."""
    client = Client(port, "producer")
    link = engine.new_sender(client.session, "producer", address)
    body = os.urandom(CHUNK)
    deliveries: list[Any] = []
    sent = 0
    started = time.monotonic()
    for n in range(count):
        if sent + size > CONNECTION_BYTES:  # see CONNECTION_BYTES
            _wait_accepted(client, deliveries)
            client.close()
            client = Client(port, "producer")
            link = engine.new_sender(client.session, "producer", address)
            deliveries, sent = [], 0
        sent += size
        while engine.link_credit(link) <= 0:
            client.io(0.05)
        delivery = engine.begin_send(
            link, struct.pack(">Q", n), _HEADER + _DATA.pack(b"\x00\x53\x75\xb0", size)
        )
        left = size
        while left:
            while left and engine.session_outgoing_bytes(client.session) < WINDOW:
                piece = body if left >= CHUNK else body[:left]
                engine.send_more(link, piece)
                left -= len(piece)
            client.io(0 if left else 0.001)
        engine.link_advance(link)
        deliveries.append(delivery)
    _wait_accepted(client, deliveries)
    seconds = time.monotonic() - started
    client.close()
    return seconds


def _wait_accepted(client: Client, deliveries: list[Any]) -> None:
    while not all(engine.delivery_remote_state(d) == engine.ACCEPTED for d in deliveries):
        states = [engine.delivery_remote_state(d) for d in deliveries]
        if any(state not in (0, engine.ACCEPTED) for state in states):
            refused = deliveries[states.index(engine.REJECTED)]
            raise SystemExit(f"the broker refused a message: {engine.rejection(refused)}")
        client.io(0.05)


def consume(port: int, address: str, count: int) -> tuple[float, int]:
    """Receive and accept `count` messages; (seconds, bytes received)."""
    client = Client(port, "consumer")
    link = engine.new_receiver(client.session, "consumer", address, 1)
    buf, _view = engine.new_buffer(CHUNK)
    received = total = 0
    started = time.monotonic()
    while received < count:
        client.io(0.05)
        delivery = engine.link_current(link)
        while delivery and engine.delivery_readable(delivery):
            got = engine.link_recv(link, buf, CHUNK)
            if got > 0:
                total += got
                continue
            if engine.delivery_partial(delivery):
                break
            engine.delivery_update(delivery, engine.ACCEPTED)
            engine.delivery_settle(delivery)  # settle advances the link
            received += 1
            engine.link_flow(link, 1)
            delivery = engine.link_current(link)
    seconds = time.monotonic() - started
    while client.engine.output():  # the last accept
        client.io(0.05)
    client.close()
    return seconds, total


@contextlib.contextmanager
def broker(
    workdir: Path,
    sync: bool,
    database_url: str | None,
    plugins: list[str] = PLUGINS,
    extra: str = "",
) -> Iterator[tuple[int, int]]:
    """`scow run` on a free port, on the database store with `database_url` ("" for
    SQLite) or else on files, with `plugins` and `extra` config; yields (port, pid)."""
    port = free_port()
    config = workdir / "scow.toml"
    config.write_text(
        CONFIG.format(
            plugins=json.dumps(plugins),
            data_dir=workdir / "data",
            port=port,
            sync=str(sync).lower(),
            journal="file" if database_url is None else "database",
            database_url=database_url or "",
        )
        + extra
    )
    log = workdir / "broker.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*scow_command(), "run", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_listening(port, proc, "scow run", log)
        yield port, proc.pid
    finally:
        stop(proc)


@contextlib.contextmanager
def _database(args: argparse.Namespace, root: Path) -> Iterator[str | None]:
    """The database URL `--store` asks for (None: files; "": SQLite under the data dir)."""
    if args.store == "file":
        yield None
        return
    if args.store == "sqlite":
        yield ""
        return
    from database_bench import _postgres

    url, server = _postgres(args, root)
    if url is None:
        raise SystemExit("--store postgresql: no PostgreSQL binaries and no --postgres-url")
    try:
        yield url
    finally:
        if server is not None:
            server.stop("immediate")
            shutil.rmtree(server.directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--size", default="1GiB", help="body bytes per message (1GiB, 1MiB)")
    parser.add_argument("--together", action="store_true", help="produce and consume at once")
    parser.add_argument("--dir", default=None, help="where the data dir goes (default: tmp)")
    parser.add_argument(
        "--no-sync", action="store_true", help="large-message-sync = false (files not synced)"
    )
    parser.add_argument(
        "--store",
        choices=["file", "sqlite", "postgresql"],
        default="file",
        help="where journal and bodies go: files, or the database store on SQLite/PostgreSQL",
    )
    parser.add_argument("--postgres-url", help="with --store postgresql: use this server")
    args = parser.parse_args()
    size = parse_size(args.size, "--size")
    print(platform_line())
    with (
        tempfile.TemporaryDirectory(dir=args.dir) as tmp,
        _database(args, Path(tmp)) as database_url,
        broker(Path(tmp), not args.no_sync, database_url) as (port, pid),
    ):
        free = os.statvfs(tmp)
        if free.f_bavail * free.f_frsize < args.count * size * 1.1:
            raise SystemExit(f"not enough disk under {tmp} for {args.count} x {size} bytes")
        time.sleep(0.5)
        sampler = Sampler(pid)
        sampler.start()
        total_mb = args.count * size / 1e6
        if args.together:
            result: dict[str, object] = {}
            thread = threading.Thread(
                target=lambda: result.update(produced=produce(port, "large", args.count, size))
            )
            thread.start()
            consumed, got = consume(port, "large", args.count)
            thread.join()
            produced = float(result["produced"])  # type: ignore[arg-type]
        else:
            produced = produce(port, "large", args.count, size)
            consumed, got = consume(port, "large", args.count)
        sampler.done.set()
        sampler.join()
        mode = "together" if args.together else "produce, then consume"
        if args.store != "file":
            mode += f", database store on {args.store}"
        if args.no_sync:
            mode += ", large-message-sync = false"
        print(f"{args.count} x {args.size} durable messages ({mode}):")
        print(f"  produce  {total_mb / produced:8.1f} MB/s  ({produced:.1f} s, all accepted)")
        print(f"  consume  {got / 1e6 / consumed:8.1f} MB/s  ({consumed:.1f} s)")
        growth = (sampler.peak - sampler.start_rss) / (1 << 20)
        print(
            f"  broker RSS {sampler.start_rss / (1 << 20):.1f} MiB at start, peak "
            f"{sampler.peak / (1 << 20):.1f} MiB: growth {growth:.1f} MiB"
        )


if __name__ == "__main__":
    main()
