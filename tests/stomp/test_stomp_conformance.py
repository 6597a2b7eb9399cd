"""The stomp plugin passes the protocol conformance suite, with stomp.py as its client."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping

import pytest
import stomp
from stomp_helpers import PLUGINS, Recorder

from scow.core.conformance.protocol import ProtocolConformance, Received
from scow.core.testing import BrokerThread, wait_for

#: Headers a MESSAGE frame carries about itself, not the message's properties.
_FRAME_HEADERS = {"subscription", "message-id", "destination", "ack", "content-length"}
_receipts = itertools.count()


class StompClient:
    """`ConformanceClient` over stomp.py (STOMP 1.2, client-individual acks)."""

    def __init__(self, broker: BrokerThread) -> None:
        self.conn = stomp.Connection12([("127.0.0.1", broker.port_of("stomp"))], auto_decode=False)
        self.seen = Recorder()
        self.conn.set_listener("seen", self.seen)
        self.conn.connect(wait=True)
        self.taken = 0
        self.closed = False

    def send(
        self, address: str, body: bytes, properties: Mapping[str, str], *, durable: bool = False
    ) -> bool:
        if self.closed:
            return False
        receipt = f"r{next(_receipts)}"
        headers = {**properties, "persistent": "true" if durable else "false"}
        self.conn.send(address, body, headers=headers, receipt=receipt)
        wait_for(lambda: receipt in self.seen.receipts or self.seen.errors, what="an answer")
        if self.seen.errors:
            self.close()
            return False
        return True

    def subscribe(self, address: str, selector: str | None = None) -> None:
        headers = {"selector": selector} if selector is not None else {}
        self.conn.subscribe(address, id="1", ack="client-individual", headers=headers)

    def receive(self, timeout: float) -> Received | None:
        try:
            wait_for(lambda: len(self.seen.messages) > self.taken, timeout)
        except AssertionError:
            return None
        frame = self.seen.messages[self.taken]
        self.taken += 1
        properties = {k: v for k, v in frame.headers.items() if k not in _FRAME_HEADERS}
        ack_id = frame.headers["ack"]
        return Received(frame.body, properties, lambda: self._ack(ack_id))

    def _ack(self, ack_id: str) -> None:
        receipt = f"a{next(_receipts)}"
        self.conn.ack(ack_id, receipt=receipt)
        self.seen.wait_receipt(receipt)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.conn.disconnect(receipt="bye")
                wait_for(lambda: "bye" in self.seen.receipts or self.seen.disconnected.is_set())


class TestStompProtocol(ProtocolConformance):
    protocol = "stomp"
    malformed_input = b"HELLO\n\n\x00"

    @pytest.fixture
    def scow_plugins(self):
        return list(PLUGINS)

    @pytest.fixture
    def scow_sections(self):
        return {"stomp": {"listen": ["127.0.0.1:0"]}}

    @pytest.fixture
    def protocol_client(self):
        return StompClient
