"""A large message costs `scow run` a buffer and a file, not its size: its body goes to
its file as its frames arrive, and is streamed from it to a consumer as that consumer's
socket takes it, however slowly. The broker's peak resident size is the judge: before
large messages it grew by the message's size on arrival, and again on delivery."""

from __future__ import annotations

import hashlib

from cproton_ffi import lib
from proton import Delivery, Message

from scow.core.testing import amqp_client, wait_for
from scow.protocols.amqp import engine
from tests.system.topology import BrokerSpec
from tests.wire.helpers import RawClient

MiB = 1 << 20
SIZE = 128 * MiB


def test_a_large_message_is_never_whole_in_the_brokers_memory(system_broker):
    broker = system_broker(BrokerSpec(queues={"big": {"routing-type": "ANYCAST"}}))
    assert broker.data_dir is not None
    peak_before = broker.rss_kib("VmHWM")
    body = bytes(range(256)) * (SIZE // 256)
    with amqp_client(broker, timeout=60) as conn:
        sent = conn.create_sender("big").send(Message(body=body, durable=True))
        assert sent.remote_state == Delivery.ACCEPTED
    (stored,) = (broker.data_dir / "large-messages").iterdir()
    assert stored.stat().st_size > SIZE

    # a consumer with 4 KiB frames that takes 4 MiB and stops reading: the broker
    # streams in frames of its size (proton fails the connection on a larger one) and
    # waits on its socket
    slow = RawClient(broker.port, max_frame=4096)
    engine.new_receiver(slow.session, "slow", "big", 1)
    slow.until(lambda: slow.received > 4 * MiB, "the first 4 MiB")
    assert not lib.pn_condition_is_set(lib.pn_transport_condition(slow.engine.transport))
    assert broker.api("/api/queues/big")["delivering-count"] == 1
    slow.close()  # it leaves mid-message: the message goes back whole
    wait_for(lambda: broker.api("/api/queues/big")["delivering-count"] == 0, 10)

    with amqp_client(broker, timeout=60) as conn:
        receiver = conn.create_receiver("big")
        got = receiver.receive(timeout=60)
        receiver.accept()
    assert hashlib.sha256(got.body).digest() == hashlib.sha256(body).digest()
    growth = broker.rss_kib("VmHWM") - peak_before
    assert growth < 48 * 1024, f"the broker's peak grew by {growth} KiB for a 128 MiB message"
    wait_for(lambda: not stored.exists(), 10, what="the file to go with the acknowledgement")
