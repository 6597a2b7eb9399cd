"""Peers that stall, as `scow run` meets them.

A consumer that stops reading its socket (a frozen process, a stalled network) after
granting much credit costs the broker a bounded buffer, not a copy of every message its
credit covers; others are served meanwhile, and once it reads again it gets everything.
Before the fix, 100,000 x 1 KiB on a queue and a consumer with credit for all of them that
did not read took the broker from 159 to 631 MiB: every message was encoded into the
connection's output at once.

A client that connects and never finishes its handshake (sends nothing, or stops during
SASL, in the clear or over TLS) is closed after `handshake-timeout`: before, idle-timeout
did not apply until SASL was done, and such a socket was held for ever.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

from proton import Message

from scow.core.testing import amqp_client, wait_for
from tests.system.broker import closed_by_peer
from tests.system.topology import BrokerSpec

QUEUE = "stalled"
COUNT = 5_000
BODY = 8192

#: The consumer, in a process of its own: credit for every message, one received (so
#: the credit went out), then nothing read until a line comes on stdin; then the rest,
#: each accepted, and how many came in order.
CONSUMER = """
import sys
from proton.utils import BlockingConnection

url, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = BlockingConnection(url)
receiver = conn.create_receiver(queue, credit=count)
seqs = [receiver.receive(timeout=30).properties["seq"]]
receiver.accept()
print("attached", flush=True)
sys.stdin.readline()  # the socket is not read meanwhile
while len(seqs) < count:
    seqs.append(receiver.receive(timeout=30).properties["seq"])
    receiver.accept()
conn.close()
print("received", len(seqs), "in order" if seqs == list(range(count)) else "out of order")
"""


def _delivering(broker) -> int:
    return int(broker.api(f"/api/queues/{QUEUE}").get("delivering-count", 0))


def test_a_consumer_that_stops_reading_costs_a_bounded_buffer_and_then_gets_everything(
    system_broker, tmp_path: Path
):
    broker = system_broker(BrokerSpec(broker={"global-max-size": -1}))
    with amqp_client(broker) as conn:
        sender = conn.create_sender(QUEUE)
        for seq in range(COUNT):
            sender.send(Message(body=b"x" * BODY, properties={"seq": seq}), timeout=False)
        sender.send(Message(body=b"last", properties={"seq": COUNT}))  # waits for all
    wait_for(lambda: broker.api(f"/api/queues/{QUEUE}")["message-count"] == COUNT + 1, 30)
    filled = broker.rss_kib()

    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)
    consumer = subprocess.Popen(
        [sys.executable, str(script), broker.url, QUEUE, str(COUNT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert consumer.stdout is not None and consumer.stdin is not None
        assert consumer.stdout.readline().strip() == "attached"
        # while it reads nothing, the broker hands it no more than its output can hold
        wait_for(lambda: _delivering(broker) > 1, 10, what="deliveries to the stalled consumer")
        deadline, most = time.monotonic() + 3, 0
        while time.monotonic() < deadline:
            most = max(most, _delivering(broker))
            time.sleep(0.1)
        grown = (broker.rss_kib() - filled) / 1024
        print(f"stalled: {most} delivering, broker grew {grown:.1f} MiB")
        stalled = [
            link
            for connection in broker.api("/api/connections")
            for link in connection["links"]
            if link.get("queue") == QUEUE
        ]
        assert [link["output-full"] for link in stalled] == [True]  # what an operator sees
        assert most < COUNT // 2, f"{most} of {COUNT} messages handed to a consumer that reads none"
        assert grown < 48, f"the broker grew {grown:.0f} MiB for a consumer that reads nothing"
        # others are served meanwhile
        with amqp_client(broker) as other:
            other.create_sender("others").send(Message(body="hi"))
            receiver = other.create_receiver("others")
            assert receiver.receive(timeout=10).body == "hi"
            receiver.accept()

        out, _ = consumer.communicate("read\n", timeout=120)
    finally:
        consumer.kill()
    assert out.strip().splitlines()[-1] == f"received {COUNT} in order"
    assert broker.api(f"/api/queues/{QUEUE}")["message-count"] == 1  # the last one


def test_a_client_that_does_not_finish_its_handshake_is_closed_after_handshake_timeout(
    system_broker, pki
):
    broker = system_broker(
        BrokerSpec(amqp={"handshake-timeout": 1000}, tls=(pki.server_cert, pki.server_key))
    )
    with amqp_client(broker) as conn:  # opened first: it outlives the others' timeout
        silent = socket.create_connection(("127.0.0.1", broker.port))
        in_sasl = socket.create_connection(("127.0.0.1", broker.port))
        in_sasl.sendall(b"AMQP\x03\x01\x00\x00")  # the SASL header, then nothing
        context = ssl.create_default_context(cafile=str(pki.ca))
        over_tls = context.wrap_socket(
            socket.create_connection(("127.0.0.1", broker.tls_port)), server_hostname="localhost"
        )
        raw_tls = socket.create_connection(("127.0.0.1", broker.tls_port))  # no TLS hello
        stalled = {"silent": silent, "in SASL": in_sasl, "over TLS": over_tls, "raw TLS": raw_tls}
        for name, sock in stalled.items():
            wait_for(lambda sock=sock: closed_by_peer(sock), 10, what=f"the {name} socket closed")
        conn.create_sender("after").send(Message(body="still served"))
    assert len(broker.log_lines("no AMQP open within handshake-timeout (1000 ms)")) == 3
