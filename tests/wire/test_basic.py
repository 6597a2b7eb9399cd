"""Send and receive over a real socket with proton's blocking client."""

from __future__ import annotations

from proton import Message
from proton.utils import BlockingConnection


def test_send_then_receive_in_order(scow_broker):
    broker = scow_broker()
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        sender = conn.create_sender("orders")
        for i in range(10):
            sender.send(Message(body=f"m{i}"))
        receiver = conn.create_receiver("orders")
        bodies = []
        for _ in range(10):
            bodies.append(receiver.receive(timeout=10).body)
            receiver.accept()
        assert bodies == [f"m{i}" for i in range(10)]
    finally:
        conn.close()


def test_connection_properties_name_the_broker(scow_broker):
    broker = scow_broker()
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        props = {str(k): v for k, v in conn.conn.remote_properties.items()}
        assert props["product"] == "scow"
        assert props["version"]
        assert "Python" in props["platform"]
    finally:
        conn.close()
