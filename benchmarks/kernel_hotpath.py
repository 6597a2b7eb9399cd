"""Per-message CPU of the broker kernel: send -> queue -> consumer -> acknowledge.

No sockets: an in-process consumer with credit acknowledges each message as it is
delivered, so the figure is the kernel's own cost per message (routing, accounting,
dispatch, acknowledgement), comparable between two checkouts run alternately:

    .venv/bin/python benchmarks/kernel_hotpath.py PLUGINS [COUNT]

with PLUGINS e.g. amqp,memory-journal,standard-queues,full-policies,paging.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scow.core import app
from scow.core.testing import broker_config, write_config
from scow.protocols.amqp.format import AMQP_FORMAT
from scow.protocols.amqp.perf import make_message


class Consumer:
    filter = None
    browse = False

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def credit(self) -> int:
        return 1000

    def deliver(self, ref: Any) -> None:
        self.broker.acknowledge(ref)


async def main(plugins: str, count: int) -> None:
    data_dir = Path(tempfile.mkdtemp())
    config = write_config(
        data_dir / "s.toml", broker_config(data_dir / "data", plugins=plugins.split(","))
    )
    server = app.Server(*app.load(config))
    broker = await server.start()
    data, _ = make_message(100, durable=False)
    broker.subscribe(Consumer(broker), "hot")
    times = []
    for _ in range(7):
        # CPU time, not wall time: on a shared machine other work stretches the latter
        start = time.process_time()
        for _ in range(count):
            broker.send(data, "hot", AMQP_FORMAT)
        times.append((time.process_time() - start) / count * 1e9)
    runs = ", ".join(f"{t:.0f}" for t in times)
    print(f"{plugins}: median {statistics.median(times):.0f} ns/msg of CPU (runs {runs})")
    await server.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200_000))
