"""What `scow run` answers while it starts: nothing before it has recovered.

The management API was a service like paging, started in whatever order the plugins
came: after a SIGKILL it answered while the page files were still being read, with a
backlog's messages in memory and none of those in pages (117,839 of 300,000 on the packaged
config), before the AMQP port listened. A readiness probe on the API said ready too soon,
and an operator's purge or move would have acted on part of the queue. Services that
answer clients now start after the others and after the protocol listeners.
"""

from __future__ import annotations

import threading
import urllib.error
from typing import Any

from scow.core.testing import wait_for
from tests.system.broker import listening, perf_send
from tests.system.topology import BrokerSpec

COUNT = 20_000  # 1 KiB each against the spec's 2 MiB global-max-size: most of them paged


def test_after_a_sigkill_the_api_answers_only_once_pages_are_read_and_amqp_listens(
    system_broker,
):
    broker = system_broker(BrokerSpec())
    perf_send(broker, "backlog", COUNT)
    assert broker.api("/api/queues/backlog")["messages-paged"] > COUNT // 2
    broker.kill()

    answers: list[tuple[Any, bool]] = []  # (message-count, whether AMQP listened yet)
    starting = threading.Event()
    done = threading.Event()

    def watch() -> None:
        starting.wait()
        while not done.is_set():
            if not listening(broker.http_port):
                continue
            try:
                count = broker.api("/api/queues/backlog")["message-count"]
            except (OSError, urllib.error.URLError) as exc:
                count = repr(exc)
            answers.append((count, listening(broker.port)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        starting.set()
        broker.start()
        # the watcher may have been between two polls when the API began to answer
        wait_for(lambda: answers, timeout=10, what="an answer of the API")
    finally:
        done.set()
        watcher.join()
    assert answers, "the API never answered while the broker started"
    assert all(count == COUNT and amqp for count, amqp in answers), answers[:5]
