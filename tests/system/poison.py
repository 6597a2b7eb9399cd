"""A client, in a process of its own, that sends malformed AMQP messages as they would
arrive from a buggy client library, and one that rejects whatever it is given without
decoding it (a consumer giving up on messages it cannot read).

    python -m tests.system.poison send URL ADDRESS COUNT SEED   # prints outcome counts
    python -m tests.system.poison reject URL ADDRESS COUNT      # prints how many it rejected
    python -m tests.system.poison read-stream URL ADDRESS COUNT # a stream from its start

The readers stop once they have COUNT, or when nothing has come for QUIET seconds.

Each message a sender sends is a valid durable header followed by one to three sections
whose descriptors or values are anything at all (`fuzz_frames.value`); every tenth is a
well-formed message with `color = 'red'` and body `good <n>`.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from proton import Delivery, Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container, Filter

from tests.security.fuzz_frames import value

_DURABLE_HEADER = bytes.fromhex("005370c0020141")
#: The descriptors of the message sections, and none at all.
_SECTIONS = [b"\x00\x53" + bytes([code]) for code in range(0x70, 0x79)] + [b""]
_OUTCOMES = {
    Delivery.ACCEPTED: "accepted",
    Delivery.REJECTED: "rejected",
    Delivery.RELEASED: "released",
    Delivery.MODIFIED: "modified",
}
#: Seconds with no delivery after which a reader gives up waiting for its count.
QUIET = 10.0


def payloads(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 10 == 0:
            good = Message(body=f"good {i}", durable=True, properties={"color": "red"})
            out.append(good.encode())
            continue
        data = _DURABLE_HEADER
        for _ in range(rng.randrange(1, 4)):
            content = value(rng) if rng.random() < 0.8 else rng.randbytes(rng.randrange(64))
            data += rng.choice(_SECTIONS) + content
        out.append(data)
    return out


class _Send(MessagingHandler):
    def __init__(self, url: str, items: list[bytes]) -> None:
        super().__init__(auto_settle=True)
        self.url, self.items = url, items
        self.sent = 0
        self.outcomes: dict[str, int] = {}

    def on_start(self, event: Any) -> None:
        event.container.create_sender(self.url)

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit and self.sent < len(self.items):
            sender.delivery(str(self.sent))
            sender.send(self.items[self.sent])
            sender.advance()
            self.sent += 1

    def on_settled(self, event: Any) -> None:
        state = _OUTCOMES.get(event.delivery.remote_state, str(event.delivery.remote_state))
        self.outcomes[state] = self.outcomes.get(state, 0) + 1
        if sum(self.outcomes.values()) == len(self.items):
            event.connection.close()


class _Reject(MessagingHandler):
    """Rejects every delivery as its bytes arrive: no decoding, so nothing can fail
    (`stream`: reads a stream from its start, accepting)."""

    def __init__(self, url: str, count: int, *, stream: bool = False) -> None:
        super().__init__(prefetch=100, auto_accept=False)
        self.url = url
        self.count = count
        self.stream = stream
        self.rejected = 0
        self.timer: Any = None

    def on_start(self, event: Any) -> None:
        self.container = event.container
        start = Filter({symbol("scow:stream-offset"): "first"}) if self.stream else None
        event.container.create_receiver(self.url, options=start)
        self.timer = event.container.schedule(QUIET, self)

    def on_delivery(self, event: Any) -> None:  # replaces the decoding one
        delivery = event.delivery
        if delivery.partial:
            return
        delivery.link.recv(delivery.pending)
        delivery.update(Delivery.ACCEPTED if self.stream else Delivery.REJECTED)
        delivery.settle()
        self.rejected += 1
        self.timer.cancel()
        if self.rejected >= self.count:
            event.connection.close()
        else:
            self.timer = self.container.schedule(QUIET, self)

    def on_timer_task(self, event: Any) -> None:
        event.container.stop()


def main(argv: list[str]) -> int:
    command, url, address = argv[0], argv[1], argv[2]
    if command == "send":
        sender = _Send(f"{url}/{address}", payloads(int(argv[3]), int(argv[4])))
        Container(sender).run()
        print(json.dumps(sender.outcomes))
    else:
        rejecter = _Reject(f"{url}/{address}", int(argv[3]), stream=command == "read-stream")
        Container(rejecter).run()
        print(json.dumps({"rejected" if command == "reject" else "read": rejecter.rejected}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
