"""Which TLS transport the broker's event loop should use: the loop's own, or ssl.MemoryBIO.

The AMQP server keeps TLS in the transport so the protocol sees plain bytes. Two ways do
that on an asyncio loop (uvloop when installed, as `scow run` uses):

- `loop`: `loop.create_server(..., ssl=context)`, the loop's TLS transport (uvloop's is
  written in Cython), which is what `scow.protocols.amqp.server` uses;
- `memorybio`: a plain TCP server whose protocol runs an `ssl.SSLObject` over two
  `ssl.MemoryBIO`s itself, in Python.

Each server echoes what it receives (so it both decrypts and encrypts every byte, like a
broker relaying messages); a client in another process (its own core, its own GIL) sends
`--megabytes` in `--write-size` writes over TLS 1.3 and reads the echo back. Rounds alternate;
the figure is the median echo throughput per transport, and their ratio.

    .venv/bin/python benchmarks/tls_transport_bench.py [--megabytes 200] [--write-size 16384]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository, for the test helpers' CA

from tests.security.helpers import make_pki  # noqa: E402

CLIENT = """
import socket, ssl, sys, time
host, port, ca, total = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
context = ssl.create_default_context(cafile=ca)
chunk = b"x" * int(sys.argv[5])
with socket.create_connection((host, port)) as raw:
    with context.wrap_socket(raw, server_hostname="localhost") as sock:
        sock.setblocking(True)
        start = time.perf_counter()
        sent = received = 0
        while received < total:
            if sent < total and sent - received < 1 << 20:
                sock.sendall(chunk)
                sent += len(chunk)
            else:
                received += len(sock.recv(1 << 16))
        print(time.perf_counter() - start)
"""


class LoopTlsEcho(asyncio.Protocol):
    """The loop's TLS transport hands plain bytes in and takes plain bytes out."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class MemoryBioEcho(asyncio.Protocol):
    """TLS run by the protocol itself over two MemoryBIOs on a plain TCP transport."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.handshaken = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.incoming.write(data)
        if not self.handshaken:
            try:
                self.tls.do_handshake()
                self.handshaken = True
            except ssl.SSLWantReadError:
                pass
        if self.handshaken:
            while True:
                try:
                    plain = self.tls.read(1 << 17)
                except ssl.SSLWantReadError:
                    break
                if not plain:
                    break
                self.tls.write(plain)
        pending = self.outgoing.read()
        if pending:
            self.transport.write(pending)


async def _round(kind: str, context: ssl.SSLContext, ca: Path, total: int, write: int) -> float:
    loop = asyncio.get_running_loop()
    if kind == "loop":
        server = await loop.create_server(LoopTlsEcho, "127.0.0.1", 0, ssl=context)
    else:
        server = await loop.create_server(lambda: MemoryBioEcho(context), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CLIENT,
            "127.0.0.1",
            str(port),
            str(ca),
            str(total),
            str(write),
            stdout=subprocess.PIPE,
        )
        out, _ = await client.communicate()
        return total / float(out) / 2**20
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-size", type=int, default=16384, help="the client's writes")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(pki.server_cert, pki.server_key)
        total = args.megabytes << 20
        rates: dict[str, list[float]] = {"loop": [], "memorybio": []}
        print(
            f"TLS echo of {args.megabytes} MiB in {args.write_size} B writes, {loop_name}, TLS 1.3"
        )
        for n in range(args.rounds):
            for kind in rates:
                rate = asyncio.run(_round(kind, context, pki.ca, total, args.write_size))
                rates[kind].append(rate)
                print(f"round {n + 1} {kind:<9} {rate:8.1f} MiB/s")
                time.sleep(0.2)
    loop_rate, bio_rate = (statistics.median(rates[k]) for k in ("loop", "memorybio"))
    print(
        f"median: loop TLS {loop_rate:.1f} MiB/s, MemoryBIO {bio_rate:.1f} MiB/s, "
        f"MemoryBIO / loop {bio_rate / loop_rate:.2f}"
    )


if __name__ == "__main__":
    main()
