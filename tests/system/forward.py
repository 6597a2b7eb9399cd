"""A client, in a process of its own, that moves messages from one address to another in
one transaction, as a pipeline stage does: it takes COUNT messages, and within one
transaction sends a durable copy of each to the other address and accepts it, then
commits.

    python -m tests.system.forward URL FROM TO COUNT

It prints `committing` once the commit is asked for, then the outcome (`committed` or
`failed`), each on a line of its own.
"""

from __future__ import annotations

import sys
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container


class Forward(MessagingHandler, TransactionHandler):
    def __init__(self, url: str, source: str, target: str, count: int) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.source, self.target, self.count = url, source, target, count
        self.transaction: Any = None
        self.taken = 0

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        self.receiver = event.container.create_receiver(self.conn, self.source)
        self.sender = event.container.create_sender(self.conn, self.target)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.receiver.flow(self.count)

    def on_message(self, event: Any) -> None:
        copy = Message(body=event.message.body, durable=True)
        self.transaction.send(self.sender, copy)
        self.transaction.accept(event.delivery)
        self.taken += 1
        if self.taken == self.count:
            print("committing", flush=True)
            self.transaction.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self._end("committed")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._end("failed")

    def _end(self, outcome: str) -> None:
        print(outcome, flush=True)
        self.conn.close()


def main(argv: list[str]) -> None:
    url, source, target, count = argv
    Container(Forward(url, source, target, int(count))).run()


if __name__ == "__main__":
    main(sys.argv[1:])
