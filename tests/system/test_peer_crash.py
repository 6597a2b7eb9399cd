"""A peer that crashes costs the broker that one connection, never the process.

Regression tests of issue 17's first report: 100 k messages on a queue, proton's C
`receive` started and SIGKILLed 0.2 s later, and `scow run` exited with status 141
(SIGPIPE, which the CLI had set back to SIG_DFL for every subcommand); a TLS client that
closes its socket without waiting for the broker's close (as Azure's uAMQP does) did the
same. The unsettled deliveries of the dead peer must go back to the queue with their
delivery count raised.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error

import pytest
from proton import Message

from scow.core.testing import amqp_client, wait_for
from tests.system import clients
from tests.system.topology import BrokerSpec

QUEUE = "peer.crash"


def _queue(broker, name: str = QUEUE) -> dict:
    try:
        return broker.api(f"/api/queues/{name}")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        return {"message-count": 0, "consumer-count": 0}  # emptied and auto-deleted


def _quiet(broker, name: str = QUEUE) -> bool:
    """The broker saw every consumer go: nothing is out for delivery any more."""
    queue = _queue(broker, name)
    return queue["consumer-count"] == 0 and queue.get("delivering-count", 0) == 0


def _head_delivery_count(broker, name: str = QUEUE) -> int:
    with amqp_client(broker) as conn:
        receiver = conn.create_receiver(name, credit=1)
        message = receiver.receive(timeout=10)
        receiver.release()
        return message.delivery_count


def test_c_receive_sigkilled_mid_delivery_leaves_the_broker_serving(
    system_broker, c_examples, tmp_path
):
    broker = system_broker(BrokerSpec(broker={"global-max-size": -1}))
    backlog, sent, printed = 100_000, 0, 0
    for attempt in range(3):
        top_up = backlog - _queue(broker)["message-count"]  # 100 k on the queue each time
        result = subprocess.run(
            c_examples.send_command(broker.port, QUEUE, top_up), capture_output=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert f"{top_up} messages sent and acknowledged".encode() in result.stdout
        sent += top_up
        output = tmp_path / f"receive-{attempt}.out"
        with open(output, "wb") as stdout:
            receiver = subprocess.Popen(
                c_examples.receive_command(broker.port, QUEUE, 0),
                stdout=stdout,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(0.2)  # the crash point: messages are streaming to it
        receiver.kill()
        receiver.wait()
        took = len(output.read_bytes().splitlines())
        assert took > 0, "the receiver got nothing before it was killed"
        printed += took
        wait_for(lambda: not broker.running() or _quiet(broker), 15, 0.05, "the peer's loss")
        assert broker.running(), broker.death_report()
        left = _queue(broker)["message-count"]
        # receive prints a message before it accepts it: what it printed covers what it took
        assert left + printed >= sent, f"{sent - left - printed} messages lost"
        assert _head_delivery_count(broker) >= 1, "a dead peer's delivery came back uncounted"


@pytest.mark.parametrize("end", ["close-no-wait", "fin", "reset"])
def test_tls_client_that_vanishes_leaves_the_broker_serving(system_broker, pki, tmp_path, end):
    broker = system_broker(BrokerSpec(tls=(pki.server_cert, pki.server_key)))
    total = 300
    with amqp_client(broker) as conn:
        sender = conn.create_sender(QUEUE)
        for i in range(total):
            sender.send(Message(id=f"m{i}", body="x" * 2000))
    log = tmp_path / "raw.jsonl"
    for attempt in range(8):
        args = ["--port", str(broker.tls_port), "--log", str(log), "--name", f"r{attempt}"]
        args += ["--lane", "paged", "--address", QUEUE, "--mode", "receive", "--end", end]
        args += ["--tls-ca", str(pki.ca), "--count", "50", "--seconds", "2"]
        status = clients.main(["raw", *args])
        assert status == 0
        # the client is gone; the broker must notice, keep running and take back its messages
        wait_for(lambda: not broker.running() or _quiet(broker), 15, 0.05, "the peer's loss")
        assert broker.running(), broker.death_report()
    assert _queue(broker)["message-count"] == total  # none was settled: all are back
    assert _head_delivery_count(broker) >= 1, "a dead peer's delivery came back uncounted"
