"""Address-full policies DROP, FAIL and BLOCK once an address holds max-size-bytes."""

from __future__ import annotations

import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection, SendException

from scow.core.testing import wait_for

BODY = "x" * 1000


def _limited(scow_broker, policy: str):
    return scow_broker(
        address_settings={"full.#": {"max-size-bytes": 5000, "address-full-policy": policy}}
    )


def _count(broker, queue: str) -> int:
    stats = broker.queue_stats(queue)
    return stats["message-count"] if stats else 0


def test_fail_policy_refuses_sends_once_full_and_serves_others(scow_broker):
    broker = _limited(scow_broker, "FAIL")
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        sender = conn.create_sender("full.fail")
        with pytest.raises(SendException) as refused:
            for _ in range(20):
                sender.send(Message(body=BODY))
        assert refused.value.state == Delivery.REJECTED
        assert 4 <= _count(broker, "full.fail") <= 6
        conn.create_sender("other").send(Message(body="fine"))
        assert _count(broker, "other") == 1
    finally:
        conn.close()


def test_drop_policy_accepts_but_discards_once_full(scow_broker):
    broker = _limited(scow_broker, "DROP")
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        sender = conn.create_sender("full.drop")
        for _ in range(20):
            sender.send(Message(body=BODY))  # every send is accepted
        assert 4 <= _count(broker, "full.drop") <= 6
    finally:
        conn.close()


def test_block_policy_withholds_credit_until_consumers_make_room(scow_broker):
    broker = scow_broker(
        # each message counts its ~1050 bytes plus MEMORY_OVERHEAD: 5 fill the address
        address_settings={"full.#": {"max-size-bytes": 6500, "address-full-policy": "BLOCK"}},
        sections={"amqp": {"producer-credit": 4}},
    )
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        sender = conn.create_sender("full.block")
        # 5 messages fill the address; in-flight credit is honoured, then none is renewed
        for _ in range(8):
            sender.send(Message(body=BODY), timeout=10)
        assert _count(broker, "full.block") == 8
        assert sender.link.credit == 0
        receiver = conn.create_receiver("full.block")
        for _ in range(8):
            receiver.receive(timeout=10)
            receiver.accept()
        wait_for(lambda: sender.link.credit > 0, what="credit after the address drained")
    finally:
        conn.close()
