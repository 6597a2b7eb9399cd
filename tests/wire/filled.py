"""A client in its own process for `test_brokers_in_one_process`: sends, or receives and
checks, COUNT messages whose bodies are one byte repeated (100 to 6,000 of them).

    python -m tests.wire.filled send|receive URL FILL COUNT

Prints one JSON line: what was sent and accepted, or received and how many were wrong,
and any error the connection ended with. A receiver stops after 10 s without a message.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from proton import Delivery, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

QUEUE = "filled"
IDLE = 10.0


def size(i: int) -> int:
    return 100 + (i * 7919) % 5900


class _Client(MessagingHandler):
    def __init__(self, url: str, fill: bytes, count: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url, self.fill, self.count = url, fill, count
        self.report: dict[str, Any] = {"errors": []}

    def on_transport_error(self, event: Any) -> None:
        self.report["errors"].append(str(event.transport.condition))

    def on_connection_error(self, event: Any) -> None:
        self.report["errors"].append(str(event.connection.remote_condition))


class Sender(_Client):
    def on_start(self, event: Any) -> None:
        self.report.update(sent=0, accepted=0, other=0)
        event.container.create_sender(event.container.connect(self.url), QUEUE)

    def on_sendable(self, event: Any) -> None:
        report = self.report
        while event.sender.credit and report["sent"] < self.count:
            event.sender.send(Message(body=self.fill * size(report["sent"])))
            report["sent"] += 1

    def on_settled(self, event: Any) -> None:
        accepted = event.delivery.remote_state == Delivery.ACCEPTED
        self.report["accepted" if accepted else "other"] += 1
        if self.report["accepted"] + self.report["other"] == self.count:
            event.connection.close()


class Receiver(_Client):
    def on_start(self, event: Any) -> None:
        self.report.update(received=0, wrong=0)
        self.heard = time.monotonic()
        self.conn = event.container.connect(self.url)
        event.container.create_receiver(self.conn, QUEUE)
        event.container.schedule(1, self)

    def on_timer_task(self, event: Any) -> None:
        if time.monotonic() - self.heard > IDLE:
            self.conn.close()
        else:
            event.container.schedule(1, self)

    def on_message(self, event: Any) -> None:
        self.heard = time.monotonic()
        report = self.report
        if event.message.body != self.fill * size(report["received"]):
            report["wrong"] += 1
        report["received"] += 1
        if report["received"] == self.count:
            self.conn.close()


def main(argv: list[str]) -> None:
    mode, url, fill, count = argv
    client = (Sender if mode == "send" else Receiver)(url, fill.encode(), int(count))
    Container(client).run()
    print(json.dumps(client.report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
