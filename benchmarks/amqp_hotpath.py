"""Per-message CPU of the broker's AMQP layer and kernel together, without sockets.

`run_perf.py`'s broker CPU per message moves with the machine's load: the busier the
machine, the fewer messages each socket read brings, and the more each costs. Here the
batches are fixed. A broker runs in process; a proton client end (in the same process,
its CPU not counted) sends BATCH messages on a producer connection, hands the bytes to
the broker's `AmqpConnection.data_received`, then accepts and settles what the consumer
connection received, as `scow perf client` does (1 pair, 100 B, at-least-once). Only
the broker's calls are timed (CPU, `time.process_time`), so two checkouts run alternately
compare the code, not the machine:

    .venv/bin/python benchmarks/amqp_hotpath.py [COUNT] [BATCH] [PLUGINS]

(defaults 200000, 500, amqp,memory-journal,standard-queues,full-policies).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from scow.core import app
from scow.core.testing import broker_config, write_config
from scow.protocols.amqp import engine
from scow.protocols.amqp.connection import AmqpConnection
from scow.protocols.amqp.perf.messages import make_message

CREDIT = 1000  # the consumer's window, as `scow perf client` gives it
ROUNDS = 7


class Socket:
    """The asyncio transport an `AmqpConnection` writes to: keeps what it is given."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def take(self) -> bytes:
        data, self.out = b"".join(self.out), []
        return data

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Client:
    """One client connection: a proton engine whose bytes go to a broker connection."""

    def __init__(self, amqp: Any) -> None:
        self.engine = engine.Engine(max_frame=1 << 20, idle_timeout_ms=0, server=False)
        engine.stop_events(self.engine)
        self.socket = Socket()
        self.broker_side = AmqpConnection(amqp)
        self.broker_side.connection_made(self.socket)  # type: ignore[arg-type]
        engine.client_open(self.engine.connection, "bench")
        self.session = engine.new_session(self.engine.connection)
        self.cpu = 0.0

    async def exchange(self) -> None:
        """Bytes both ways until neither end has any; the broker's part is timed."""
        while True:
            out = self.engine.output() or b""
            if out:
                start = time.process_time()
                self.broker_side.data_received(out)
                await asyncio.sleep(0)  # the flushes the connection scheduled run here
                self.cpu += time.process_time() - start
            back = self.socket.take()
            if back:
                self.engine.push(back)
            if not out and not back:
                return


async def run(count: int, batch: int, plugins: str) -> list[float]:
    data_dir = Path(tempfile.mkdtemp())
    config = write_config(
        data_dir / "s.toml", broker_config(data_dir / "data", plugins=plugins.split(","))
    )
    server = app.Server(*app.load(config))
    await server.start()
    amqp = server.protocols["amqp"]
    producer, consumer = Client(amqp), Client(amqp)
    sender = engine.new_sender(producer.session, "p", "hot")
    receiver = engine.new_receiver(consumer.session, "c", "hot", CREDIT)
    for client in (producer, consumer):
        await client.exchange()
    message, _ = make_message(100, durable=False)
    tag, tag_view = engine.new_tag()
    buf = engine.new_buffer(len(message) + 64)[0]
    results = []
    unsettled: deque[Any] = deque()
    for _ in range(ROUNDS):
        producer.cpu = consumer.cpu = 0.0
        sent = received = 0
        while received < count:
            room = min(batch, count - sent, engine.link_credit(sender))
            for _ in range(room):
                sent += 1
                tag_view[:8] = sent.to_bytes(8, "big")
                unsettled.append(engine.new_delivery(sender, tag))
                engine.link_send(sender, message, len(message))
                engine.link_advance(sender)
            await producer.exchange()
            await consumer.exchange()
            received += _consume(receiver, buf)
            await consumer.exchange()
            _settle_accepted(unsettled)
            await producer.exchange()
            credit = engine.link_credit(receiver)
            if credit <= CREDIT // 2:
                engine.link_flow(receiver, CREDIT - credit)
                await consumer.exchange()
        results.append((producer.cpu + consumer.cpu) / count * 1e9)
    await server.stop()
    return results


def _consume(receiver: Any, buf: Any) -> int:
    """Read, accept and settle every complete delivery; returns how many."""
    got = 0
    while True:
        delivery = engine.link_current(receiver)
        if not delivery or engine.delivery_partial(delivery):
            return got
        engine.link_recv(receiver, buf, engine.delivery_pending(delivery))
        engine.link_advance(receiver)
        engine.delivery_update(delivery, engine.ACCEPTED)
        engine.delivery_settle(delivery)
        got += 1


def _settle_accepted(unsettled: deque[Any]) -> None:
    """Settle the producer's deliveries the broker has decided on (oldest first)."""
    while unsettled:
        delivery = unsettled[0]
        if not (engine.delivery_remote_state(delivery) or engine.delivery_settled(delivery)):
            return
        engine.delivery_settle(unsettled.popleft())


if __name__ == "__main__":
    args = sys.argv[1:]
    count = int(args[0]) if args else 200_000
    batch = int(args[1]) if len(args) > 1 else 500
    plugins = args[2] if len(args) > 2 else "amqp,memory-journal,standard-queues,full-policies"
    times = asyncio.run(run(count, batch, plugins))
    print(
        f"{plugins}, batch {batch}: median {statistics.median(times):.0f} ns/msg of broker CPU "
        f"(runs {', '.join(f'{t:.0f}' for t in times)})"
    )
