"""STOMP against AMQP on one broker: 1 producer + 1 consumer, 100 B non-persistent
messages, the consumer acknowledging (STOMP ack mode `client`), same run, alternating.

The broker (`scow run`, file journal, the stomp plugin on) is a subprocess; AMQP is
driven by `scow perf client`, STOMP by a lean asyncio client below (stomp.py's threads
would measure the client): the producer writes SEND frames as fast as the socket takes
them, the consumer ACKs the last MESSAGE of every read (cumulative, as ack `client`
means). A rate is messages over the time from the first send to the last receive.

    .venv/bin/python benchmarks/stomp_bench.py [--rounds 3] [--count 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from paging_bench import PLUGINS, Broker, client
from run_perf import free_port, platform_line

BODY = b"x" * 100
BATCH = 200  # SEND frames per write


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"CONNECT\naccept-version:1.2\nhost:bench\nheart-beat:0,0\n\n\x00")
    connected = await reader.readuntil(b"\x00")
    if not connected.startswith(b"CONNECTED"):
        raise SystemExit(f"CONNECT refused: {connected!r}")
    return reader, writer


async def _produce(port: int, destination: str, count: int) -> float:
    """Send `count` messages; the time the first went out."""
    _reader, writer = await _connect(port)
    frame = (
        f"SEND\ndestination:{destination}\ncontent-length:{len(BODY)}\n\n".encode() + BODY + b"\x00"
    )
    started = time.perf_counter()
    for sent in range(0, count, BATCH):
        writer.write(frame * min(BATCH, count - sent))
        await writer.drain()
    writer.write(b"DISCONNECT\n\n\x00")
    await writer.drain()
    writer.close()
    return started


async def _consume(port: int, destination: str, count: int, subscribed: asyncio.Event) -> float:
    """Receive and acknowledge `count` messages; the time the last arrived."""
    reader, writer = await _connect(port)
    writer.write(f"SUBSCRIBE\nid:1\ndestination:{destination}\nack:client\n\n\x00".encode())
    writer.write(b"SUBSCRIBE\nid:sync\ndestination:bench.sync\nreceipt:ready\n\n\x00")
    await reader.readuntil(b"receipt-id:ready")
    await reader.readuntil(b"\x00")
    subscribed.set()
    received = 0
    buffer = b""
    while received < count:
        chunk = await reader.read(1 << 16)
        if not chunk:
            raise SystemExit(f"the broker closed the consumer after {received} messages")
        buffer += chunk
        frames = buffer.split(b"\x00")
        buffer = frames.pop()  # an incomplete frame waits for the next read
        messages = [f for f in frames if f.lstrip(b"\n").startswith(b"MESSAGE")]
        received += len(messages)
        if messages:
            last = messages[-1]
            start = last.index(b"\nack:") + 5
            ack_id = last[start : last.index(b"\n", start)]
            writer.write(b"ACK\nid:" + ack_id + b"\n\n\x00")
    done = time.perf_counter()
    writer.write(b"DISCONNECT\n\n\x00")
    await writer.drain()
    writer.close()
    return done


async def stomp_pair(port: int, destination: str, count: int) -> float:
    """Messages per second of one producer + one consumer over STOMP."""
    subscribed = asyncio.Event()
    consumer = asyncio.create_task(_consume(port, destination, count, subscribed))
    await subscribed.wait()
    started = await _produce(port, destination, count)
    done = await consumer
    return count / (done - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=100_000)
    args = parser.parse_args()
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    rates: dict[str, list[float]] = {"amqp": [], "stomp": []}
    with tempfile.TemporaryDirectory(prefix="scow-stomp-") as tmp:
        stomp_port = free_port()
        broker = Broker(
            Path(tmp) / "b",
            plugins=PLUGINS + ', "stomp"',
            extra=f'[stomp]\nlisten = ["127.0.0.1:{stomp_port}"]\n',
        )
        broker.start()
        try:
            for n in range(args.rounds):
                amqp = client(
                    f"{broker.url}/amqp{n}", "--count", str(args.count), "--size", str(len(BODY))
                )
                rates["amqp"].append(amqp["receive_rate"])
                rates["stomp"].append(asyncio.run(stomp_pair(stomp_port, f"stomp{n}", args.count)))
                print(
                    f"round {n + 1}  amqp {rates['amqp'][-1]:>10,.0f} msg/s  "
                    f"stomp {rates['stomp'][-1]:>10,.0f} msg/s"
                )
        finally:
            broker.stop()
    medians = {name: statistics.median(r) for name, r in rates.items()}
    for name, median in medians.items():
        print(f"median {name:<6} {median:>10,.0f} msg/s")
    print(f"ratio stomp / amqp: {medians['stomp'] / medians['amqp']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
