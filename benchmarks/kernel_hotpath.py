"""Per-message CPU of the broker kernel: send -> queue -> consumer -> acknowledge.

No sockets: an in-process consumer with credit acknowledges each message as it is
delivered, so the figure is the kernel's own cost per message (routing, accounting,
dispatch, acknowledgement), comparable between two checkouts run alternately:

    .venv/bin/python benchmarks/kernel_hotpath.py PLUGINS [COUNT] [--duplicate-ids]

with PLUGINS e.g. amqp,memory-journal,standard-queues,full-policies,paging.
`--duplicate-ids` gives each of the COUNT messages an `_AMQ_DUPL_ID` of its own (more
than an address's default cache holds, so the ids of one run are new again in the next):
duplicate detection's cost is the difference from a run without.
"""

from __future__ import annotations

import asyncio
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scow.core import app
from scow.core.testing import broker_config, write_config
from scow.protocols.amqp.format import AMQP_FORMAT
from scow.protocols.amqp.perf import id_offset, make_message

#: Messages sent per loop pass, about what one socket read of small transfers brings;
#: work the broker leaves to the end of a pass (the ids' journal records) runs then.
PASS = 100


class Consumer:
    filter = None
    browse = False

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def credit(self) -> int:
        return 1000

    def deliver(self, ref: Any) -> None:
        self.broker.acknowledge(ref)


def messages(count: int, duplicate_ids: bool) -> list[bytes]:
    """What a run sends: one message `count` times, or `count` with ids of their own."""
    if not duplicate_ids:
        return [make_message(100, durable=False)[0]] * count
    template, _ = make_message(100, durable=False, duplicate_id=True)
    at = id_offset(template)
    ids = struct.Struct("<QQ")
    return [template[:at] + ids.pack(1, n) + template[at + ids.size :] for n in range(count)]


async def main(plugins: str, count: int, duplicate_ids: bool) -> None:
    data_dir = Path(tempfile.mkdtemp())
    config = write_config(
        data_dir / "s.toml", broker_config(data_dir / "data", plugins=plugins.split(","))
    )
    server = app.Server(*app.load(config))
    broker = await server.start()
    sends = messages(count, duplicate_ids)
    broker.subscribe(Consumer(broker), "hot")
    times = []
    for _ in range(7):
        # CPU time, not wall time: on a shared machine other work stretches the latter
        start = time.process_time()
        for n, data in enumerate(sends, 1):
            broker.send(data, "hot", AMQP_FORMAT)
            if n % PASS == 0:
                await asyncio.sleep(0)  # the end of a loop pass: what waits for one runs
        times.append((time.process_time() - start) / count * 1e9)
    runs = ", ".join(f"{t:.0f}" for t in times)
    ids = ", duplicate ids" if duplicate_ids else ""
    print(f"{plugins}{ids}: median {statistics.median(times):.0f} ns/msg of CPU (runs {runs})")
    await server.stop()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--duplicate-ids"]
    asyncio.run(
        main(args[0], int(args[1]) if len(args) > 1 else 200_000, "--duplicate-ids" in sys.argv)
    )
