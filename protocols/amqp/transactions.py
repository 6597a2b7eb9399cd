"""AMQP local transactions: the coordinator link and transactional delivery states.

A client declares a transaction on a link whose target is the coordinator, sends and
acknowledges with a `transactional-state` naming it, and discharges it (commit, or
rollback with fail=true). The broker side lives in `Broker.commit`/`Broker.rollback`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scow.core.model import BrokerError, RouteStatus
from scow.protocols.amqp import codec, engine

if TYPE_CHECKING:
    from scow.core.broker import Transaction
    from scow.protocols.amqp.connection import AmqpConnection

DECLARE = 0x31
DISCHARGE = 0x32
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
ACCEPTED_DESCRIPTOR = 0x24
_DESCRIPTORS = {
    "amqp:declare:list": DECLARE,
    "amqp:discharge:list": DISCHARGE,
    "amqp:accepted:list": ACCEPTED_DESCRIPTOR,
}
_TXN_ID = struct.Struct(">Q")


def descriptor_code(descriptor: Any) -> int | None:
    if isinstance(descriptor, str):
        return _DESCRIPTORS.get(descriptor)
    return int(descriptor) if isinstance(descriptor, int) else None


class UnknownTransaction(BrokerError):
    condition = "amqp:transaction:unknown-id"


class TransactionRollback(BrokerError):
    condition = "amqp:transaction:rollback"


def transaction_of(conn: AmqpConnection, delivery: Any) -> tuple[Transaction, list[Any]] | None:
    """The transaction a delivery's remote state names, or None if not transactional."""
    if engine.delivery_remote_state(delivery) != TRANSACTIONAL_STATE:
        return None
    fields = engine.remote_state_fields(delivery)
    txn_id = bytes(fields[0]) if fields and fields[0] is not None else b""
    tx = conn.transactions.get(txn_id)
    if tx is None:
        raise UnknownTransaction(f"transaction {txn_id.hex() or '(none)'} is not declared")
    return tx, fields


def accept_in(delivery: Any, tx: Transaction) -> None:
    """Settle an incoming transactional transfer: provisionally accepted in `tx`."""
    accepted = codec.Described(ACCEPTED_DESCRIPTOR, [])
    engine.update_with_fields(delivery, TRANSACTIONAL_STATE, [txn_bytes(tx), accepted])
    engine.delivery_settle(delivery)


def txn_bytes(tx: Transaction) -> bytes:
    return _TXN_ID.pack(tx.id)


class CoordinatorLink:
    """The link a client declares and discharges transactions on."""

    def __init__(self, conn: AmqpConnection, link: Any) -> None:
        self.conn = conn
        self.link = link
        self.closed = False
        engine.open_link(link, address=None)
        engine.link_flow(link, 100)

    def describe(self) -> dict[str, Any]:
        return {"name": engine.link_name(self.link), "role": "transaction coordinator"}

    def on_delivery(self, delivery: Any) -> None:
        if engine.delivery_partial(delivery) or not engine.delivery_readable(delivery):
            return  # partial, or its event came again after it was read (see ProducerLink)
        data = self.conn.engine.receive(self.link, delivery)
        try:
            self._control(delivery, data)
        except BrokerError as exc:
            engine.reject(delivery, exc.condition, exc.description)
        except ValueError as exc:
            engine.reject(delivery, "amqp:decode-error", f"transaction control message: {exc}")
        if engine.link_credit(self.link) < 50:
            engine.link_flow(self.link, 100 - engine.link_credit(self.link))

    def _control(self, delivery: Any, data: bytes) -> None:
        body = codec.scan_sections(data).body
        section = codec.decode_value(data, body[0])[0] if body else None
        value = section.value if isinstance(section, codec.Described) else None
        if not isinstance(value, codec.Described):
            raise BrokerError("a coordinator message must carry declare or discharge")
        code = descriptor_code(value.descriptor)
        fields = list(value.value or [])
        broker = self.conn.broker
        if code == DECLARE:
            tx = broker.begin()
            self.conn.transactions[txn_bytes(tx)] = tx
            engine.update_with_fields(delivery, DECLARED, [txn_bytes(tx)])
            engine.delivery_settle(delivery)
            return
        if code != DISCHARGE:
            raise BrokerError(f"unknown coordinator message {value.descriptor!r}")
        txn_id = bytes(fields[0]) if fields and fields[0] is not None else b""
        fail = bool(fields[1]) if len(fields) > 1 else False
        tx = self.conn.transactions.pop(txn_id, None)
        if tx is None:
            raise UnknownTransaction(f"transaction {txn_id.hex() or '(none)'} is not declared")
        if fail:
            broker.rollback(tx)
            self._accept(delivery)
            return
        try:
            status = broker.commit(
                tx, self.conn.accepter(delivery, self), self._rolled_back(delivery, tx)
            )
        except BrokerError as exc:
            broker.rollback(tx)
            raise TransactionRollback(f"transaction rolled back: {exc.description}") from exc
        if status is not RouteStatus.PENDING:
            return  # the accepter already ran

    def _rolled_back(self, delivery: Any, tx: Transaction) -> Callable[[BrokerError], None]:
        """What a commit done in slices calls if one of them fails: as for an error
        raised at once, the transaction is rolled back and its discharge rejected."""

        def failed(exc: BrokerError) -> None:
            self.conn.broker.rollback(tx)
            if not (self.conn.closed or self.closed):
                engine.reject(
                    delivery,
                    TransactionRollback.condition,
                    f"transaction rolled back: {exc.description}",
                )
                self.conn.mark_dirty()

        return failed

    @staticmethod
    def _accept(delivery: Any) -> None:
        engine.delivery_update(delivery, engine.ACCEPTED)
        engine.delivery_settle(delivery)

    def close(self, remote_closed: bool) -> None:
        self.closed = True
