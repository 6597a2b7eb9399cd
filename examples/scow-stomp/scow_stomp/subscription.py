"""One SUBSCRIBE: a broker consumer that writes MESSAGE frames, with STOMP's ack modes.

- `auto`: a message is acknowledged as it is written; the subscription takes messages
  while the socket keeps up (none while asyncio has paused writing).
- `client`: an ACK acknowledges that message and every earlier one of the subscription.
- `client-individual`: an ACK or NACK settles that message only.

In the client modes at most `window` messages are unacknowledged at once (STOMP has no
flow control, so this is what keeps a slow client from taking a whole queue).

A large message's frame is made as its store reads its body, off the event loop where
the store reads there (`scow_stomp.large`); an auto subscription's is acknowledged once
written whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from scow.core import InvalidField, LargeHead, Message, MessageRef
from scow_stomp import convert, frames
from scow_stomp.large import StreamedFrame

log = structlog.get_logger("scow.stomp")

if TYPE_CHECKING:
    from scow_stomp.connection import StompConnection

ACK_MODES = ("auto", "client", "client-individual")


class Subscription:
    """A `scow.core.Consumer` for one STOMP subscription."""

    def __init__(
        self, conn: StompConnection, sub_id: str, destination: str, ack: str, window: int
    ) -> None:
        if ack not in ACK_MODES:
            raise InvalidField(f"ack {ack!r}: expected one of {', '.join(ACK_MODES)}")
        self.conn = conn
        self.id = sub_id
        self.destination = destination
        self.ack = ack
        self.window = window
        #: Set by the broker from the `selector` header.
        self.filter: Callable[[Message], bool] | None = None
        self.browse = False
        #: Delivered, unacknowledged messages by ack id, oldest first.
        self.pending: dict[str, MessageRef] = {}
        self.queue: Any = None
        self.durable = False

    def credit(self) -> int:
        if self.conn.busy or self.conn.closed:
            return 0
        if self.ack == "auto":
            return self.window
        return self.window - len(self.pending)

    def deliver(self, ref: MessageRef) -> None:
        message = ref.message
        delivered = message.format.for_delivery(message, ref.delivery_count)
        data = message.data
        # a large message's body is not here: its frame is made as its store reads it
        try:
            headers, body = convert.from_amqp(delivered)
        except Exception as exc:  # the bytes of an AMQP client that sent nonsense sections
            log.warning(
                "message dead-lettered: it cannot be made a STOMP frame",
                queue=ref.queue.name,
                message=message.id,
                reason=str(exc),
            )
            self.conn.broker.reject(ref)
            return
        headers["subscription"] = self.id
        headers["message-id"] = str(message.id)
        headers["destination"] = self.destination
        if ref.delivery_count:
            headers["redelivered"] = "true"
        if self.ack != "auto":
            ack_id = self.conn.next_ack_id()
            headers["ack"] = ack_id
            if self.conn.version == "1.1":  # 1.1 clients acknowledge by message-id
                headers["message-id"] = ack_id
            self.pending[ack_id] = ref
            self.conn.acks[ack_id] = self
        if isinstance(data, LargeHead):
            frame = StreamedFrame(headers, delivered, data, self.conn.pump)
            if self.ack == "auto":
                frame.ref = ref  # acknowledged once written whole
            self.conn.write_streamed(frame)
            return
        self.conn.write(frames.encode("MESSAGE", headers, body))
        if self.ack == "auto":
            self.conn.broker.acknowledge(ref)

    def detach(self, reason: str) -> None:
        """The broker ends the subscription (its queue was deleted)."""
        self.conn.fail(f"subscription '{self.id}' ended: {reason}")

    def settle(self, ack_id: str) -> list[MessageRef]:
        """The refs an ACK/NACK of `ack_id` covers, taken off the pending list; a full
        window that opens again has the queue offer more."""
        if ack_id not in self.pending:
            return []
        was_full = len(self.pending) >= self.window
        if self.ack == "client-individual":
            keys = [ack_id]
        else:  # cumulative: everything up to it, in delivery order
            keys = []
            for key in self.pending:
                keys.append(key)
                if key == ack_id:
                    break
        for key in keys:
            self.conn.acks.pop(key, None)
        taken = [self.pending.pop(key) for key in keys]
        if was_full:
            asyncio.get_running_loop().call_soon(self._offer_more)
        return taken

    def _offer_more(self) -> None:
        # after the ACK's refs were settled: the queue hands out what they made room for
        if not self.conn.closed and self.credit() > 0:
            self.queue.dispatch()

    def close(self, *, remove_subscription: bool) -> None:
        """Unsubscribe; what the client did not acknowledge goes back (a failed delivery)."""
        broker = self.conn.broker
        self.queue.remove_consumer(self)
        refs = sorted(self.pending.values(), key=lambda r: r.message.id)
        for ack_id in self.pending:
            self.conn.acks.pop(ack_id, None)
        self.pending.clear()
        for ref in refs:
            broker.release(ref, delivered=True)
        broker.unsubscribe(self, self.queue, remove_subscription=remove_subscription)
