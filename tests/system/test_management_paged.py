"""Management of a paged queue, against the installed `scow run`: browsing shows the
messages in pages, and moving and retrying take every waiting message, pages included,
each taken once and for good (a SIGKILL after the move brings none of them back).

Before, all three saw only the messages in memory. Browsing a queue whose 382,161
messages were all in pages answered `[]`; a move of a 500,000-message queue moved the
117,839 in memory, said so, and left the rest; and both ran on the event loop at one go
(a browse of 100,000 messages built a 132 MB answer, and the move took 4.4 s, in which no
client and no other request was served). Now a browse answers at most `MAX_BROWSE`
messages, and a move hands the loop back between batches."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

from proton.utils import BlockingConnection

from scow.core.testing import broker_processes, free_port, wait_for
from tests.system.broker import listening

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging", "management"]
COUNT = 6_000
#: Every RED_EVERY-th message has color = 'red'.
RED_EVERY = 10

_SENDER = """
import sys
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

url, address, origin = sys.argv[1], sys.argv[2], sys.argv[4]
count, red = int(sys.argv[3]), int(sys.argv[5])

class Send(MessagingHandler):
    sent = confirmed = 0

    def on_start(self, event):
        event.container.create_sender(f"{url}/{address}")

    def on_sendable(self, event):
        while event.sender.credit and self.sent < count:
            n = self.sent
            message = Message(
                body=f"m{n}" + "x" * 1000,
                durable=True,
                properties={"n": n, "color": "red" if n % red == 0 else "blue"},
            )
            if origin:
                message.annotations = {"x-opt-ORIG-ADDRESS": origin}
            event.sender.send(message)
            self.sent += 1

    def on_accepted(self, event):
        self.confirmed += 1
        if self.confirmed == count:
            event.connection.close()

Container(Send()).run()
"""


def _send(url: str, address: str, count: int, origin: str = "") -> None:
    """`count` durable messages from a client in a process of its own."""
    subprocess.run(
        [sys.executable, "-c", _SENDER, url, address, str(count), origin, str(RED_EVERY)],
        check=True,
        timeout=120,
    )


def _http(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _count(port: int, queue: str) -> int:
    status, described = _http(port, "GET", f"/api/queues/{queue}")
    assert status == 200, described
    return int(described["message-count"])


def _numbers(url: str, queue: str, count: int) -> list[int]:
    """The `n` of `count` messages received (and accepted) from `queue`."""
    conn = BlockingConnection(url, timeout=30)
    try:
        receiver = conn.create_receiver(queue, credit=500)
        numbers = []
        for _ in range(count):
            numbers.append(receiver.receive(timeout=30).properties["n"])
            receiver.accept()
        return numbers
    finally:
        conn.close()


def test_browse_move_and_retry_reach_the_messages_in_pages(tmp_path):
    port = free_port()
    with broker_processes(tmp_path) as start:
        broker = start(
            plugins=PLUGINS,
            address_settings={
                name: {"max-size-bytes": "256KiB", "page-size-bytes": "512KiB"}
                for name in ("orders", "DLA")
            },
            sections={"management": {"listen": f"127.0.0.1:{port}"}},
        )
        wait_for(lambda: listening(port), 30, what="management")  # just after AMQP
        _send(broker.url, "orders", COUNT)
        status, orders = _http(port, "GET", "/api/queues/orders")
        assert orders["message-count"] == COUNT
        assert orders["messages-paged"] > COUNT // 2, orders

        # browse: the first messages, from memory then from pages, in order
        status, browsed = _http(port, "GET", "/api/queues/orders/messages?limit=1000")
        assert status == 200
        assert [m["properties"]["n"] for m in browsed] == list(range(1000))
        status, refused = _http(port, "GET", "/api/queues/orders/messages?limit=100000")
        assert status == 400 and "at most 1000" in refused["error"], refused
        assert _count(port, "orders") == COUNT  # browsing took nothing

        # move: the red ones, wherever they are, then all the rest
        reds = COUNT // RED_EVERY
        to_red = {"to": "red", "filter": "color = 'red'"}
        assert _http(port, "POST", "/api/queues/orders/move", to_red) == (200, {"moved": reds})
        moved = _http(port, "POST", "/api/queues/orders/move", {"to": "rest"})
        assert moved == (200, {"moved": COUNT - reds})
        assert [_count(port, q) for q in ("orders", "red", "rest")] == [0, reds, COUNT - reds]

        # retry: dead letters in pages go back where they came from
        _send(broker.url, "DLA", COUNT, origin="orders")
        assert _http(port, "POST", "/api/queues/DLA/retry") == (200, {"moved": COUNT})

        broker.kill()  # what was moved stays moved
        broker.start()
        wait_for(lambda: listening(port), 30, what="management")  # just after AMQP
        assert [_count(port, q) for q in ("orders", "red", "rest", "DLA")] == [
            COUNT,
            reds,
            COUNT - reds,
            0,
        ]
        assert _numbers(broker.url, "red", reds) == list(range(0, COUNT, RED_EVERY))
        assert _numbers(broker.url, "orders", COUNT) == list(range(COUNT))
