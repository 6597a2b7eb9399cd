"""Client programs that the system tests run in their own processes.

    python -m tests.system.clients producer --url URL --log FILE --name P --lanes paged,prio
    python -m tests.system.clients consumer --url URL --log FILE --name C --receive paged ...
    python -m tests.system.clients tx-producer | tx-consumer | raw ...   (raw: see `peers`)

Every client appends what happened to `--log` (JSON lines, flushed per event; see
`records`), so a checker can read it even after the client was SIGKILLed:

- `sent`: the broker accepted the message (the only proof a message must exist);
- `refused`: the broker rejected, released or modified it;
- `delivered`: a message arrived (before the client settles it), with its delivery count;
- `acked`: the client accepted these messages; the event is written before proton sends
  the dispositions (they go out once the handler returns), so a client killed before
  writing it never acknowledged them;
- `tx-*`: a transaction's messages and outcome (`tx-discharge` is written before the
  discharge is sent: a commit without an outcome is in doubt);
- `read`: a stream reader's delivery (non-destructive).

SIGTERM stops a client cleanly: producers stop sending and wait for their outstanding
sends, consumers accept what they hold and detach. Any connection loss ends a client
(exit status 3) after a `disconnected` event: the schedule starts a new one.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from collections import deque
from typing import Any

from proton import (
    UNDESCRIBED,
    Array,
    Data,
    Delivery,
    Message,
    Terminus,
    symbol,
)
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, Filter, LinkOption, Selector

from tests.system.peers import EXIT_DISCONNECTED, run_raw
from tests.system.records import EventLog
from tests.system.topology import LANES, body_digest

STREAM_OFFSET = symbol("scow:stream-offset")


class Capabilities(LinkOption):
    """Capabilities of a receiver's source (or a sender's target): `topic`, ..."""

    def __init__(self, *names: str) -> None:
        self.names = [symbol(n) for n in names]

    def apply(self, link: Any) -> None:
        terminus = link.source if link.is_receiver else link.target
        terminus.capabilities.put_object(Array(UNDESCRIBED, Data.SYMBOL, *self.names))


class Durable(LinkOption):
    """A durable source that never expires: what a durable subscription attaches with."""

    def apply(self, link: Any) -> None:
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER


class _Stopper:
    """SIGTERM sets `requested`; a client polls it from a timer."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: Any) -> None:
        self.requested = True


class _Client(MessagingHandler):
    """What every reactor client shares: the log, stop on SIGTERM, exit on disconnect."""

    tick_interval = 0.05

    def __init__(self, args: argparse.Namespace, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.args = args
        self.log = EventLog(args.log, args.name)
        self.stopper = _Stopper()
        self.rng = random.Random(args.seed)
        self.connections: list[Any] = []
        self.exit_status = 0
        self.stopping_since: float | None = None

    def on_start(self, event: Any) -> None:
        self.log.write("started", pid=os.getpid())
        self.container = event.container
        self.setup(event.container)
        event.container.schedule(self.tick_interval, self)

    def connect(self, container: Any, container_id: str | None = None) -> Any:
        if container_id is not None:
            container.container_id = container_id
        conn = container.connect(self.args.url, reconnect=False)
        self.connections.append(conn)
        return conn

    def on_timer_task(self, event: Any) -> None:
        if self.stopper.requested and self.stopping_since is None:
            self.stopping_since = time.monotonic()
            self.log.write("stopping")
        if self.stopping_since is not None and (
            self.ready_to_stop() or time.monotonic() - self.stopping_since > 5
        ):
            self.finish()
            return
        self.tick()
        event.container.schedule(self.tick_interval, self)

    def finish(self) -> None:
        self.before_close()
        for conn in self.connections:
            conn.close()
        self.log.write("stopped")
        self.container.stop()

    def _lost(self, event: Any, what: str) -> None:
        if self.stopping_since is not None and what == "closed":
            return
        condition = None
        for source in (event.transport, event.connection):
            cond = getattr(source, "condition", None) if source is not None else None
            if cond is None and source is not None:
                cond = getattr(source, "remote_condition", None)
            if cond is not None:
                condition = f"{cond.name}: {cond.description}"
                break
        self.log.write("disconnected", what=what, condition=condition)
        self.exit_status = EXIT_DISCONNECTED
        os._exit(EXIT_DISCONNECTED)  # no reconnect: the schedule starts a fresh client

    def on_transport_error(self, event: Any) -> None:
        self._lost(event, "transport-error")

    def on_connection_error(self, event: Any) -> None:
        self._lost(event, "connection-error")

    def on_disconnected(self, event: Any) -> None:
        self._lost(event, "disconnected")

    def on_link_error(self, event: Any) -> None:
        self._lost(event, "link-error")

    def on_session_error(self, event: Any) -> None:
        self._lost(event, "session-error")

    # hooks
    def setup(self, container: Any) -> None: ...
    def tick(self) -> None: ...
    def ready_to_stop(self) -> bool:
        return True

    def before_close(self) -> None: ...


# --------------------------------------------------------------------------- producers


class Producer(_Client):
    """Sends each lane's messages at its rate, a window of unsettled sends per lane."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, auto_settle=True)
        self.lanes = [LANES[n] for n in args.lanes.split(",")]
        self.senders: dict[str, Any] = {}
        self.seq = 0
        self.pending: dict[Any, tuple[str, str, int, dict[str, Any]]] = {}
        self.inflight = dict.fromkeys((lane.name for lane in self.lanes), 0)
        self.budget = dict.fromkeys((lane.name for lane in self.lanes), 1.0)
        self.last = time.monotonic()

    def setup(self, container: Any) -> None:
        conn = self.connect(container)
        for lane in self.lanes:
            self.senders[lane.name] = container.create_sender(conn, lane.address)

    def tick(self) -> None:
        now = time.monotonic()
        elapsed, self.last = now - self.last, now
        for lane in self.lanes:
            rate = lane.rate * self.args.rate_factor
            self.budget[lane.name] = min(self.budget[lane.name] + elapsed * rate, 2 + rate / 4)
            self.pump(lane)

    def pump(self, lane: Any) -> None:
        sender = self.senders[lane.name]
        while (
            self.stopping_since is None
            and sender.credit > 0
            and self.inflight[lane.name] < self.args.window
            and self.budget[lane.name] >= 1
        ):
            self.budget[lane.name] -= 1
            self.seq += 1
            message, meta = lane.message(self.args.name, self.seq, self.rng)
            delivery = sender.send(message)
            self.pending[delivery] = (lane.name, str(message.id), self.seq, meta)
            self.inflight[lane.name] += 1

    def _settled(self, event: Any, kind: str) -> None:
        entry = self.pending.pop(event.delivery, None)
        if entry is None:
            return
        lane, ident, seq, meta = entry
        self.inflight[lane] -= 1
        fields: dict[str, Any] = {"lane": lane, "id": ident, "seq": seq, **meta}
        if kind != "sent":
            fields["outcome"] = kind
            condition = getattr(event.delivery.remote, "condition", None)
            if condition is not None:
                fields["condition"] = f"{condition.name}: {condition.description}"
        self.log.write("sent" if kind == "sent" else "refused", **fields)

    def on_accepted(self, event: Any) -> None:
        self._settled(event, "sent")

    def on_rejected(self, event: Any) -> None:
        self._settled(event, "rejected")

    def on_released(self, event: Any) -> None:
        self._settled(event, "released")

    def on_modified(self, event: Any) -> None:
        self._settled(event, "modified")

    def ready_to_stop(self) -> bool:
        return not self.pending


# --------------------------------------------------------------------------- consumers


def parse_receive(spec: str) -> dict[str, Any]:
    """`lane[:option=value...]`: `paged`, `select:color=red`, `topic:sub=sub-a`,
    `stream:offset=first`, `ttl:delay=0.2`."""
    lane, *options = spec.split(":")
    parsed: dict[str, Any] = {"lane": lane}
    for option in options:
        key, _, value = option.partition("=")
        parsed[key] = value
    return parsed


class _Receiving:
    """One receiver link of a consumer and what it holds unacknowledged."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.lane = LANES[spec["lane"]]
        self.sub = spec.get("sub")
        self.queue = f"{self.sub}.audit" if self.sub else self.lane.address
        self.stream = "offset" in spec
        self.delay = float(spec.get("delay", 0))
        self.color = spec.get("color")
        self.link: Any = None
        self.backlog: deque[tuple[Any, Message]] = deque()  # received, not yet handled
        self.unacked: list[tuple[Any, str]] = []  # handled, waiting for the next ack batch
        self.next_handle = 0.0
        self.last_ack = time.monotonic()


class Consumer(_Client):
    """Receives from one or more lanes; accepts in batches of `--ack-every`, each message
    after `delay` seconds (a slow consumer); rejects poison messages as failed."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, prefetch=0, auto_accept=False, auto_settle=False)
        self.receiving = [_Receiving(parse_receive(s)) for s in args.receive]
        self.by_link: dict[Any, _Receiving] = {}

    def setup(self, container: Any) -> None:
        plain = None
        for r in self.receiving:
            if r.sub:  # a durable subscription belongs to its container id
                conn = self.connect(container, container_id=r.sub)
                options: list[Any] = [Capabilities("topic"), Durable()]
                name = "audit"
            else:
                if plain is None:
                    plain = self.connect(container, container_id=f"{self.args.name}-{os.getpid()}")
                conn = plain
                options = []
                name = f"{self.args.name}-{r.lane.name}-{r.color or ''}"
            if r.color:
                options.append(Selector(f"color = '{r.color}'"))
            if r.stream:
                options.append(Filter({STREAM_OFFSET: r.spec["offset"]}))
            r.link = container.create_receiver(conn, r.lane.address, name=name, options=options)
            self.flow(r, self.args.credit)
            self.by_link[r.link] = r

    def flow(self, r: _Receiving, credit: int) -> None:
        """Grant credit, logged first (the checker knows when a delivery could be sent)."""
        link = {"selector": r.color} if r.color else {}
        self.log.write("credit", queue=r.queue, n=credit, **link)
        r.link.flow(credit)

    def on_message(self, event: Any) -> None:
        r = self.by_link[event.receiver]
        message = event.message
        props = message.properties or {}
        fields: dict[str, Any] = {
            "lane": r.lane.name,
            "queue": r.queue,
            "id": str(message.id),
            "producer": props.get("producer"),
            "seq": props.get("seq"),
            "count": message.delivery_count,
        }
        if r.color:
            fields["color"] = props.get("color")
            fields["selector"] = r.color
        if "k" in props:
            fields["k"] = props["k"]  # a last-value key: in-doubt values replace too
        if "sha" in props:
            fields["intact"] = body_digest(message.body) == props["sha"]
        annotations = message.annotations or {}
        if r.stream:
            fields["sequence"] = annotations.get(symbol("x-opt-sequence-number"))
            self.log.write("read", **fields)
        else:
            self.log.write("delivered", **fields)
        r.backlog.append((event.delivery, message))
        self.handle(r)

    def handle(self, r: _Receiving) -> None:
        """Settle what the backlog holds, at most one message per `delay`."""
        now = time.monotonic()
        while r.backlog and now >= r.next_handle:
            delivery, message = r.backlog.popleft()
            props = message.properties or {}
            if props.get("poison"):
                delivery.local.failed = True
                delivery.update(Delivery.MODIFIED)
                delivery.settle()
                self.log.write("poisoned", lane=r.lane.name, queue=r.queue, id=str(message.id))
                self.flow(r, 1)
            else:
                r.unacked.append((delivery, str(message.id)))
            if r.delay:
                r.next_handle = now + r.delay
        if len(r.unacked) >= self.args.ack_every or (
            r.unacked and now - r.last_ack > self.args.ack_interval
        ):
            self.ack(r)

    def ack(self, r: _Receiving) -> None:
        if not r.unacked:
            return
        # logged first: the dispositions leave only after this handler returns
        self.log.write("acked", lane=r.lane.name, queue=r.queue, ids=[i for _, i in r.unacked])
        for delivery, _ in r.unacked:
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
        self.flow(r, len(r.unacked))
        r.unacked = []
        r.last_ack = time.monotonic()

    def tick(self) -> None:
        for r in self.receiving:
            self.handle(r)

    def ready_to_stop(self) -> bool:
        return True

    def before_close(self) -> None:
        for r in self.receiving:
            # what arrived is taken (a release would bring it back with the same delivery
            # count, as if never delivered)
            r.next_handle = 0.0
            r.delay = 0.0
            self.handle(r)
            self.ack(r)
            if r.sub:
                r.link.detach()  # a close would end the durable subscription


# --------------------------------------------------------------------------- transactions


class TxProducer(_Client, TransactionHandler):
    """Sends batches in transactions; commits most, aborts some; may hold a transaction
    open for a while before discharging (a window for a kill mid-transaction)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, auto_settle=True)
        self.lane = LANES[args.lane]
        self.batch = 0
        self.seq = 0
        self.transaction: Any = None
        self.to_send: list[Message] = []
        self.sent: list[Any] = []
        self.ids: list[str] = []
        self.discharge_at: float | None = None
        self.busy = False

    def setup(self, container: Any) -> None:
        self.conn = self.connect(container)
        self.sender = container.create_sender(self.conn, self.lane.address)

    def tick(self) -> None:
        stopping = self.stopping_since is not None
        chance = self.args.rate_factor * self.tick_interval * 4
        if not self.busy and not stopping and self.rng.random() < chance:
            self.busy = True
            self.container.declare_transaction(self.conn, handler=self)
        if self.transaction is not None:
            if stopping:
                self.discharge_at = time.monotonic()
            self.send_some()
            if not self.to_send and self.discharge_at and time.monotonic() >= self.discharge_at:
                self.discharge()

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.batch += 1
        self.to_send, self.ids, self.sent = [], [], []
        for _ in range(self.rng.randint(1, self.args.batch)):
            self.seq += 1
            message, _ = self.lane.message(self.args.name, self.seq, self.rng)
            self.to_send.append(message)
            self.ids.append(str(message.id))
        self.log.write("tx-begin", lane=self.lane.name, batch=self.batch, ids=self.ids)
        hold = float("inf") if self.args.stall else self.rng.uniform(0, self.args.hold)
        self.discharge_at = time.monotonic() + hold
        self.send_some()

    def send_some(self) -> None:
        while self.to_send and self.sender.credit > 0:
            self.sent.append(self.transaction.send(self.sender, self.to_send.pop(0)))
        if self.sent and not self.to_send and all(d.remote_state or d.settled for d in self.sent):
            # the broker has every transfer (its transactional state came back)
            self.log.write("tx-sent", lane=self.lane.name, batch=self.batch, ids=self.ids)
            self.sent = []

    def on_sendable(self, event: Any) -> None:
        if self.transaction is not None:
            self.send_some()

    def discharge(self) -> None:
        commit = self.rng.random() >= self.args.abort_ratio
        self.log.write(
            "tx-discharge", lane=self.lane.name, batch=self.batch, ids=self.ids, commit=commit
        )
        transaction, self.transaction, self.discharge_at = self.transaction, None, None
        if commit:
            transaction.commit()
        else:
            transaction.abort()

    def on_transaction_committed(self, event: Any) -> None:
        self.log.write("tx-committed", lane=self.lane.name, batch=self.batch, ids=self.ids)
        self.busy = False

    def on_transaction_aborted(self, event: Any) -> None:
        self.log.write("tx-aborted", lane=self.lane.name, batch=self.batch, ids=self.ids)
        self.busy = False

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.log.write("tx-commit-failed", lane=self.lane.name, batch=self.batch, ids=self.ids)
        self.busy = False

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.log.write("tx-declare-failed", lane=self.lane.name)
        self.busy = False

    def ready_to_stop(self) -> bool:
        return not self.busy


class TxConsumer(_Client, TransactionHandler):
    """Accepts batches of messages in transactions; commits most, aborts some."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, prefetch=0, auto_accept=False, auto_settle=False)
        self.lane = LANES[args.lane]
        self.transaction: Any = None
        self.ids: list[str] = []
        self.wanted = 0
        self.deadline = 0.0
        self.busy = False
        self.batch = 0
        self.waiting: deque[tuple[Any, str]] = deque()

    def setup(self, container: Any) -> None:
        self.conn = self.connect(container)
        self.receiver = container.create_receiver(self.conn, self.lane.address)

    def tick(self) -> None:
        stopping = self.stopping_since is not None
        if not self.busy and not stopping:
            self.busy = True
            self.container.declare_transaction(self.conn, handler=self)
        elif self.transaction is not None and (stopping or time.monotonic() > self.deadline):
            self.discharge()

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.batch += 1
        self.ids = []
        self.wanted = self.args.batch if self.args.stall else self.rng.randint(1, self.args.batch)
        hold = float("inf") if self.args.stall else self.rng.uniform(0.1, 0.3 + self.args.hold)
        self.deadline = time.monotonic() + hold
        credit = self.wanted - len(self.waiting) - self.receiver.credit
        if credit > 0:
            self.log.write("credit", queue=self.lane.address, n=credit)
            self.receiver.flow(credit)
        self.take()

    def on_message(self, event: Any) -> None:
        message = event.message
        props = message.properties or {}
        self.log.write(
            "delivered",
            lane=self.lane.name,
            queue=self.lane.address,
            id=str(message.id),
            producer=props.get("producer"),
            seq=props.get("seq"),
            count=message.delivery_count,
        )
        # one that comes after the discharge waits for the next transaction: released, it
        # would come back with the same delivery count, looking like a first delivery
        self.waiting.append((event.delivery, str(message.id)))
        self.take()

    def take(self) -> None:
        while self.transaction is not None and self.waiting and len(self.ids) < self.wanted:
            delivery, ident = self.waiting.popleft()
            self.transaction.accept(delivery)
            self.ids.append(ident)
        if self.transaction is not None and self.ids and len(self.ids) >= self.wanted:
            if self.args.stall:
                self.log.write("tx-holding", lane=self.lane.name, ids=self.ids)
            else:
                self.discharge()

    def discharge(self) -> None:
        commit = self.rng.random() >= self.args.abort_ratio
        self.log.write(
            "tx-discharge",
            lane=self.lane.name,
            queue=self.lane.address,
            batch=self.batch,
            ids=self.ids,
            commit=commit,
        )
        transaction, self.transaction = self.transaction, None
        if commit:
            transaction.commit()
        else:
            transaction.abort()

    def _ended(self, kind: str) -> None:
        self.log.write(
            kind, lane=self.lane.name, queue=self.lane.address, batch=self.batch, ids=self.ids
        )
        self.busy = False

    def on_transaction_committed(self, event: Any) -> None:
        self._ended("tx-committed")

    def on_transaction_aborted(self, event: Any) -> None:
        self._ended("tx-aborted")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._ended("tx-commit-failed")

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.log.write("tx-declare-failed", lane=self.lane.name)
        self.busy = False

    def ready_to_stop(self) -> bool:
        return not self.busy


# --------------------------------------------------------------------------- main


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.system.clients")
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("producer", "consumer", "tx-producer", "tx-consumer", "raw"):
        p = sub.add_parser(role)
        p.add_argument("--url", default="")
        p.add_argument("--port", type=int, default=0)
        p.add_argument("--log", required=True)
        p.add_argument("--name", required=True)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--rate-factor", type=float, default=1.0)
        if role == "producer":
            p.add_argument("--lanes", required=True)
            p.add_argument("--window", type=int, default=10)
        if role == "consumer":
            p.add_argument("--receive", action="append", required=True)
            p.add_argument("--credit", type=int, default=10)
            p.add_argument("--ack-every", type=int, default=1)
            p.add_argument("--ack-interval", type=float, default=0.5)
        if role.startswith("tx-"):
            p.add_argument("--lane", default="tx")
            p.add_argument("--batch", type=int, default=5)
            p.add_argument("--abort-ratio", type=float, default=0.25)
            p.add_argument("--hold", type=float, default=0.5)
            p.add_argument("--stall", action="store_true", help="never discharge (tests)")
        if role == "raw":
            p.add_argument("--lane", required=True)
            p.add_argument("--address", default="", help="default: the lane's address")
            p.add_argument("--mode", choices=("receive", "partial-send", "attach"))
            p.add_argument("--end", choices=("reset", "fin", "close-no-wait", "hold"))
            p.add_argument("--tls-ca", default="")
            p.add_argument("--count", type=int, default=20)
            p.add_argument("--seconds", type=float, default=2.0)
            p.add_argument("--size", type=int, default=400_000)
            p.add_argument("--fraction", type=float, default=0.4)
    return parser.parse_args(argv)


ROLES = {
    "producer": Producer,
    "consumer": Consumer,
    "tx-producer": TxProducer,
    "tx-consumer": TxConsumer,
}


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.role == "raw":
        return run_raw(args)
    client = ROLES[args.role](args)
    Container(client).run()
    return client.exit_status


if __name__ == "__main__":
    sys.exit(main())
