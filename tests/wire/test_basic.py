"""Send and receive over a real socket with proton's blocking client."""

from __future__ import annotations

import gc
import weakref

from proton import Message
from proton.utils import BlockingConnection

from scow.core.testing import wait_for


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


def test_a_closed_connection_is_freed_at_once_not_at_the_next_full_collection(scow_broker):
    """The broker runs full collections rarely (app.GC_THRESHOLD): a closed connection
    left in a reference cycle would hold its objects, and the memory around them, for
    minutes. Here collections are off altogether while clients come and go."""
    broker = scow_broker()
    server = broker.server.protocols["amqp"]
    broker.call(gc.disable)
    try:
        freed = []
        for i in range(3):
            conn = BlockingConnection(broker.url, timeout=10)
            conn.create_sender("q").send(Message(body=f"m{i}", durable=True))
            receiver = conn.create_receiver("q")
            receiver.receive(timeout=10)
            (connection,) = broker.call(lambda: list(server.connections))
            freed.append(weakref.ref(connection))
            if i == 2:  # lost mid-delivery, as when a client is killed: no close frame
                broker.call(connection.socket.abort)
                del connection
                wait_for(lambda: broker.queue_stats("q")["delivering-count"] == 0)
                conn.container.stop()
            else:
                del connection
                receiver.accept()
                conn.close()
        wait_for(
            lambda: all(ref() is None for ref in freed),
            what="the closed connections to be freed without a collection",
        )
    finally:
        broker.call(gc.enable)
