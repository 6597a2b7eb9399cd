"""The conformance suite every address-full policy passes (built-in and third-party).

Subclass `FullPolicyConformance`, name the policy (`full_policy`, the `FullPolicyType`
name) and, when it is not among the defaults, the plugins the broker needs:

    class TestMyPolicy(FullPolicyConformance):
        full_policy = "MY_POLICY"

        @pytest.fixture
        def scow_plugins(self):
            return [*DEFAULT_PLUGINS, "my-plugin"]

The suite fills an address past its `max-size-bytes` over AMQP and holds the policy to
what it answers: every message it admits (and every one sent while the address had room)
reaches a consumer, every one it drops is accepted and never delivered, every one it
refuses is rejected to the producer, and while `blocks_producers()` is true the producer
gets no credit. Whatever it does, other addresses carry on and consumers making room let
messages in again.
"""

from __future__ import annotations

from typing import Any

import pytest
from proton import Delivery, Message, Timeout
from proton.utils import BlockingConnection, BlockingSender, SendException

from scow.core.interfaces import FullPolicy
from scow.core.testing import DEFAULT_PLUGINS, BrokerThread, wait_for
from scow.core.testing import amqp_client as amqp

ADDRESS = "full.conformance"
#: Each message counts its ~1 KB plus the broker's per-message overhead: 5 fill it.
LIMIT = 6000
BODY = "x" * 1000
SENDS = 20
PRODUCER_CREDIT = 4
WAIT = 10.0


class _Recording:
    """Wraps the address's policy to remember its verdict for each message, by `n`."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.verdicts: dict[int, bool | None] = {}
        self.blocked = False

    def admit(self, message: Any) -> bool | None:
        verdict = self.policy.admit(message)
        self.verdicts[int(message.lookup()("n"))] = verdict
        return verdict

    def blocks_producers(self) -> bool:
        blocks = bool(self.policy.blocks_producers())
        self.blocked |= blocks
        return blocks

    def __getattr__(self, name: str) -> Any:  # a paging policy's own attributes
        return getattr(self.policy, name)


class FullPolicyConformance:
    """Behaviour every full policy shares; set `full_policy`."""

    full_policy = "FAIL"

    @pytest.fixture
    def scow_plugins(self) -> list[str]:
        return list(DEFAULT_PLUGINS)

    @pytest.fixture
    def broker(self, scow_broker: Any, scow_plugins: list[str]) -> BrokerThread:
        return scow_broker(
            plugins=scow_plugins,
            address_settings={
                "full.#": {"max-size-bytes": LIMIT, "address-full-policy": self.full_policy}
            },
            sections={"amqp": {"producer-credit": PRODUCER_CREDIT}},
        )

    @pytest.fixture
    def recording(self, broker: BrokerThread) -> _Recording:
        """The address, created, with its policy wrapped to record verdicts."""

        def wrap() -> _Recording:
            address = broker.broker.address_for(ADDRESS, None)
            broker.broker.declare_queue(ADDRESS, routing_type="ANYCAST")
            address.full_policy = _Recording(address.full_policy)
            return address.full_policy

        return broker.call(wrap)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def fill(conn: BlockingConnection) -> tuple[list[int], list[int], BlockingSender]:
        """Send up to SENDS messages; (accepted, refused) numbers, stopping when credit
        runs out (a blocking policy)."""
        sender = conn.create_sender(ADDRESS)
        accepted, refused = [], []
        for n in range(SENDS):
            try:
                conn.wait(lambda: sender.link.credit > 0, timeout=0.5, msg="credit")
            except Timeout:
                break  # blocked
            try:
                sender.send(Message(body=BODY, properties={"n": n}), timeout=WAIT)
                accepted.append(n)
            except SendException as exc:
                assert exc.state == Delivery.REJECTED, f"send {n}: outcome {exc.state}"
                refused.append(n)
        return accepted, refused, sender

    @staticmethod
    def drain(conn: BlockingConnection, broker: BrokerThread) -> list[int]:
        """Receive (and accept) everything the queue holds; their numbers."""
        count = (broker.queue_stats(ADDRESS) or {})["message-count"]
        receiver = conn.create_receiver(ADDRESS)
        got: list[int] = []
        for _ in range(count):
            properties: Any = receiver.receive(timeout=WAIT).properties
            got.append(properties["n"])
            receiver.accept()
        receiver.close()
        return got

    # ------------------------------------------------------------------ the suite

    def test_the_policy_is_built_for_a_limited_address(
        self, broker: BrokerThread, recording: _Recording
    ):
        assert self.full_policy in broker.broker.full_policies
        assert isinstance(recording.policy, FullPolicy)
        assert broker.call(recording.blocks_producers) is False  # empty: nothing to block

    def test_below_the_limit_every_message_is_routed(
        self, broker: BrokerThread, recording: _Recording
    ):
        with amqp(broker) as conn:
            sender = conn.create_sender(ADDRESS)
            for n in range(3):
                sender.send(Message(body=BODY, properties={"n": n}))
            assert sorted(self.drain(conn, broker)) == [0, 1, 2]
        assert recording.verdicts == {}  # never asked: the address had room

    def test_the_outcome_of_each_message_is_what_the_policy_said(
        self, broker: BrokerThread, recording: _Recording
    ):
        with amqp(broker) as conn:
            accepted, refused, _sender = self.fill(conn)
            received = self.drain(conn, broker)
        verdicts = dict(recording.verdicts)
        assert verdicts, "the address never filled up"
        for n in refused:
            assert verdicts.get(n) is None and n in verdicts, f"message {n} refused unasked"
        dropped = {n for n, verdict in verdicts.items() if verdict is False}
        assert sorted(received) == sorted(set(accepted) - dropped)
        assert not dropped & set(received)
        if len(accepted) + len(refused) < SENDS:
            assert recording.blocked, "the producer ran out of credit without a block"

    def test_a_blocking_policy_withholds_credit_until_there_is_room(
        self, broker: BrokerThread, recording: _Recording
    ):
        with amqp(broker) as conn:
            accepted, refused, sender = self.fill(conn)
            if not recording.blocked:
                pytest.skip(f"{self.full_policy} does not block producers")
            assert len(accepted) + len(refused) < SENDS
            self.drain(conn, broker)
            conn.wait(lambda: sender.link.credit > 0, timeout=WAIT, msg="credit after draining")

    def test_other_addresses_carry_on_while_one_is_full(
        self, broker: BrokerThread, recording: _Recording
    ):
        with amqp(broker) as conn:
            self.fill(conn)
            other = conn.create_sender("elsewhere")
            other.send(Message(body="free", properties={"n": 0}))
        wait_for(lambda: broker.queue_stats("elsewhere"), WAIT, what="the other queue")
        assert (broker.queue_stats("elsewhere") or {})["message-count"] == 1

    def test_room_made_by_consumers_lets_messages_in_again(
        self, broker: BrokerThread, recording: _Recording
    ):
        with amqp(broker) as conn:
            self.fill(conn)
            self.drain(conn, broker)
        with amqp(broker) as conn:  # a new producer: a blocked one's credit is back too
            sender = conn.create_sender(ADDRESS)
            sender.send(Message(body="again", properties={"n": SENDS}), timeout=WAIT)
            assert self.drain(conn, broker) == [SENDS]
