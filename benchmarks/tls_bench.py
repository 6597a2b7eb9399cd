"""What TLS costs: throughput over TLS vs plain AMQP in the same run, and the login rates.

Starts one `scow run` (uvloop, as `scow run` uses when installed) listening both plain
and TLS (a throwaway CA and server certificate made here with `cryptography`), then
alternates `scow perf client` runs on the two listeners (1 pair, 100 B bodies,
at-least-once, --count messages each) and prints each run, the median receive rates and
their ratio (goal: TLS >= 70 % of plain). Then it measures logins per second over plain
TCP: SCRAM-SHA-256 and PLAIN against a users file at the default 4096 PBKDF2 rounds,
each login a fresh connection from one client (whose own PBKDF2 for SCRAM is included),
and the server's share of a SCRAM login measured in-process.

    .venv/bin/python benchmarks/tls_bench.py                 # 3 runs each, 200k messages
    .venv/bin/python benchmarks/tls_bench.py --runs 5 --count 500000 --logins 500
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository, for the test helpers' CA

from run_perf import free_port, scow_command, stop, wait_listening  # noqa: E402

from scow.core.security.scram import Credential, ScramClient, ScramServer  # noqa: E402
from scow.core.security.users import add_user  # noqa: E402
from scow.protocols.amqp.sasl import sasl_frame  # noqa: E402
from scow.protocols.amqp.sasl_client import read_frame  # noqa: E402
from tests.security.helpers import make_pki, scram_login  # noqa: E402

CONFIG = """\
[plugins]
enable = ["amqp", "memory-journal", "standard-queues", "full-policies"]

[broker]
data-dir = "{data_dir}"
log-level = "warning"

[security]
users-file = "{users}"

[amqp]
listen = ["127.0.0.1:{port}"]
listen-tls = ["127.0.0.1:{tls_port}"]

[tls]
cert-file = "{cert}"
key-file = "{key}"

[address-settings."#"]
default-address-routing-type = "ANYCAST"
default-queue-routing-type = "ANYCAST"
"""


def perf(url: str, args: argparse.Namespace, ca: Path) -> dict[str, Any]:
    command = [
        *scow_command(),
        "perf",
        "client",
        "--url",
        url,
        "--count",
        str(args.count),
        "--size",
        "100",
        "--ca-file",
        str(ca),
        "--json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"perf client failed ({done.returncode}):\n{done.stderr}{done.stdout}")
    return dict(json.loads(lines[-1]))


def plain_login(port: int, user: str, password: str) -> int:
    from scow.protocols.amqp.codec import Symbol

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"AMQP\x03\x01\x00\x00")
        sock.recv(8)
        read_frame(sock)
        sock.sendall(sasl_frame(0x41, [Symbol("PLAIN"), f"\0{user}\0{password}".encode()]))
        return int(read_frame(sock).value[0])


def login_rate(login: Any, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        assert login() == 0, "login refused"
    return count / (time.perf_counter() - start)


def server_scram_us(credential: Credential, count: int = 200) -> float:
    """Microseconds the server spends on one SCRAM exchange (the client's work excluded)."""
    exchanges = []
    for _ in range(count):
        client = ScramClient("bench", "secret")
        server = ScramServer(lambda _name: credential)
        first = client.first()
        start = time.perf_counter()
        challenge = server.first(first)
        spent = time.perf_counter() - start
        final = client.final(challenge)
        start = time.perf_counter()
        server.final(final)
        exchanges.append(spent + time.perf_counter() - start)
    return statistics.median(exchanges) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--logins", type=int, default=300)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="scow-tls-bench-") as tmp:
        work = Path(tmp)
        pki = make_pki(work / "pki")
        users = work / "users.toml"
        user = add_user(users, "bench", "secret")  # default PBKDF2 rounds
        port, tls_port = free_port(), free_port()
        config = work / "scow.toml"
        config.write_text(
            CONFIG.format(
                data_dir=work / "data",
                users=users,
                port=port,
                tls_port=tls_port,
                cert=pki.server_cert,
                key=pki.server_key,
            )
        )
        log = work / "broker.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [*scow_command(), "run", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_listening(tls_port, proc, "scow run", log)
            rates: dict[str, list[float]] = {"plain": [], "tls": []}
            for run in range(args.runs):
                for kind, url in (
                    ("plain", f"amqp://127.0.0.1:{port}/bench.plain.{run}"),
                    ("tls", f"amqps://localhost:{tls_port}/bench.tls.{run}"),
                ):
                    result = perf(url, args, pki.ca)
                    rates[kind].append(result["receive_rate"])
                    print(
                        f"run {run + 1} {kind:<5} send {result['send_rate']:>9,.0f} msg/s   "
                        f"receive {result['receive_rate']:>9,.0f} msg/s   "
                        f"p50 {result['latency_ms']['p50']:.2f} ms"
                    )
            plain, tls = statistics.median(rates["plain"]), statistics.median(rates["tls"])
            print(
                f"median receive: plain {plain:,.0f} msg/s, TLS {tls:,.0f} msg/s, "
                f"TLS/plain {tls / plain:.2f} (goal >= 0.70)"
            )

            scram = login_rate(lambda: _scram(port), args.logins)
            plain_rate = login_rate(lambda: plain_login(port, "bench", "secret"), args.logins)
            print(
                f"logins/s over one client, {user.credential.iterations} PBKDF2 rounds: "
                f"SCRAM-SHA-256 {scram:,.0f}, PLAIN {plain_rate:,.0f}"
            )
            print(
                f"server time per SCRAM login (in-process): "
                f"{server_scram_us(user.credential):,.0f} us"
            )
        finally:
            stop(proc)


def _scram(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        return scram_login(sock, "bench", "secret")


if __name__ == "__main__":
    main()
