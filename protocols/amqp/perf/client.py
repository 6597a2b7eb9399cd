"""`scow perf client`: an AMQP 1.0 load generator measuring rates and end-to-end latency.

It drives the engine facade over non-blocking sockets with `selectors` (`wire`), and runs
its producers and its consumers in two processes so that it can use two cores; each
producer sends one pre-encoded message whose first 8 body bytes it overwrites with the
send time (CLOCK_MONOTONIC, shared by the processes of one machine), and each consumer
reads that stamp back for the end-to-end latency.

`--mode send` runs the producers alone (to fill a queue) and `--mode receive` the
consumers alone (to drain one): a backlog is then measured apart from the rate it was
built at. Latency needs both ends of one run, so those modes report none.
"""

from __future__ import annotations

import array
import multiprocessing
import os
import selectors
import time
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_any
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

from scow.protocols.amqp import engine
from scow.protocols.amqp.perf.errors import PerfError
from scow.protocols.amqp.perf.messages import (
    _DATA_SECTION,
    _ID,
    _STAMP,
    id_offset,
    make_message,
    stamp_offset,
)
from scow.protocols.amqp.perf.summary import summarize
from scow.protocols.amqp.perf.wire import (
    _IO_SIZE,
    _READ,
    _SEND_BATCH,
    _TAG,
    _WRITE,
    Wire,
    _connect,
    _in_buf,
)

_CLOSE_WAIT = 5.0  # seconds a finished run waits for the peer to answer its close


def _because(condition: tuple[str | None, str | None]) -> str:
    name, text = condition
    return f" ({name}: {text})" if name else ""


def _check_link(wire: Wire, link: Any, what: str) -> None:
    """Raise when the peer ended the connection or the link."""
    if engine.connection_state(wire.connection) & engine.REMOTE_CLOSED:
        cause = _because(engine.remote_connection_condition(wire.connection))
        raise PerfError(f"{what}: the peer closed the connection{cause}")
    if engine.link_state(link) & engine.REMOTE_CLOSED:
        cause = _because(engine.remote_link_condition(link))
        raise PerfError(f"{what}: the peer closed the link{cause}")
    if wire.eof:
        cause = _because(wire.engine.transport_condition())
        raise PerfError(f"{what}: the connection was lost{cause}")


# --------------------------------------------------------------------------- client roles


class _Producer:
    """Sends `total` messages on one link, paced at `rate` msg/s when given."""

    def __init__(self, wire: Wire, address: str, index: int, options: dict[str, Any]) -> None:
        self.wire = wire
        self.address = address
        self.total = options["count"] + options["warmup"]
        self.warmup = options["warmup"]
        self.presettled = options["presettled"]
        self.rate = options["rate"]
        self.max_pending = options["max_pending"] or self.total
        ids = options.get("duplicate_ids", False)
        message, self.offset = make_message(
            options["size"],
            durable=options["durable"],
            duplicate_id=ids,
            properties=options.get("properties"),
        )
        #: Where each message's duplicate id goes (-1: none), and its producer's prefix.
        self.id_offset = id_offset(message) if ids else -1
        self.id_prefix = (os.getpid() << 16 | index) << 24 | (time.time_ns() >> 30) & 0xFFFFFF
        self.size = len(message)
        self.msg_buf, self.msg_view = engine.new_buffer(self.size)
        self.msg_view[:] = message
        self.tag, self.tag_view = engine.new_tag()
        engine.client_open(wire.connection, f"scow-perf-producer-{os.getpid()}-{index}")
        session = engine.new_session(wire.connection)
        self.link = engine.new_sender(
            session, f"perf-producer-{index}", address, presettled=self.presettled
        )
        self.unsettled: deque[Any] = deque()
        self.sent = 0
        self.settled = 0
        self.outcomes: dict[str, int] = {"accepted": 0, "rejected": 0, "released": 0, "other": 0}
        self.start_ns = 0
        self.measure_from_ns = 0
        self.end_ns = 0

    @property
    def attached(self) -> bool:
        return bool(engine.link_state(self.link) & engine.REMOTE_ACTIVE)

    @property
    def done(self) -> bool:
        return self.sent >= self.total and (self.presettled or self.settled >= self.total)

    def check(self) -> None:
        if not self.done:
            _check_link(self.wire, self.link, f"producer to {self.address!r}")

    def settle(self) -> None:
        """Count and settle the deliveries the peer has decided on, oldest first."""
        unsettled = self.unsettled
        if not unsettled:
            return
        remote_state, remote_settled = engine.delivery_remote_state, engine.delivery_settled
        settle, popleft, accepted_state = engine.delivery_settle, unsettled.popleft, engine.ACCEPTED
        accepted = 0
        while unsettled:
            delivery = unsettled[0]
            state = remote_state(delivery)
            if state == accepted_state:
                accepted += 1
            elif state or remote_settled(delivery):
                name = _OUTCOME_NAMES.get(state, "other")
                self.outcomes[name] += 1
                self.settled += 1
            else:
                break  # peers decide in order in practice: stop at the first undecided one
            settle(delivery)
            popleft()
        self.outcomes["accepted"] += accepted
        self.settled += accepted
        if self.settled >= self.total and not self.end_ns:
            self.end_ns = time.monotonic_ns()

    def pump(self, now_ns: int) -> float | None:
        """Hand proton what credit, pacing and the in-flight cap allow.

        Returns 0 when more could go at once, the seconds until the next message is due
        when paced, or None when waiting on the peer (credit or outcomes).
        """
        if self.sent >= self.total:
            return None
        if not self.start_ns:
            self.start_ns = now_ns
            if not self.warmup:
                self.measure_from_ns = now_ns
        credit = engine.link_credit(self.link)
        in_flight = len(self.unsettled)
        room = min(credit, self.total - self.sent, self.max_pending - in_flight, _SEND_BATCH)
        wait: float | None = 0.0 if room == _SEND_BATCH else None
        if self.rate:
            elapsed = (now_ns - self.start_ns) / 1e9
            due = int(elapsed * self.rate) + 1 - self.sent
            if due < room:
                room = max(due, 0)
                wait = max((self.sent + room + 1) / self.rate - elapsed, 0.0)
        if room <= 0:
            return wait
        link, tag, tag_view = self.link, self.tag, self.tag_view
        msg_buf, msg_view, size, offset = self.msg_buf, self.msg_view, self.size, self.offset
        new_delivery, link_send, advance = (
            engine.new_delivery,
            engine.link_send,
            engine.link_advance,
        )
        pack_tag, pack_stamp, clock = _TAG.pack_into, _STAMP.pack_into, time.monotonic_ns
        keep = engine.delivery_settle if self.presettled else self.unsettled.append
        sent, warmup = self.sent, self.warmup
        id_at, pack_id, id_prefix = self.id_offset, _ID.pack_into, self.id_prefix
        for _ in range(room):
            sent += 1
            pack_tag(tag_view, 0, sent)
            if id_at >= 0:
                pack_id(msg_view, id_at, id_prefix, sent)
            stamp = clock()
            pack_stamp(msg_view, offset, stamp)
            delivery = new_delivery(link, tag)
            link_send(link, msg_buf, size)
            advance(link)
            keep(delivery)
            if sent == warmup:
                self.measure_from_ns = stamp
        self.sent = sent
        if self.presettled and sent >= self.total:
            self.end_ns = clock()
        return wait

    def report(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "outcomes": self.outcomes,
            "from_ns": self.measure_from_ns,
            "to_ns": self.end_ns,
        }


_OUTCOME_NAMES = {engine.REJECTED: "rejected", engine.RELEASED: "released"}


class _Consumer:
    """Receives `total` messages on one link, accepting each unless pre-settled."""

    def __init__(self, wire: Wire, address: str, index: int, options: dict[str, Any]) -> None:
        self.wire = wire
        self.address = address
        self.total = options["count"] + options["warmup"]
        self.warmup = options["warmup"]
        self.window = options["credit"]
        engine.client_open(wire.connection, f"scow-perf-consumer-{os.getpid()}-{index}")
        session = engine.new_session(wire.connection)
        # --mode receive: the messages wait already, so the credit that asks for them goes
        # out when the run starts (the first consume() tops the window up) and the clock
        # starts with it; timed from the first arrival, a first read that brings them all
        # would leave no time to divide by
        self.draining = options["mode"] == "receive"
        credit = 0 if self.draining else self.window
        self.link = engine.new_receiver(session, f"perf-consumer-{index}", address, credit)
        if self.draining and options["presettled"]:
            # proton writes the attach when the transport is next processed, so the mode
            # set now still goes out with it; in pairs mode --presettled is the producers'
            engine.set_sender_settle_mode_settled(self.link)
        self.received = 0
        self.unstamped = 0
        # stamps from another run make no latency: a zero-length deque takes the loop's
        # appends at the same cost and keeps none (10 M messages would be 80 MB)
        self.latencies: array.array[int] | deque[int] = (
            deque(maxlen=0) if options["mode"] == "receive" else array.array("q")
        )
        self.buf_size = max(_IO_SIZE, options["size"] + 4096)
        self.buf, self.view = engine.new_buffer(self.buf_size)
        self.layout = (-1, 0, 0)  # size, stamp offset and data-section marker of the last read
        self.measure_from_ns = 0
        self.end_ns = 0

    @property
    def attached(self) -> bool:
        return bool(engine.link_state(self.link) & engine.REMOTE_ACTIVE)

    @property
    def done(self) -> bool:
        return self.received >= self.total

    def check(self) -> None:
        if not self.done:
            _check_link(self.wire, self.link, f"consumer from {self.address!r}")

    def begin(self, now_ns: int) -> None:
        """The run starts now: a draining consumer's clock starts with its first credit."""
        if self.draining and not self.warmup:
            self.measure_from_ns = now_ns

    def consume(self, now_ns: int) -> None:
        """Read, stamp and settle every complete delivery; top the credit up."""
        link, buf, buf_size, view = self.link, self.buf, self.buf_size, self.view
        current, partial, recv, advance = (
            engine.link_current,
            engine.delivery_partial,
            engine.link_recv,
            engine.link_advance,
        )
        update, settle, remote_settled = (
            engine.delivery_update,
            engine.delivery_settle,
            engine.delivery_settled,
        )
        accepted, unpack = engine.ACCEPTED, _STAMP.unpack_from
        latencies, total, warmup = self.latencies, self.total, self.warmup
        size_seen, offset, marker = self.layout
        received = self.received
        delivery = current(link)
        while delivery and not partial(delivery):
            got = recv(link, buf, buf_size)
            if got == buf_size:  # bigger than expected: drop the rest, keep the stamp
                while recv(link, _in_buf, _IO_SIZE) > 0:
                    pass
            advance(link)
            if received >= total:  # not ours to count: hand it back
                update(delivery, engine.RELEASED)
                settle(delivery)
                delivery = current(link)
                continue
            if not remote_settled(delivery):
                update(delivery, accepted)
            settle(delivery)
            received += 1
            if received > warmup:
                if got != size_seen or view[marker] != 0x75:
                    data = bytes(view[: max(got, 0)])
                    found = stamp_offset(data)
                    if found is None:
                        self.unstamped += 1
                        delivery = current(link)
                        continue
                    size_seen, offset, marker = got, found, data.find(_DATA_SECTION) + 2
                    self.layout = (size_seen, offset, marker)
                latencies.append(now_ns - unpack(view, offset)[0])
            elif received == warmup:
                self.measure_from_ns = now_ns
            if received == 1 and not warmup and not self.measure_from_ns:
                self.measure_from_ns = now_ns
            if received == total:
                self.end_ns = now_ns
            delivery = current(link)
        self.received = received
        credit = engine.link_credit(link)
        if credit <= self.window // 2 and received < total:
            engine.link_flow(link, self.window - credit)

    def report(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "unstamped": self.unstamped,
            "latencies": self.latencies.tobytes()
            if isinstance(self.latencies, array.array)
            else b"",
            "from_ns": self.measure_from_ns,
            "to_ns": self.end_ns,
        }


# --------------------------------------------------------------------------- client processes


class _Flags(NamedTuple):
    """Shared between the client's processes: each role's `ready`, and `go` and `abort`."""

    ready: Any
    go: Any
    abort: Any


class _Aborted(Exception):
    """The other role failed: stop without a report of our own."""


def _run_role(
    role: str,
    host: str,
    port: int,
    address: str,
    options: dict[str, Any],
    flags: _Flags,
    results: Any,
) -> None:
    """One process: every connection of one role, in one selector loop."""
    try:
        results.send(_drive(role, host, port, address, options, flags))
    except _Aborted:
        results.send({"aborted": True})
    except PerfError as exc:
        results.send({"error": str(exc)})
    except Exception as exc:  # reported to the parent rather than lost with the process
        results.send({"error": f"{role}: {type(exc).__name__}: {exc}"})
    finally:
        results.close()


def _drive(
    role: str,
    host: str,
    port: int,
    address: str,
    options: dict[str, Any],
    flags: _Flags,
) -> dict[str, Any]:
    ready, go, abort = flags
    producing = role == "producer"
    per_pair = dict(options)
    if options["rate"]:
        per_pair["rate"] = options["rate"] / options["pairs"]
    maker = _Producer if producing else _Consumer
    workers: list[Any] = []
    selector = selectors.DefaultSelector()
    for index in range(options["pairs"]):
        worker = maker(Wire(_connect(host, port, options), server=False), address, index, per_pair)
        workers.append(worker)
        selector.register(worker.wire.sock, _READ, worker)
    deadline = time.monotonic() + options["timeout"]
    going = False

    def step(timeout: float) -> float:
        """Read what is ready, settle or consume, send; returns the next select timeout."""
        for key, _mask in selector.select(timeout):
            key.data.wire.read()
        now = time.monotonic_ns()
        wait = 1.0
        for worker in workers:
            wire = worker.wire
            worker.check()
            if producing:
                worker.settle()
                if going and not wire.want_write:
                    pause = worker.pump(now)
                    if pause is not None:
                        wait = min(wait, pause)
            elif going:  # in pairs mode nothing comes before; in receive mode no credit
                worker.consume(now)
            was = wire.want_write
            wire.write()
            if wire.want_write != was:
                selector.modify(wire.sock, _READ | _WRITE if wire.want_write else _READ, worker)
        return wait

    while not all(worker.attached for worker in workers):
        step(0.05)
        if time.monotonic() > deadline:
            raise PerfError(f"{role}: links not attached within {options['timeout']} s")
    ready.set()
    while not go.wait(0.02):
        step(0)
        if abort.is_set():
            raise _Aborted
    going = True
    started = time.monotonic_ns()
    if not producing:
        for worker in workers:
            worker.begin(started)
    timeout = 0.0
    last_tick = 0.0
    while not all(worker.done for worker in workers):
        timeout = step(timeout)
        clock = time.monotonic()
        if clock > deadline:
            done = sum(w.sent if producing else w.received for w in workers)
            raise PerfError(
                f"{role}: timed out after {options['timeout']} s with {done} messages "
                f"{'sent' if producing else 'received'}"
            )
        if clock - last_tick > 0.2:
            last_tick = clock
            if abort.is_set():
                raise _Aborted
            for worker in workers:  # heartbeats, should the peer want them
                worker.wire.engine.tick(int(clock * 1000))
    for worker in workers:
        if not worker.measure_from_ns:  # no warm-up and nothing before the first message
            worker.measure_from_ns = started
        engine.close_connection(worker.wire.connection)
    _close_gracefully(selector, workers)
    report = [worker.report() for worker in workers]
    for worker in workers:
        worker.wire.close()
    return {"role": role, "workers": report}


def _close_gracefully(selector: selectors.BaseSelector, workers: list[Any]) -> None:
    """Write what is left, then wait (at most _CLOSE_WAIT s) for each peer's close.

    Closing the socket at once loses data: with the peer's frames unread, close() resets
    the connection and the kernel drops what it had not sent yet, so pre-settled messages
    of `--mode send` were counted sent and never arrived (hundreds of 4 KiB ones). The
    peer's close comes after it has processed every frame we sent before ours. `eof` is
    no guide here: proton ends its output as soon as our close is written.
    """
    deadline = time.monotonic() + _CLOSE_WAIT
    closing = list(workers)
    while closing:
        for worker in closing:
            wire = worker.wire
            was = wire.want_write
            wire.write()
            if wire.want_write != was:
                selector.modify(wire.sock, _READ | _WRITE if wire.want_write else _READ, worker)
        closing = [w for w in closing if w.wire.want_write or not _peer_closed(w.wire)]
        if not closing or time.monotonic() > deadline:
            return
        for key, _mask in selector.select(0.05):
            key.data.wire.read()


def _peer_closed(wire: Wire) -> bool:
    """The peer sent its close, or its input can bring nothing more (end of stream, error)."""
    return bool(
        engine.connection_state(wire.connection) & engine.REMOTE_CLOSED
        or engine.transport_capacity(wire.transport) < 0
    )


_ROLES = {"pairs": ("consumer", "producer"), "send": ("producer",), "receive": ("consumer",)}


def mode_conflict(options: dict[str, Any]) -> str | None:
    """Why these options cannot go together, or None.

    --rate and --durable shape what is sent: with `--mode receive` nothing is, and silently
    ignoring them would label a receive rate with settings it never had.
    """
    mode = options["mode"]
    if mode not in _ROLES:
        return f"--mode {mode!r}: expected one of {', '.join(_ROLES)}"
    if mode == "receive":
        for name, key in (("--rate", "rate"), ("--durable", "durable")):
            if options[key]:
                return f"{name} applies to sending; --mode receive sends nothing (drop {name})"
    return None


def run_client(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """Run the producer and/or consumer processes against `url`; the summary as a dict."""
    options = {"mode": "pairs", **options}
    conflict = mode_conflict(options)
    if conflict:
        raise PerfError(conflict)
    host, port, address = parse_url(url)
    options["tls"] = url.startswith("amqps:")
    make_message(options["size"], durable=options["durable"])  # fail early on a bad size
    ctx = multiprocessing.get_context("fork")
    go, abort = ctx.Event(), ctx.Event()
    roles = []
    for role in _ROLES[options["mode"]]:  # consumers first: attached before anything is sent
        ready = ctx.Event()
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_run_role,
            args=(role, host, port, address, options, _Flags(ready, go, abort), sender),
            name=f"scow-perf-{role}",
            daemon=True,
        )
        proc.start()
        sender.close()
        roles.append((proc, ready, receiver))
        deadline = time.monotonic() + options["timeout"]
        while not ready.wait(0.02):
            if not proc.is_alive() or receiver.poll() or time.monotonic() > deadline:
                break
        if not ready.is_set():
            break  # in pairs mode no producer without its consumers: it would fill the queue
    go.set()
    errors: list[str] = []
    reports: dict[str, dict[str, Any]] = {}
    waiting = {receiver: proc for proc, _ready, receiver in roles}
    deadline = time.monotonic() + options["timeout"] + 30
    while waiting:
        answered = wait_for_any(list(waiting), max(0.0, deadline - time.monotonic()))
        if not answered:
            errors += [f"{proc.name} did not report in time" for proc in waiting.values()]
            break
        for pipe in answered:
            receiver = cast(Connection, pipe)
            proc = waiting.pop(receiver)
            report: dict[str, Any] | None
            try:
                report = receiver.recv()
            except EOFError:
                report = None
            if report is None:
                errors.append(f"{proc.name} exited without a report (exit code {proc.exitcode})")
            elif "error" in report:
                errors.append(report["error"])
            elif "role" in report:
                reports[report["role"]] = report
            if report is None or "error" in report:
                abort.set()  # the other side would otherwise wait for its timeout
    for proc, _ready, _receiver in roles:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if errors:
        raise PerfError("; ".join(dict.fromkeys(errors)))
    return summarize(
        reports.get("producer", {}).get("workers", []),
        reports.get("consumer", {}).get("workers", []),
        options,
    )


def parse_url(url: str) -> tuple[str, int, str]:
    """`amqp://HOST:PORT/ADDRESS` (or amqps://, TLS) as (host, port, address)."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise PerfError(f"--url {url!r}: scheme must be amqp or amqps (amqp://HOST:PORT/ADDRESS)")
    address = parts.path.lstrip("/")
    if not address:
        raise PerfError(f"--url {url!r}: no address; expected amqp://HOST:PORT/ADDRESS")
    try:
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError as exc:
        raise PerfError(f"--url {url!r}: {exc}") from exc
    return parts.hostname or "localhost", port, address
