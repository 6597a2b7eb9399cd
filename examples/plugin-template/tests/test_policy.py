"""The policy passes Scow's full-policy conformance suite, and does what it says."""

from __future__ import annotations

import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection, SendException

from scow.core.conformance.full_policy import FullPolicyConformance
from scow.core.testing import DEFAULT_PLUGINS

PLUGINS = [*DEFAULT_PLUGINS, "example-policy"]


class TestDropNonDurableConformance(FullPolicyConformance):
    full_policy = "DROP_NON_DURABLE"

    @pytest.fixture
    def scow_plugins(self):
        return PLUGINS


def test_full_address_drops_non_durable_and_refuses_durable(scow_broker):
    broker = scow_broker(
        plugins=PLUGINS,
        address_settings={
            "orders": {"max-size-bytes": 1, "address-full-policy": "DROP_NON_DURABLE"}
        },
    )
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        sender = conn.create_sender("orders")
        sender.send(Message(body="fills it"))  # the address had room
        sender.send(Message(body="dropped"))  # accepted, never delivered
        with pytest.raises(SendException) as refused:
            sender.send(Message(body="kept out", durable=True))
        assert refused.value.state == Delivery.REJECTED
    finally:
        conn.close()
    assert broker.queue_stats("orders")["message-count"] == 1
