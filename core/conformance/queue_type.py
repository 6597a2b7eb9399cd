"""The conformance suite every queue type passes (built-in and third-party).

Subclass `QueueTypeConformance` and say which queue it is about: the arguments that
declare a queue of the type (`queue_arguments`), the type's name (`queue_type`), and the
plugins the broker needs (`scow_plugins`, when yours is not among the defaults). A queue
type whose messages stay after they are acknowledged (a stream) sets `destructive =
False`; one that does not hand out messages in send order sets `fifo = False`; one that
keeps one message per key (last-value) gives each message its own key through
`message_properties`.

    class TestMyQueue(QueueTypeConformance):
        queue_type = "my-queue"

        @pytest.fixture
        def queue_arguments(self):
            return {"x-queue-type": "my-queue"}

        @pytest.fixture
        def scow_plugins(self):
            return [*DEFAULT_PLUGINS, "my-plugin"]

The tests run a real broker in-process (`scow_broker`, from `scow.core.testing`) and
talk to it with proton's AMQP client over a socket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from proton import Delivery, Message
from proton.reactor import Copy, Selector
from proton.utils import BlockingConnection

from scow.core.interfaces import Queue, stores_own_messages
from scow.core.model import InvalidField
from scow.core.testing import DEFAULT_PLUGINS, BrokerThread, wait_for
from scow.core.testing import amqp_client as amqp

QUEUE = "conformance"
WAIT = 10.0


def number(message: Message) -> int:
    """The test number a message carries (its `n` property)."""
    properties: Any = message.properties  # proton's stubs type it too narrowly
    return int(properties["n"])


class QueueTypeConformance:
    """Behaviour every queue type shares; set `queue_type` and a `queue_arguments` fixture."""

    #: The QueueType name the arguments select.
    queue_type = "standard"
    #: Acknowledged messages leave the queue.
    destructive = True
    #: Messages of one priority go out in the order they were sent.
    fifo = True

    @pytest.fixture
    def queue_arguments(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def scow_plugins(self) -> list[str]:
        return list(DEFAULT_PLUGINS)

    @pytest.fixture
    def message_properties(self) -> Callable[[int], dict[str, Any]]:
        """Application properties of the i-th test message (beyond `n`, its number)."""
        return lambda i: {}

    @pytest.fixture
    def broker(self, scow_broker: Any, scow_plugins: list[str]) -> BrokerThread:
        return scow_broker(plugins=scow_plugins)

    @pytest.fixture
    def queue(self, broker: BrokerThread, queue_arguments: dict[str, Any]) -> Any:
        """The queue under test, declared with the type's arguments (anycast, durable)."""
        return broker.call(
            lambda: broker.broker.declare_queue(
                QUEUE, routing_type="ANYCAST", arguments=queue_arguments
            )
        )

    @pytest.fixture
    def send(
        self, broker: BrokerThread, message_properties: Callable[[int], dict[str, Any]]
    ) -> Callable[..., None]:
        """send(range, **properties): messages numbered by `n`, durable, settled by the broker."""

        def send(numbers: range, **extra: Any) -> None:
            with amqp(broker) as conn:
                sender = conn.create_sender(QUEUE)
                for i in numbers:
                    properties = {"n": i, **message_properties(i), **extra}
                    sender.send(Message(body=f"m{i}", durable=True, properties=properties))

        return send

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def count(broker: BrokerThread) -> int:
        stats = broker.queue_stats(QUEUE)
        assert stats is not None, f"queue '{QUEUE}' is gone"
        return int(stats["message-count"])

    @staticmethod
    def receive(
        conn: BlockingConnection, count: int, *, accept: bool = True, **kwargs: Any
    ) -> list[Message]:
        receiver = conn.create_receiver(QUEUE, **kwargs)
        got = []
        for _ in range(count):
            got.append(receiver.receive(timeout=WAIT))
            if accept:
                receiver.accept()
        receiver.close()
        return got

    # ------------------------------------------------------------------ the type

    def test_the_arguments_build_a_queue_of_the_type(self, broker: BrokerThread, queue: Any):
        assert isinstance(queue, Queue)
        assert queue.spec.queue_type == self.queue_type
        assert (queue.name, queue.address) == (QUEUE, QUEUE)
        assert self.count(broker) == 0

    def test_an_unknown_argument_is_refused_naming_it(
        self, broker: BrokerThread, queue_arguments: dict[str, Any]
    ):
        arguments = {**queue_arguments, "no-such-argument": 1}
        with pytest.raises(InvalidField, match="no-such-argument"):
            broker.call(lambda: broker.broker.declare_queue("refused", arguments=arguments))
        assert broker.queue_stats("refused") is None

    # ------------------------------------------------------------------ delivery

    def test_every_message_sent_is_received_once(self, broker: BrokerThread, queue: Any, send):
        send(range(20))
        assert self.count(broker) == 20
        with amqp(broker) as conn:
            got = [number(m) for m in self.receive(conn, 20)]
        assert sorted(got) == list(range(20))
        if self.fifo:
            assert got == list(range(20))

    def test_acknowledged_messages_leave_the_queue(self, broker: BrokerThread, queue: Any, send):
        send(range(5))
        with amqp(broker) as conn:
            self.receive(conn, 5)
        expected = 0 if self.destructive else 5
        wait_for(lambda: self.count(broker) == expected, WAIT, what=f"{expected} left")

    def test_a_released_message_comes_back_counted(self, broker: BrokerThread, queue: Any, send):
        send(range(1))
        with amqp(broker) as conn:
            receiver = conn.create_receiver(QUEUE)
            first = receiver.receive(timeout=WAIT)
            # a failed attempt (modified, delivery-failed), which counts a delivery
            assert receiver.fetcher is not None
            delivery = receiver.fetcher.unsettled.popleft()
            delivery.local.failed = True
            delivery.update(Delivery.MODIFIED)
            delivery.settle()
            again = receiver.receive(timeout=WAIT)
            receiver.accept()
        assert number(again) == number(first) == 0
        assert again.delivery_count >= 1

    def test_unsettled_messages_return_when_the_consumer_goes(
        self, broker: BrokerThread, queue: Any, send
    ):
        send(range(3))
        with amqp(broker) as conn:
            receiver = conn.create_receiver(QUEUE)
            for _ in range(3):
                receiver.receive(timeout=WAIT)  # never settled
        wait_for(lambda: (broker.queue_stats(QUEUE) or {}).get("delivering-count") == 0, WAIT)
        assert self.count(broker) == 3
        with amqp(broker) as conn:
            assert sorted(number(m) for m in self.receive(conn, 3)) == [0, 1, 2]

    def test_a_selector_consumer_gets_only_what_it_matches(
        self, broker: BrokerThread, queue: Any, send
    ):
        send(range(6))
        with amqp(broker) as conn:
            got = self.receive(conn, 3, options=Selector("n >= 3"))
        assert sorted(number(m) for m in got) == [3, 4, 5]

    def test_two_consumers_share_the_messages(self, broker: BrokerThread, queue: Any, send):
        if not self.destructive:
            pytest.skip("a non-destructive type gives every consumer every message")
        send(range(10))
        with amqp(broker) as one, amqp(broker) as two:
            first = one.create_receiver(QUEUE, credit=10)
            second = two.create_receiver(QUEUE, credit=10)
            seen: list[int] = []
            while len(seen) < 10:
                for receiver in (first, second):
                    with contextlib.suppress(Exception):
                        seen.append(number(receiver.receive(timeout=0.05)))
                        receiver.accept()
        assert sorted(seen) == list(range(10))

    def test_a_browser_sees_messages_without_taking_them(
        self, broker: BrokerThread, queue: Any, send
    ):
        send(range(4))
        with amqp(broker) as conn:
            got = self.receive(conn, 4, accept=False, options=Copy())  # browsed: settled
        assert sorted(number(m) for m in got) == [0, 1, 2, 3]
        assert self.count(broker) == 4

    def test_take_removes_the_waiting_messages(self, broker: BrokerThread, queue: Any, send):
        send(range(4))

        def purge() -> int:
            taken = queue.take()
            for ref in taken:
                broker.broker.discard(ref)
            return len(taken)

        assert broker.call(purge) == 4
        assert self.count(broker) == 0

    def test_stats_name_the_queue_and_count_its_messages(
        self, broker: BrokerThread, queue: Any, send
    ):
        send(range(2))
        stats: Mapping[str, Any] = broker.call(queue.stats)
        assert stats["name"] == QUEUE and stats["address"] == QUEUE
        assert stats["message-count"] == 2

    def test_messages_routed_while_the_address_pages_are_all_received(
        self,
        scow_broker: Any,
        scow_plugins: list[str],
        queue_arguments: dict[str, Any],
        message_properties: Callable[[int], dict[str, Any]],
    ):
        """Paged (read back through a cursor) or kept in the type's own storage
        (`stores_own_messages`), no message is lost to its address's pages, and the
        address leaves page mode once they are consumed."""
        if "paging" not in scow_plugins:
            pytest.skip("the paging plugin is not enabled")
        limits = {QUEUE: {"max-size-bytes": 2_000, "page-size-bytes": 4_000}}
        broker = scow_broker(plugins=scow_plugins, address_settings=limits)
        queue = broker.call(
            lambda: broker.broker.declare_queue(
                QUEUE, routing_type="ANYCAST", arguments=queue_arguments
            )
        )

        def paging() -> bool:
            return bool(broker.call(lambda: broker.broker.addresses[QUEUE].pager.paging))

        with amqp(broker) as conn:
            sender = conn.create_sender(QUEUE)
            for i in range(40):
                properties = {"n": i, **message_properties(i)}
                sender.send(Message(body="x" * 200, durable=True, properties=properties))
            # one that stores its own may have stored them all and left page mode already
            assert paging() or stores_own_messages(queue)
            got = [number(m) for m in self.receive(conn, 40)]
        assert sorted(got) == list(range(40))
        if self.fifo:
            assert got == list(range(40))
        wait_for(lambda: not paging(), WAIT, what="page mode to end")

    def test_durable_messages_survive_a_restart(
        self,
        scow_broker: Any,
        scow_plugins: list[str],
        queue_arguments: dict[str, Any],
        message_properties: Callable[[int], dict[str, Any]],
    ):
        plugins = [p for p in scow_plugins if p != "memory-journal"]
        plugins += [] if "file-journal" in plugins else ["file-journal"]
        broker = scow_broker(plugins=plugins)
        broker.call(lambda: broker.broker.declare_queue(QUEUE, arguments=queue_arguments))
        with amqp(broker) as conn:
            sender = conn.create_sender(QUEUE)
            for i in range(5):
                properties = {"n": i, **message_properties(i)}
                sender.send(Message(body=f"m{i}", durable=True, properties=properties))
        broker.stop()
        again = BrokerThread(broker.config_path).start()
        try:
            assert self.count(again) == 5
            restored = again.call(lambda: again.broker.queues[QUEUE])
            assert restored.spec.queue_type == self.queue_type
        finally:
            again.stop()
