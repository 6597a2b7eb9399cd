"""Large messages over STOMP through `scow run`: the broker's RSS growth and MB/s each way.

Starts `scow run` (amqp, stomp, file journal, standard queues) with a temporary data dir.
A STOMP producer sends --count persistent messages of --size bytes (a SEND with
content-length, or with --text a text body ended by its NUL alone; written 1 MiB at a
time, each waited on for its RECEIPT: on disk), then a
STOMP subscriber (ack client-individual) reads each MESSAGE as it comes, checks its
length and last byte, and ACKs it. Neither client holds a message whole, so the RSS is the
broker's: sampled every 50 ms, growth is its peak less its RSS before the first message.

    .venv/bin/python benchmarks/stomp_large.py                          # 1 x 256 MiB
    .venv/bin/python benchmarks/stomp_large.py --count 4 --size 64MiB
    .venv/bin/python benchmarks/stomp_large.py --text                   # no content-length

Goal (issue 18): the broker's RSS growth flat-ish, well under 64 MiB.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from large_messages import PLUGINS, Sampler, broker
from run_perf import free_port, platform_line

from scow.core.address_settings import parse_size

CHUNK = 1 << 20


class Stomp:
    """A blocking STOMP 1.2 connection that reads frames' heads and bodies apart."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buffer = bytearray()
        self.sock.sendall(b"CONNECT\naccept-version:1.2\nhost:bench\nheart-beat:0,0\n\n\x00")
        self.expect("CONNECTED")

    def _more(self) -> None:
        data = self.sock.recv(CHUNK)
        if not data:
            raise SystemExit("the broker closed the connection")
        self.buffer += data

    def head(self) -> tuple[str, dict[str, str]]:
        """The next frame's command and headers; its body is left to read."""
        while (end := self.buffer.find(b"\n\n")) == -1:
            self._more()
        command, *lines = bytes(self.buffer[:end]).lstrip(b"\n").decode().split("\n")
        del self.buffer[: end + 2]
        return command, dict(line.split(":", 1) for line in lines)

    def expect(self, command: str) -> dict[str, str]:
        got, headers = self.head()
        body = self.body(int(headers.get("content-length", 0)))
        if got != command:
            raise SystemExit(f"expected {command}, got {got} {headers} {body[-200:]!r}")
        return headers

    def body(self, length: int) -> bytes:
        """Read a body of `length` bytes and its NUL, keeping only its last 200 bytes."""
        left = length + 1
        tail = b""
        while left:
            if not self.buffer:
                self._more()
            take = min(left, len(self.buffer))
            tail = (tail + bytes(self.buffer[:take]))[-201:]
            del self.buffer[:take]
            left -= take
        if tail[-1:] != b"\x00":
            raise SystemExit("a frame not ended by NUL")
        return tail[:-1]


def pattern(text: bool) -> bytes:
    """The bytes every body repeats: all 256 values, or printable ASCII (text, no NUL)."""
    return (bytes(range(32, 96)) if text else bytes(range(256))) * (CHUNK // (64 if text else 256))


def produce(port: int, count: int, size: int, text: bool) -> float:
    """Send `count` persistent messages, each waited on for its receipt; seconds taken."""
    client = Stomp(port)
    chunk = pattern(text)
    length = "" if text else f"content-length:{size}\n"
    started = time.perf_counter()
    for n in range(count):
        head = f"SEND\ndestination:large\npersistent:true\nreceipt:{n}\n{length}\n"
        client.sock.sendall(head.encode())
        for start in range(0, size, CHUNK):
            client.sock.sendall(chunk[: min(CHUNK, size - start)])
        client.sock.sendall(b"\x00")
        client.expect("RECEIPT")
    elapsed = time.perf_counter() - started
    client.sock.close()
    return elapsed


def consume(port: int, count: int, size: int, text: bool) -> float:
    """Receive and ACK `count` messages of `size` bytes; seconds taken."""
    client = Stomp(port)
    last = pattern(text)[(size - 1) % CHUNK]
    started = time.perf_counter()
    client.sock.sendall(b"SUBSCRIBE\nid:1\ndestination:large\nack:client-individual\n\n\x00")
    for _ in range(count):
        command, headers = client.head()
        length = int(headers["content-length"])
        tail = client.body(length)
        if command != "MESSAGE" or length != size or tail[-1] != last:
            raise SystemExit(f"got {command} of {length} bytes, expected MESSAGE of {size}")
        client.sock.sendall(f"ACK\nid:{headers['ack']}\n\n\x00".encode())
    client.sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")  # after the ACKs
    client.expect("RECEIPT")
    elapsed = time.perf_counter() - started
    client.sock.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--size", default="256MiB", help="body bytes per message (256MiB)")
    parser.add_argument(
        "--text", action="store_true", help="SENDs without content-length (text ended by NUL)"
    )
    args = parser.parse_args()
    size = parse_size(args.size, "--size")
    stomp_port = free_port()
    # the default max-frame-size (10 MiB) and max-message-size (1 GiB) apply
    extra = f'\n[stomp]\nlisten = ["127.0.0.1:{stomp_port}"]\n'
    print(platform_line())
    with (
        tempfile.TemporaryDirectory() as tmp,
        broker(Path(tmp), True, None, [*PLUGINS, "stomp"], extra) as (_port, pid),
    ):
        time.sleep(0.5)
        sampler = Sampler(pid)
        sampler.start()
        produced = produce(stomp_port, args.count, size, args.text)
        in_peak = sampler.peak
        consumed = consume(stomp_port, args.count, size, args.text)
        sampler.done.set()
        sampler.join()
    total_mb = args.count * size / 1e6
    mib = 1 << 20
    kind = "text SENDs without content-length" if args.text else "SENDs with content-length"
    print(f"{args.count} x {args.size} persistent messages over STOMP, {kind}, then consumed:")
    print(f"  SEND     {total_mb / produced:8.1f} MB/s  ({produced:.1f} s, all receipted)")
    print(f"  MESSAGE  {total_mb / consumed:8.1f} MB/s  ({consumed:.1f} s, all acknowledged)")
    print(
        f"  broker RSS {sampler.start_rss / mib:.1f} MiB at start, peak "
        f"{in_peak / mib:.1f} MiB while sending, {sampler.peak / mib:.1f} MiB in all: "
        f"growth {(sampler.peak - sampler.start_rss) / mib:.1f} MiB"
    )


if __name__ == "__main__":
    main()
