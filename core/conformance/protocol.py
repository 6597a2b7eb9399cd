"""The conformance suite every wire protocol plugin passes (built-in and third-party).

A protocol is tested through a client of its own: subclass `ProtocolConformance`, name
the protocol (`protocol`, its `ProtocolType` name), and give a `protocol_client` fixture
that connects a `ConformanceClient` to a running broker, plus bytes the protocol must
refuse (`malformed_input`) and, when yours is not among the defaults, the plugins and
config sections the broker needs:

    class TestMyProtocol(ProtocolConformance):
        protocol = "myproto"
        malformed_input = b"NOT MY PROTOCOL\\n"

        @pytest.fixture
        def scow_plugins(self):
            return [*DEFAULT_PLUGINS, "myproto"]

        @pytest.fixture
        def scow_sections(self):
            return {"myproto": {"listen": ["127.0.0.1:0"]}}

        @pytest.fixture
        def protocol_client(self):
            return lambda broker: MyClient(broker.port_of("myproto"))

The suite holds the protocol to what the kernel promises: messages keep their body and
properties, they cross to and from AMQP 1.0 (properties as application properties),
what a client acknowledged is gone and what it did not comes back, selectors filter,
connections are announced through the connection hooks, a full address loses nothing
the broker confirmed, a confirmed durable message survives a restart, and malformed
input costs only the connection that sent it.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
from proton import Message

from scow.core.interfaces import ProtocolServer
from scow.core.testing import DEFAULT_PLUGINS, BrokerThread, wait_for
from scow.core.testing import amqp_client as amqp

WAIT = 10.0


@dataclass
class Received:
    """A message a `ConformanceClient` received; `ack()` acknowledges it."""

    body: bytes
    properties: Mapping[str, str]
    ack: Callable[[], None]


class ConformanceClient(Protocol):
    """What the suite needs of a protocol's client: one connection to the broker."""

    def send(
        self, address: str, body: bytes, properties: Mapping[str, str], *, durable: bool = False
    ) -> bool:
        """Send one message to the anycast `address` and wait for the broker's answer:
        True once it confirmed the message, False when it refused it or closed the
        connection (which then stays closed)."""

    def subscribe(self, address: str, selector: str | None = None) -> None:
        """Consume from the anycast `address` (one subscription per client), with
        acknowledgements the client sends."""

    def receive(self, timeout: float) -> Received | None:
        """The next message of the subscription, or None after `timeout` seconds."""

    def close(self) -> None:
        """Leave, without acknowledging what is unacknowledged; idempotent."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(body: Any) -> bytes:
    """An AMQP body as bytes, whichever way the protocol encoded it (binary or text)."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    return str(body).encode()


class ProtocolConformance:
    """Behaviour every protocol shares; set `protocol`, `malformed_input` and give a
    `protocol_client` fixture."""

    protocol = "amqp"
    #: Bytes the protocol must refuse at the start of a connection.
    malformed_input = b"\x00\x00\x00\x08\xff\xff\xff\xff"

    @pytest.fixture
    def scow_plugins(self) -> list[str]:
        return list(DEFAULT_PLUGINS)

    @pytest.fixture
    def scow_sections(self) -> dict[str, dict[str, Any]]:
        return {}

    @pytest.fixture
    def broker(
        self, scow_broker: Any, scow_plugins: list[str], scow_sections: dict[str, Any]
    ) -> BrokerThread:
        return scow_broker(
            plugins=scow_plugins,
            sections=scow_sections,
            address_settings={"full.#": {"max-size-bytes": 6000, "address-full-policy": "BLOCK"}},
        )

    @pytest.fixture
    def client(
        self, broker: BrokerThread, protocol_client: Callable[[BrokerThread], ConformanceClient]
    ) -> Iterator[Callable[[], ConformanceClient]]:
        """connect() -> a ConformanceClient, closed at the end of the test."""
        opened: list[ConformanceClient] = []

        def connect() -> ConformanceClient:
            opened.append(protocol_client(broker))
            return opened[-1]

        yield connect
        for each in opened:
            with contextlib.suppress(Exception):
                each.close()

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def count(broker: BrokerThread, queue: str) -> int:
        stats = broker.queue_stats(queue)
        return int(stats["message-count"]) if stats else 0

    @staticmethod
    def declare(broker: BrokerThread, queue: str) -> None:
        broker.call(lambda: broker.broker.declare_queue(queue, routing_type="ANYCAST"))

    @staticmethod
    def received(client: ConformanceClient) -> Received:
        got = client.receive(WAIT)
        assert got is not None, "no message arrived"
        return got

    # ------------------------------------------------------------------ the suite

    def test_the_protocol_listens_where_it_was_told(self, broker: BrokerThread):
        server = broker.server.protocols[self.protocol]
        assert isinstance(server, ProtocolServer)
        assert server.bound and broker.port_of(self.protocol) > 0
        assert isinstance(server.stats(), dict)

    def test_a_message_keeps_its_body_and_properties(self, broker: BrokerThread, client):
        self.declare(broker, "kept")
        producer, consumer = client(), client()
        assert producer.send("kept", b"payload \x00\xff", {"colour": "red", "size": "3"})
        consumer.subscribe("kept")
        got = self.received(consumer)
        assert got.body == b"payload \x00\xff"
        assert got.properties["colour"] == "red" and got.properties["size"] == "3"
        got.ack()

    def test_a_message_sent_over_the_protocol_reaches_amqp(self, broker: BrokerThread, client):
        self.declare(broker, "to-amqp")
        assert client().send("to-amqp", b"across", {"kind": "order"})
        with amqp(broker) as conn:
            receiver = conn.create_receiver("to-amqp")
            message = receiver.receive(timeout=WAIT)
            receiver.accept()
        assert _bytes(message.body) == b"across"
        properties: Any = message.properties
        assert _text(properties["kind"]) == "order"

    def test_an_amqp_message_reaches_the_protocol(self, broker: BrokerThread, client):
        self.declare(broker, "from-amqp")
        with amqp(broker) as conn:
            sender = conn.create_sender("from-amqp")
            sender.send(Message(body=b"across", properties={"kind": "reply"}))
        consumer = client()
        consumer.subscribe("from-amqp")
        got = self.received(consumer)
        assert got.body == b"across" and got.properties["kind"] == "reply"
        got.ack()

    def test_acknowledged_is_gone_and_unacknowledged_comes_back(self, broker: BrokerThread, client):
        self.declare(broker, "acks")
        producer = client()
        for n in range(2):
            assert producer.send("acks", f"m{n}".encode(), {"n": str(n)})
        first = client()
        first.subscribe("acks")
        self.received(first).ack()
        self.received(first)  # never acknowledged
        first.close()
        wait_for(lambda: (broker.queue_stats("acks") or {}).get("delivering-count") == 0, WAIT)
        assert self.count(broker, "acks") == 1
        second = client()
        second.subscribe("acks")
        again = self.received(second)
        assert again.body == b"m1"
        again.ack()
        wait_for(lambda: self.count(broker, "acks") == 0, WAIT, what="the queue to empty")

    def test_a_selector_filters_what_a_subscription_gets(self, broker: BrokerThread, client):
        self.declare(broker, "picky")
        producer = client()
        for colour in ("blue", "red", "green"):
            assert producer.send("picky", colour.encode(), {"colour": colour})
        consumer = client()
        consumer.subscribe("picky", selector="colour = 'red'")
        got = self.received(consumer)
        assert got.body == b"red"
        got.ack()
        assert consumer.receive(0.3) is None
        assert self.count(broker, "picky") == 2

    def test_connections_are_announced_through_the_hooks(self, broker: BrokerThread, client):
        def ours() -> list[Any]:
            connections = broker.broker.connections.values()
            return [c for c in connections if c.protocol == self.protocol]

        before = len(broker.call(ours))
        one = client()
        one.subscribe("hooks")
        wait_for(lambda: len(broker.call(ours)) == before + 1, WAIT, what="the opened hook")
        one.close()
        wait_for(lambda: len(broker.call(ours)) == before, WAIT, what="the closed hook")

    def test_a_full_address_loses_nothing_the_broker_confirmed(self, broker: BrokerThread, client):
        self.declare(broker, "full.stop")
        producer = client()
        confirmed = []
        for n in range(20):
            if not producer.send("full.stop", b"x" * 1000, {"n": str(n)}):
                break
            confirmed.append(str(n))
        assert len(confirmed) < 20, "the address never refused or held the producer back"
        producer.close()
        consumer = client()
        consumer.subscribe("full.stop")
        got = []
        while (message := consumer.receive(1.0)) is not None:
            got.append(message.properties["n"])
            message.ack()
        assert got[: len(confirmed)] == confirmed

    def test_a_confirmed_durable_message_survives_a_restart(
        self,
        scow_broker: Any,
        scow_plugins: list[str],
        scow_sections: dict[str, Any],
        protocol_client: Callable[[BrokerThread], ConformanceClient],
    ):
        plugins = [p for p in scow_plugins if p != "memory-journal"]
        plugins += [] if "file-journal" in plugins else ["file-journal"]
        broker = scow_broker(plugins=plugins, sections=scow_sections)
        self.declare(broker, "durable")
        producer = protocol_client(broker)
        try:
            assert producer.send("durable", b"keep me", {"n": "1"}, durable=True)
        finally:
            producer.close()
        broker.stop()
        again = BrokerThread(broker.config_path).start()
        try:
            assert self.count(again, "durable") == 1
        finally:
            again.stop()

    def test_malformed_input_costs_only_its_own_connection(self, broker: BrokerThread, client):
        self.declare(broker, "healthy")
        healthy = client()
        with socket.create_connection(
            ("127.0.0.1", broker.port_of(self.protocol)), timeout=WAIT
        ) as sock:
            sock.sendall(self.malformed_input)
            while sock.recv(65536):  # the broker answers (or not), then closes
                pass
        assert healthy.send("healthy", b"fine", {})
        assert self.count(broker, "healthy") == 1
