"""The AMQP protocol plugin passes the protocol conformance suite, with proton's client."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import pytest
from proton import ConnectionException, Message, Timeout
from proton.reactor import Selector
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender, SendException

from scow.core.conformance.protocol import ProtocolConformance, Received
from scow.core.testing import BrokerThread

#: How long a send may wait for credit before it counts as held back (BLOCK).
SEND_WAIT = 1.0


class AmqpClient:
    """`ConformanceClient` over proton's blocking client."""

    def __init__(self, broker: BrokerThread) -> None:
        self.conn = BlockingConnection(broker.url, timeout=10)
        self.senders: dict[str, BlockingSender] = {}
        self.receiver: BlockingReceiver | None = None
        self.closed = False

    def send(
        self, address: str, body: bytes, properties: Mapping[str, str], *, durable: bool = False
    ) -> bool:
        if self.closed:
            return False
        try:
            sender = self.senders.get(address) or self.conn.create_sender(address)
            self.senders[address] = sender
            message = Message(body=body, properties=dict(properties), durable=durable)
            sender.send(message, timeout=SEND_WAIT)
            return True
        except (SendException, Timeout, ConnectionException):
            self.close()
            return False

    def subscribe(self, address: str, selector: str | None = None) -> None:
        options = Selector(selector) if selector is not None else None
        self.receiver = self.conn.create_receiver(address, options=options)

    def receive(self, timeout: float) -> Received | None:
        assert self.receiver is not None, "subscribe first"
        try:
            message = self.receiver.receive(timeout=timeout)
        except Timeout:
            return None
        properties = {str(k): str(v) for k, v in (message.properties or {}).items()}
        return Received(bytes(message.body), properties, self._accept)

    def _accept(self) -> None:
        assert self.receiver is not None
        self.receiver.accept()
        # a round trip (attaching a link waits for the broker's answer) makes sure the
        # disposition went out and was handled: proton's blocking client sends only while
        # it waits for something
        self.conn.create_sender(None).close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.conn.close()


class TestAmqpProtocol(ProtocolConformance):
    protocol = "amqp"
    malformed_input = b"HTTP/1.1 GET /\r\n\r\n"

    @pytest.fixture
    def scow_sections(self):
        # little credit, so that a full BLOCK address holds the producer back at once
        return {"amqp": {"producer-credit": 4}}

    @pytest.fixture
    def protocol_client(self):
        return AmqpClient
