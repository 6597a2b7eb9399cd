"""SIGKILL the broker mid-traffic; every acknowledged durable message must survive."""

from __future__ import annotations

import threading
import time

import pytest
from proton import Message
from proton.utils import BlockingConnection

from scow.core.testing import broker_processes, wait_for
from tests.wire.helpers import consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]
FAST_JOURNAL = {"journal": {"journal-file-size": "1MiB", "journal-buffer-timeout": 500000}}


def _producer(url: str, address: str, start: int, accepted: list[int], stop: threading.Event):
    try:
        conn = BlockingConnection(url, timeout=10)
        sender = conn.create_sender(address)
        n = start
        while not stop.is_set():
            sender.send(Message(body=f"m{n}", durable=True, properties={"n": n}))
            accepted.append(n)  # send() returned: the broker accepted it
            n += 1
    except Exception:
        return  # the broker was killed under us


def _consumer(url: str, address: str, acked: list[int], stop: threading.Event):
    try:
        conn = BlockingConnection(url, timeout=10)
        receiver = conn.create_receiver(address, credit=10)
        while not stop.is_set():
            try:
                message = receiver.receive(timeout=0.2)
            except Exception as exc:
                if "Timeout" in type(exc).__name__:
                    continue
                return
            receiver.accept()
            acked.append(message.properties["n"])
    except Exception:
        return


def _crash_round(start_broker, seconds: float, producers: int = 3) -> tuple[set, set, list]:
    broker = start_broker(plugins=PLUGINS, sections=FAST_JOURNAL)
    stop = threading.Event()
    accepted: list[list[int]] = [[] for _ in range(producers)]
    acked: list[int] = []
    threads = [
        threading.Thread(target=_producer, args=(broker.url, "crash", i * 10**6, accepted[i], stop))
        for i in range(producers)
    ]
    threads.append(threading.Thread(target=_consumer, args=(broker.url, "crash", acked, stop)))
    for thread in threads:
        thread.start()
    wait_for(lambda: sum(map(len, accepted)) > 50, timeout=30, what="traffic")
    time.sleep(seconds)  # let traffic run for a while: this is the crash point, not a wait
    broker.kill()
    stop.set()
    for thread in threads:
        thread.join(20)
    restarted = start_broker(plugins=PLUGINS, sections=FAST_JOURNAL, port=broker.port)
    recovered = [m.properties["n"] for m in consume_all(restarted.url, "crash")]
    restarted.stop()
    return {n for part in accepted for n in part}, set(acked), recovered


def _check(accepted: set, acked: set, recovered: list) -> None:
    assert len(recovered) == len(set(recovered)), "a message was restored twice"
    missing = accepted - acked - set(recovered)
    assert not missing, f"{len(missing)} accepted durable messages lost, e.g. {sorted(missing)[:5]}"


def test_sigkill_mid_traffic_loses_no_accepted_durable_message(scow_broker_process):
    accepted, acked, recovered = _crash_round(scow_broker_process, 1.0)
    assert len(accepted) > 50
    _check(accepted, acked, recovered)


@pytest.mark.slow
def test_repeated_sigkill_loop_loses_nothing(tmp_path_factory):
    for round_no in range(20):
        with broker_processes(tmp_path_factory.mktemp(f"crash{round_no}")) as start:
            accepted, acked, recovered = _crash_round(start, 0.5 + round_no % 5 * 0.5)
            _check(accepted, acked, recovered)
