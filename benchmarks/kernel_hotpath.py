"""Per-message CPU of the broker kernel: send -> queue -> consumer -> acknowledge.

No sockets: an in-process consumer with credit acknowledges each message as it is
delivered, so the figure is the kernel's own cost per message (routing, accounting,
dispatch, acknowledgement), comparable between two checkouts run alternately:

    .venv/bin/python benchmarks/kernel_hotpath.py PLUGINS [COUNT] [--duplicate-ids]

with PLUGINS e.g. amqp,memory-journal,standard-queues,full-policies,paging.
`--duplicate-ids` gives each of the COUNT messages an `_AMQ_DUPL_ID` of its own (more
than an address's default cache holds, so the ids of one run are new again in the next):
duplicate detection's cost is the difference from a run without. A run without sends one
message COUNT times unless `--distinct` (each its own bytes, as received messages are, and
as those with ids are); `--control` gives each message a property of the id's size under
another name (`_AMQ_DUPL_IX`), to tell an id's cost from its bytes'.
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
from scow.protocols.amqp.perf.messages import id_offset, make_message

#: `--control`'s property: the size of `_AMQ_DUPL_ID`, another name.
CONTROL = "_AMQ_DUPL_IX"
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


def messages(count: int, mode: str) -> list[bytes]:
    """What a run sends: one message `count` times (mode ""), or `count` messages each of
    its own bytes: a stamp in the body ("distinct"), a control property ("control"), or
    an id ("duplicate-ids")."""
    if not mode:
        return [make_message(100, durable=False)[0]] * count
    if mode == "duplicate-ids":
        template, _ = make_message(100, durable=False, duplicate_id=True)
        at = id_offset(template)
    elif mode == "control":
        value = "0123456789abcdef"  # as long as --duplicate-ids' id
        template, _ = make_message(100, durable=False, properties={CONTROL: value})
        at = template.index(value.encode())
        # its value stays a string: 16 hex digits
        return [template[:at] + b"%016x" % n + template[at + 16 :] for n in range(count)]
    else:
        template, at = make_message(100, durable=False)
    stamp = struct.Struct("<QQ")
    return [template[:at] + stamp.pack(1, n) + template[at + stamp.size :] for n in range(count)]


async def main(plugins: str, count: int, mode: str) -> None:
    data_dir = Path(tempfile.mkdtemp())
    config = write_config(
        data_dir / "s.toml", broker_config(data_dir / "data", plugins=plugins.split(","))
    )
    server = app.Server(*app.load(config))
    broker = await server.start()
    sends = messages(count, mode)
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
    what = f", {mode}" if mode else ""
    print(f"{plugins}{what}: median {statistics.median(times):.0f} ns/msg of CPU (runs {runs})")
    await server.stop()


if __name__ == "__main__":
    modes = ("--duplicate-ids", "--control", "--distinct")
    args = [a for a in sys.argv[1:] if a not in modes]
    chosen = [a[2:] for a in modes if a in sys.argv[1:]]
    if len(chosen) > 1:
        raise SystemExit(f"at most one of {', '.join(modes)}; got {', '.join(chosen)}")
    count = int(args[1]) if len(args) > 1 else 200_000
    asyncio.run(main(args[0], count, chosen[0] if chosen else ""))
