"""`scow perf client` and `scow perf sink`: an AMQP 1.0 load generator and a trivial peer.

Both drive the engine facade over non-blocking sockets with `selectors`. The client runs
its producers and its consumers in two processes so that it can use two cores; each
producer sends one pre-encoded message whose first 8 body bytes it overwrites with the
send time (CLOCK_MONOTONIC, shared by the processes of one machine), and each consumer
reads that stamp back for the end-to-end latency.
"""

from __future__ import annotations

import argparse
import array
import json
import math
import multiprocessing
import os
import selectors
import signal
import socket
import struct
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from scow.protocols.amqp import engine
from scow.protocols.amqp.codec import encode_message

_STAMP = struct.Struct("<q")
_TAG = struct.Struct("<Q")
_DATA_SECTION = b"\x00Su"  # described type 0x75: an AMQP data section
_IO_SIZE = 1 << 18
_MAX_FRAME = 1 << 17
_PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p99.9", 0.999))
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_SEND_BATCH = 2000  # messages handed to proton between two socket writes


class PerfError(Exception):
    """A run that cannot start or cannot finish; the message says why."""


# --------------------------------------------------------------------------- messages


def make_message(size: int, *, durable: bool) -> tuple[bytes, int]:
    """The encoded message with a `size`-byte data body, and the offset of its stamp."""
    if size < _STAMP.size:
        raise PerfError(f"--size {size}: a body needs at least {_STAMP.size} bytes for its stamp")
    body = bytes(range(1, 256)) * (size // 255 + 1)  # no zero bytes: no false section match
    data = encode_message(body[:size], durable=durable)
    offset = stamp_offset(data)
    if offset is None:
        raise PerfError("encoded message has no data section")
    return data, offset


def stamp_offset(data: bytes) -> int | None:
    """Where the first body byte of the data section is, or None without one."""
    at = data.find(_DATA_SECTION)
    if at < 0 or at + 4 > len(data):
        return None
    constructor = data[at + 3]
    if constructor == 0xA0:  # vbin8
        start = at + 5
    elif constructor == 0xB0:  # vbin32
        start = at + 8
    else:
        return None
    return start if start + _STAMP.size <= len(data) else None


def percentiles(latencies_ns: array.array[int]) -> dict[str, float]:
    """p50/p90/p99/p99.9/max of nanosecond latencies, in milliseconds."""
    if not latencies_ns:
        return {name: math.nan for name, _ in _PERCENTILES} | {"max": math.nan}
    ordered = sorted(latencies_ns)
    n = len(ordered)
    out = {name: ordered[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1e6 for name, q in _PERCENTILES}
    out["max"] = ordered[-1] / 1e6
    return out


# --------------------------------------------------------------------------- socket pump


_in_buf, _in_view = engine.new_buffer(_IO_SIZE)
_out_buf, _out_view = engine.new_buffer(_IO_SIZE)


class Wire:
    """One non-blocking socket and its proton engine: moves bytes between them."""

    __slots__ = ("collector", "connection", "eof", "engine", "sock", "transport", "want_write")

    def __init__(self, sock: socket.socket, *, server: bool) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.engine = engine.Engine(max_frame=_MAX_FRAME, idle_timeout_ms=0, server=server)
        self.transport = self.engine.transport
        self.connection = self.engine.connection
        self.collector = self.engine.collector
        self.eof = False
        self.want_write = False

    def read(self) -> None:
        """Feed proton everything the socket has; marks `eof` when the peer is gone."""
        transport, recv_into, push = self.transport, self.sock.recv_into, engine.transport_push
        while True:
            room = engine.transport_capacity(transport)
            if room < 0:
                self.eof = True
                return
            try:
                got = recv_into(_in_view, min(room, _IO_SIZE) or _IO_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                got = 0
            if not got:
                self.eof = True
                self.engine.close_input()
                return
            if push(transport, _in_buf, got) < 0:
                self.eof = True
                return
            if got < _IO_SIZE:
                return

    def write(self) -> bool:
        """Send what proton has for the socket; False while some is still waiting."""
        transport, send = self.transport, self.sock.send
        while True:
            pending = engine.transport_pending(transport)
            if pending <= 0:
                if pending < 0:
                    self.eof = True
                self.want_write = False
                return True
            got = engine.transport_peek(transport, _out_buf, min(pending, _IO_SIZE))
            if got <= 0:
                self.want_write = False
                return True
            try:
                sent = send(_out_view[:got])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.eof = True
                return True
            if sent:
                engine.transport_pop(transport, sent)
            if sent < got:
                self.want_write = True
                return False

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            self.engine.free()


def _connect(host: str, port: int) -> socket.socket:
    try:
        return socket.create_connection((host, port), timeout=10)
    except OSError as exc:
        raise PerfError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc


def _check_remote(wire: Wire, kind: int, event: Any, what: str) -> None:
    """Raise for the events that end a client connection early."""
    if kind == engine.CONNECTION_REMOTE_CLOSE:
        name, text = engine.remote_connection_condition(wire.connection)
        raise PerfError(f"{what}: the peer closed the connection ({name}: {text})")
    if kind in (engine.LINK_REMOTE_CLOSE, engine.LINK_REMOTE_DETACH):
        raise PerfError(f"{what}: the peer detached the link")
    if kind == engine.TRANSPORT_ERROR:
        name, text = wire.engine.transport_condition()
        raise PerfError(f"{what}: transport error ({name}: {text})")


# --------------------------------------------------------------------------- client roles


class _Producer:
    """Sends `total` messages on one link, paced at `rate` msg/s when given."""

    def __init__(self, wire: Wire, address: str, index: int, options: dict[str, Any]) -> None:
        self.wire = wire
        self.total = options["count"] + options["warmup"]
        self.warmup = options["warmup"]
        self.presettled = options["presettled"]
        self.rate = options["rate"]
        self.max_pending = options["max_pending"] or self.total
        message, self.offset = make_message(options["size"], durable=options["durable"])
        self.size = len(message)
        self.msg_buf, self.msg_view = engine.new_buffer(self.size)
        self.msg_view[:] = message
        self.tag, self.tag_view = engine.new_tag()
        engine.client_open(wire.connection, f"scow-perf-producer-{os.getpid()}-{index}")
        session = engine.new_session(wire.connection)
        self.link = engine.new_sender(
            session, f"perf-producer-{index}", address, presettled=self.presettled
        )
        self.attached = False
        self.sent = 0
        self.settled = 0
        self.outcomes: dict[str, int] = {"accepted": 0, "rejected": 0, "released": 0, "other": 0}
        self.start_ns = 0
        self.measure_from_ns = 0
        self.end_ns = 0

    @property
    def done(self) -> bool:
        if self.sent < self.total:
            return False
        return self.presettled or self.settled >= self.total

    def on_events(self) -> None:
        collector = self.wire.collector
        peek, pop, etype = engine.collector_peek, engine.collector_pop, engine.event_type
        event_delivery, remote_state = engine.event_delivery, engine.delivery_remote_state
        settle, remote_settled = engine.delivery_settle, engine.delivery_settled
        accepted = 0
        event = peek(collector)
        while event:
            kind = etype(event)
            if kind == engine.DELIVERY:
                delivery = event_delivery(event)
                state = remote_state(delivery)
                if state == engine.ACCEPTED:
                    accepted += 1
                    settle(delivery)
                elif state or remote_settled(delivery):
                    self._outcome(state)
                    settle(delivery)
            elif kind == engine.LINK_REMOTE_OPEN:
                self.attached = True
            else:
                _check_remote(self.wire, kind, event, "producer")
            pop(collector)
            event = peek(collector)
        if accepted:
            self.outcomes["accepted"] += accepted
            self.settled += accepted
            if self.settled >= self.total and not self.presettled:
                self.end_ns = time.monotonic_ns()

    def _outcome(self, state: int) -> None:
        name = {engine.REJECTED: "rejected", engine.RELEASED: "released"}.get(state, "other")
        self.outcomes[name] += 1
        self.settled += 1
        if self.settled >= self.total:
            self.end_ns = time.monotonic_ns()

    def pump(self, now_ns: int) -> float | None:
        """Hand proton the messages credit, pacing and the pending cap allow.

        Returns how long to wait (s) before the next is due under pacing, else None.
        """
        if not self.attached or self.sent >= self.total:
            return None
        if not self.start_ns:
            self.start_ns = now_ns
            if not self.warmup:
                self.measure_from_ns = now_ns
        room = min(
            engine.link_credit(self.link),
            self.total - self.sent,
            self.max_pending - (self.sent - self.settled),
            _SEND_BATCH,
        )
        wait = None
        if self.rate:
            due = int((now_ns - self.start_ns) * self.rate / 1e9) + 1 - self.sent
            if due < room:
                room = max(due, 0)
                wait = (self.sent + 1) / self.rate - (now_ns - self.start_ns) / 1e9
        if room <= 0:
            return wait
        link, tag, tag_view, msg_buf, msg_view = (
            self.link,
            self.tag,
            self.tag_view,
            self.msg_buf,
            self.msg_view,
        )
        size, offset, presettled = self.size, self.offset, self.presettled
        new_delivery, link_send, advance = engine.new_delivery, engine.link_send, engine.link_advance
        settle, pack_tag, pack_stamp = engine.delivery_settle, _TAG.pack_into, _STAMP.pack_into
        clock = time.monotonic_ns
        sent = self.sent
        warmup = self.warmup
        for _ in range(room):
            sent += 1
            pack_tag(tag_view, 0, sent)
            stamp = clock()
            pack_stamp(msg_view, offset, stamp)
            delivery = new_delivery(link, tag)
            link_send(link, msg_buf, size)
            advance(link)
            if presettled:
                settle(delivery)
            if sent == warmup:
                self.measure_from_ns = stamp
        self.sent = sent
        if presettled and sent >= self.total:
            self.end_ns = clock()
        return wait

    def report(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "outcomes": self.outcomes,
            "from_ns": self.measure_from_ns,
            "to_ns": self.end_ns,
        }


class _Consumer:
    """Receives `total` messages on one link, accepting each unless pre-settled."""

    def __init__(self, wire: Wire, address: str, index: int, options: dict[str, Any]) -> None:
        self.wire = wire
        self.total = options["count"] + options["warmup"]
        self.warmup = options["warmup"]
        self.window = options["credit"]
        engine.client_open(wire.connection, f"scow-perf-consumer-{os.getpid()}-{index}")
        session = engine.new_session(wire.connection)
        self.link = engine.new_receiver(session, f"perf-consumer-{index}", address, self.window)
        self.attached = False
        self.received = 0
        self.unreadable = 0
        self.latencies: array.array[int] = array.array("q")
        self.recv_buf, self.recv_view = engine.new_buffer(_IO_SIZE)
        self.recv_size = _IO_SIZE
        self.offset = -1
        self.measure_from_ns = 0
        self.end_ns = 0

    @property
    def done(self) -> bool:
        return self.received >= self.total

    def on_events(self, now_ns: int) -> None:
        collector, link = self.wire.collector, self.link
        peek, pop, etype = engine.collector_peek, engine.collector_pop, engine.event_type
        event_delivery, partial = engine.event_delivery, engine.delivery_partial
        readable, pending = engine.delivery_readable, engine.delivery_pending
        recv, advance = engine.link_recv, engine.link_advance
        update, settle, remote_settled = (
            engine.delivery_update,
            engine.delivery_settle,
            engine.delivery_settled,
        )
        accepted, unpack = engine.ACCEPTED, _STAMP.unpack_from
        latencies, total, warmup = self.latencies, self.total, self.warmup
        received = self.received
        event = peek(collector)
        while event:
            kind = etype(event)
            if kind == engine.DELIVERY:
                delivery = event_delivery(event)
                if readable(delivery) and not partial(delivery) and received < total:
                    size = pending(delivery)
                    if size > self.recv_size:
                        self.recv_buf, self.recv_view = engine.new_buffer(size)
                        self.recv_size = size
                    got = recv(link, self.recv_buf, self.recv_size)
                    advance(link)
                    if not remote_settled(delivery):
                        update(delivery, accepted)
                    settle(delivery)
                    received += 1
                    if received > warmup:
                        stamp = self._stamp(got)
                        if stamp is not None:
                            latencies.append(now_ns - stamp)
                    elif received == warmup:
                        self.measure_from_ns = now_ns
                    if received == 1 and not warmup and not self.measure_from_ns:
                        self.measure_from_ns = now_ns
                    if received == total:
                        self.end_ns = now_ns
            elif kind == engine.LINK_REMOTE_OPEN:
                self.attached = True
            else:
                _check_remote(self.wire, kind, event, "consumer")
            pop(collector)
            event = peek(collector)
        self.received = received
        credit = engine.link_credit(link)
        if credit <= self.window // 2 and received < total:
            engine.link_flow(link, self.window - credit)

    def _stamp(self, got: int) -> int | None:
        view, offset = self.recv_view, self.offset
        # the layout rarely changes between messages: check the cached offset first
        if 0 < offset <= got - 8 and view[offset - 5 : offset - 2] == _DATA_SECTION:
            return int(_STAMP.unpack_from(view, offset)[0])
        found = stamp_offset(bytes(view[:got]))
        if found is None:
            self.unreadable += 1
            return None
        self.offset = found
        return int(_STAMP.unpack_from(view, found)[0])

    def report(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "unreadable": self.unreadable,
            "latencies": self.latencies.tobytes(),
            "from_ns": self.measure_from_ns,
            "to_ns": self.end_ns,
        }


# --------------------------------------------------------------------------- client processes


def _run_role(
    role: str,
    host: str,
    port: int,
    address: str,
    options: dict[str, Any],
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """One process: all of a role's connections, one selector loop."""
    try:
        results.send(_drive(role, host, port, address, options, ready, go))
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
    ready: Any,
    go: Any,
) -> dict[str, Any]:
    pairs = options["pairs"]
    per_pair = dict(options)
    if options["rate"]:
        per_pair["rate"] = options["rate"] / pairs
    workers: list[Any] = []
    for index in range(pairs):
        wire = Wire(_connect(host, port), server=False)
        maker = _Producer if role == "producer" else _Consumer
        workers.append(maker(wire, address, index, per_pair))
    selector = selectors.DefaultSelector()
    for worker in workers:
        selector.register(worker.wire.sock, _READ, worker)
    deadline = time.monotonic() + options["timeout"]
    producing = role == "producer"

    def step(timeout: float | None) -> float | None:
        """One pass: read what is ready, handle events, send; returns the next timeout."""
        for key, _mask in selector.select(timeout):
            key.data.wire.read()
        now = time.monotonic_ns()
        wait: float | None = None
        for worker in workers:
            wire = worker.wire
            if producing:
                worker.on_events()
                if not wire.want_write:
                    pause = worker.pump(now) if go.is_set() else None
                    if pause is not None:
                        wait = pause if wait is None else min(wait, pause)
            else:
                worker.on_events(now)
            was = wire.want_write
            wire.write()
            if wire.want_write != was:
                selector.modify(wire.sock, _READ | _WRITE if wire.want_write else _READ, worker)
            if wire.eof and not worker.done:
                raise PerfError(f"{role}: the peer closed the connection")
        return wait

    # attach every link before the run starts
    while not all(worker.attached for worker in workers):
        step(0.05)
        if time.monotonic() > deadline:
            raise PerfError(f"{role}: links not attached within {options['timeout']} s")
    ready.set()
    while not go.wait(0.05):
        step(0)
    started = time.monotonic_ns()
    for worker in workers:
        if not producing and not worker.warmup and not worker.measure_from_ns:
            worker.measure_from_ns = started
    timeout: float | None = 0.0
    last_tick = 0.0
    while not all(worker.done for worker in workers):
        busy = producing and any(
            w.attached and not w.wire.want_write and w.sent < w.total and w.rate == 0
            for w in workers
        )
        wait = step(0 if busy else timeout)
        timeout = min(wait, 1.0) if wait is not None else 1.0
        clock = time.monotonic()
        if clock > deadline:
            done = sum(w.sent if producing else w.received for w in workers)
            raise PerfError(
                f"{role}: timed out after {options['timeout']} s with {done} messages "
                f"{'sent' if producing else 'received'}"
            )
        if clock - last_tick > 1.0:
            last_tick = clock
            for worker in workers:
                worker.wire.engine.tick(int(clock * 1000))
    report = [worker.report() for worker in workers]
    for worker in workers:
        engine.close_connection(worker.wire.connection)
        worker.wire.write()
        worker.wire.close()
    return {"role": role, "workers": report}


def run_client(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """Run producers and consumers against `url`; the summary as a dict."""
    host, port, address = parse_url(url)
    make_message(options["size"], durable=options["durable"])  # fail early on a bad size
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = []
    pipes = []
    for role in ("consumer", "producer"):
        ready = ctx.Event()
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_run_role,
            args=(role, host, port, address, options, ready, go, sender),
            name=f"scow-perf-{role}",
            daemon=True,
        )
        proc.start()
        sender.close()
        procs.append((proc, ready))
        pipes.append(receiver)
    errors: list[str] = []
    deadline = time.monotonic() + options["timeout"]
    for (proc, ready), pipe in zip(procs, pipes, strict=True):
        while not ready.wait(0.05):
            if not proc.is_alive() or pipe.poll() or time.monotonic() > deadline:
                break
    if all(ready.is_set() for _, ready in procs):
        go.set()
    else:
        go.set()  # let the ready one stop too
    reports: dict[str, dict[str, Any]] = {}
    for (proc, _ready), pipe in zip(procs, pipes, strict=True):
        try:
            report = pipe.recv() if pipe.poll(options["timeout"] + 30) else None
        except EOFError:
            report = None
        proc.join(5)
        if proc.is_alive():
            proc.kill()
        if report is None:
            errors.append(f"{proc.name} exited without a report (exit code {proc.exitcode})")
        elif "error" in report:
            errors.append(report["error"])
        else:
            reports[report["role"]] = report
    if errors:
        # one side failing usually stops the other with a less useful message: keep the first
        raise PerfError("; ".join(dict.fromkeys(errors)))
    return summarize(reports["producer"]["workers"], reports["consumer"]["workers"], options)


def summarize(
    producers: list[dict[str, Any]], consumers: list[dict[str, Any]], options: dict[str, Any]
) -> dict[str, Any]:
    count = options["count"] * options["pairs"]
    outcomes: dict[str, int] = {}
    for p in producers:
        for name, n in p["outcomes"].items():
            outcomes[name] = outcomes.get(name, 0) + n
    latencies: array.array[int] = array.array("q")
    for c in consumers:
        latencies.frombytes(c["latencies"])

    def rate(reports: list[dict[str, Any]]) -> float:
        start = min(r["from_ns"] for r in reports)
        end = max(r["to_ns"] for r in reports)
        return count / ((end - start) / 1e9) if end > start else math.nan

    send_rate = rate(producers)
    receive_rate = rate(consumers)
    return {
        "pairs": options["pairs"],
        "size": options["size"],
        "durable": options["durable"],
        "presettled": options["presettled"],
        "rate_target": options["rate"] or None,
        "count": count,
        "warmup": options["warmup"] * options["pairs"],
        "sent": sum(p["sent"] for p in producers),
        "outcomes": outcomes,
        "received": sum(c["received"] for c in consumers),
        "unstamped": sum(c["unreadable"] for c in consumers),
        "send_rate": round(send_rate, 1),
        "receive_rate": round(receive_rate, 1),
        "elapsed_s": round(
            (max(c["to_ns"] for c in consumers) - min(p["from_ns"] for p in producers)) / 1e9, 3
        ),
        "latency_ms": {k: round(v, 3) for k, v in percentiles(latencies).items()},
    }


def format_summary(result: dict[str, Any]) -> str:
    mode = "pre-settled" if result["presettled"] else "at-least-once"
    if result["durable"]:
        mode += ", durable"
    pace = f", paced at {result['rate_target']:.0f} msg/s" if result["rate_target"] else ""
    lat = result["latency_ms"]
    outcomes = "  ".join(f"{k} {v}" for k, v in result["outcomes"].items() if v)
    lines = [
        f"scow perf client: {result['pairs']} pair(s), {result['size']} B bodies, {mode}{pace}",
        f"  messages      {result['count']} measured (+{result['warmup']} warm-up)",
        f"  sent          {result['sent']}   outcomes: {outcomes or 'none (pre-settled)'}",
        f"  received      {result['received']}",
        f"  send rate     {result['send_rate']:>10.0f} msg/s",
        f"  receive rate  {result['receive_rate']:>10.0f} msg/s",
        "  latency (ms)  "
        + "  ".join(f"{name} {lat[name]:.3f}" for name in ("p50", "p90", "p99", "p99.9", "max")),
        f"  elapsed       {result['elapsed_s']:.3f} s",
    ]
    if result["unstamped"]:
        lines.append(f"  unstamped     {result['unstamped']} messages had no readable send time")
    return "\n".join(lines)


def parse_url(url: str) -> tuple[str, int, str]:
    """`amqp://HOST:PORT/ADDRESS` as (host, port, address)."""
    parts = urlsplit(url)
    if parts.scheme != "amqp":
        raise PerfError(f"--url {url!r}: scheme must be amqp (amqp://HOST:PORT/ADDRESS)")
    address = parts.path.lstrip("/")
    if not address:
        raise PerfError(f"--url {url!r}: no address; expected amqp://HOST:PORT/ADDRESS")
    try:
        port = parts.port or 5672
    except ValueError as exc:
        raise PerfError(f"--url {url!r}: {exc}") from exc
    return parts.hostname or "localhost", port, address


# --------------------------------------------------------------------------- sink


class _SinkConnection:
    """A server end that accepts every message and feeds receiving links generated ones."""

    def __init__(self, sock: socket.socket, sink: Sink) -> None:
        self.wire = Wire(sock, server=True)
        self.sink = sink
        self.senders: dict[Any, bool] = {}  # link -> pre-settled
        self.tag, self.tag_view = engine.new_tag()
        self.tag_count = 0

    def on_events(self) -> None:
        wire, sink = self.wire, self.sink
        collector = wire.collector
        peek, pop, etype = engine.collector_peek, engine.collector_pop, engine.event_type
        event_delivery, delivery_link = engine.event_delivery, engine.delivery_link
        is_sender, partial, readable = (
            engine.link_is_sender,
            engine.delivery_partial,
            engine.delivery_readable,
        )
        recv, advance, update, settle = (
            engine.link_recv,
            engine.link_advance,
            engine.delivery_update,
            engine.delivery_settle,
        )
        remote_state, remote_settled = engine.delivery_remote_state, engine.delivery_settled
        buf, size = sink.recv_buf, sink.recv_size
        receivers = set()
        event = peek(collector)
        while event:
            kind = etype(event)
            if kind == engine.DELIVERY:
                delivery = event_delivery(event)
                link = delivery_link(delivery)
                if is_sender(link):
                    if remote_state(delivery) or remote_settled(delivery):
                        settle(delivery)
                        sink.settled += 1
                elif readable(delivery) and not partial(delivery):
                    while recv(link, buf, size) == size:  # drain a message bigger than buf
                        pass
                    advance(link)
                    if not remote_settled(delivery):
                        update(delivery, engine.ACCEPTED)
                    settle(delivery)
                    sink.received += 1
                    receivers.add(link)
            elif kind != engine.LINK_FLOW:
                self._on_event(kind, event)
            pop(collector)
            event = peek(collector)
        for link in receivers:
            credit = engine.link_credit(link)
            if credit <= sink.credit // 2:
                engine.link_flow(link, sink.credit - credit)

    def _on_event(self, kind: int, event: Any) -> None:
        connection = self.wire.connection
        if kind == engine.CONNECTION_REMOTE_OPEN:
            engine.open_connection(connection, "scow-perf-sink", {"product": "scow perf sink"})
        elif kind == engine.CONNECTION_REMOTE_CLOSE:
            engine.close_connection(connection)
        elif kind == engine.SESSION_REMOTE_OPEN:
            engine.open_session(engine.event_session(event))
        elif kind == engine.SESSION_REMOTE_CLOSE:
            engine.close_session(engine.event_session(event))
        elif kind == engine.LINK_REMOTE_OPEN:
            link = engine.event_link(event)
            source = engine.remote_source(link)
            target = engine.remote_target(link)
            engine.open_link(link, address=source.address if engine.link_is_sender(link) else target.address)
            if engine.link_is_sender(link):
                presettled = engine.link_remote_snd_settle_mode(link) == engine.SND_SETTLED
                if presettled:
                    engine.set_sender_settle_mode_settled(link)
                self.senders[link] = presettled
            else:
                engine.link_flow(link, self.sink.credit)
        elif kind in (engine.LINK_REMOTE_CLOSE, engine.LINK_REMOTE_DETACH):
            link = engine.event_link(event)
            self.senders.pop(link, None)
            if kind == engine.LINK_REMOTE_CLOSE:
                engine.close_link(link)
            else:
                engine.detach_link(link)

    def generate(self) -> None:
        """Fill the credit of every receiving link with freshly stamped messages."""
        sink = self.sink
        if not sink.generate or not self.senders:
            return
        msg_buf, msg_view, offset, size = sink.msg_buf, sink.msg_view, sink.offset, sink.msg_size
        tag, tag_view = self.tag, self.tag_view
        new_delivery, link_send, advance = engine.new_delivery, engine.link_send, engine.link_advance
        settle, pack_tag, pack_stamp = engine.delivery_settle, _TAG.pack_into, _STAMP.pack_into
        clock = time.monotonic_ns
        n = self.tag_count
        for link, presettled in self.senders.items():
            room = min(engine.link_credit(link), _SEND_BATCH)
            for _ in range(room):
                n += 1
                pack_tag(tag_view, 0, n)
                pack_stamp(msg_view, offset, clock())
                delivery = new_delivery(link, tag)
                link_send(link, msg_buf, size)
                advance(link)
                if presettled:
                    settle(delivery)
            sink.generated += room
        self.tag_count = n


class Sink:
    """`scow perf sink`: accept, read and settle everything; generate for receivers."""

    def __init__(self, *, size: int, credit: int, generate: bool) -> None:
        self.credit = credit
        self.generate = generate
        message, self.offset = make_message(size, durable=False)
        self.msg_size = len(message)
        self.msg_buf, self.msg_view = engine.new_buffer(self.msg_size)
        self.msg_view[:] = message
        self.recv_buf, _ = engine.new_buffer(_IO_SIZE)
        self.recv_size = _IO_SIZE
        self.received = 0
        self.generated = 0
        self.settled = 0
        self.stopping = False

    def serve(self, listener: socket.socket) -> None:
        listener.setblocking(False)
        selector = selectors.DefaultSelector()
        selector.register(listener, _READ, None)
        connections: list[_SinkConnection] = []
        while not self.stopping:
            busy = any(c.senders and not c.wire.want_write for c in connections)
            try:
                ready = selector.select(0 if busy else 1.0)
            except InterruptedError:
                continue
            for key, _mask in ready:
                if key.data is None:
                    self._accept(listener, selector, connections)
                else:
                    key.data.wire.read()
            for conn in list(connections):
                wire = conn.wire
                conn.on_events()
                if not wire.want_write:
                    conn.generate()
                was = wire.want_write
                wire.write()
                if wire.eof:
                    selector.unregister(wire.sock)
                    connections.remove(conn)
                    wire.close()
                elif wire.want_write != was:
                    selector.modify(wire.sock, _READ | _WRITE if wire.want_write else _READ, conn)
        for conn in connections:
            conn.wire.close()

    def _accept(
        self,
        listener: socket.socket,
        selector: selectors.BaseSelector,
        connections: list[_SinkConnection],
    ) -> None:
        while True:
            try:
                sock, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn = _SinkConnection(sock, self)
            connections.append(conn)
            selector.register(sock, _READ, conn)


def run_sink(host: str, port: int, *, size: int, credit: int, generate: bool, workers: int) -> None:
    """Listen on host:port and serve until SIGINT/SIGTERM; `workers` processes share it."""
    listener = socket.create_server((host, port), reuse_port=False, backlog=128)
    bound = listener.getsockname()
    print(f"scow perf sink listening on {bound[0]}:{bound[1]}", flush=True)
    children = []
    for _ in range(workers - 1):
        pid = os.fork()
        if pid == 0:
            _serve_until_signal(listener, size=size, credit=credit, generate=generate)
            os._exit(0)
        children.append(pid)
    try:
        _serve_until_signal(listener, size=size, credit=credit, generate=generate)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except OSError:
                pass


def _serve_until_signal(listener: socket.socket, **settings: Any) -> None:
    sink = Sink(**settings)

    def stop(_signum: int, _frame: Any) -> None:
        sink.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sink.serve(listener)


# --------------------------------------------------------------------------- command line


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:5673")
    return host or "127.0.0.1", int(port)


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return n


def cmd_client(args: argparse.Namespace) -> int:
    options = {
        "count": args.count,
        "size": args.size,
        "pairs": args.pairs,
        "durable": args.durable,
        "presettled": args.presettled,
        "rate": args.rate or 0.0,
        "warmup": args.warmup,
        "credit": args.credit,
        "max_pending": args.max_pending,
        "timeout": args.timeout,
    }
    try:
        result = run_client(args.url, options)
    except PerfError as exc:
        print(f"scow perf client: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print(format_summary(result))
    complete = result["received"] >= result["count"] + result["warmup"]
    return 0 if complete else 1


def cmd_sink(args: argparse.Namespace) -> int:
    host, port = args.listen
    try:
        run_sink(
            host,
            port,
            size=args.size,
            credit=args.credit,
            generate=not args.no_generate,
            workers=args.workers,
        )
    except OSError as exc:
        print(f"scow perf sink: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 1
    except PerfError as exc:
        print(f"scow perf sink: {exc}", file=sys.stderr)
        return 2
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from scow.core.cli import command_group

    sub = command_group(subparsers, "perf", "load generators and measurements")

    client = sub.add_parser(
        "client",
        help="producer/consumer pairs: send and receive rates and end-to-end latency",
    )
    client.add_argument("--url", required=True, help="amqp://HOST:PORT/ADDRESS")
    client.add_argument("--count", type=_positive, default=100_000, help="messages per pair")
    client.add_argument("--size", type=int, default=100, help="body bytes (at least 8)")
    client.add_argument("--pairs", type=_positive, default=1, help="producer/consumer pairs")
    client.add_argument("--durable", action="store_true", help="send durable messages")
    client.add_argument(
        "--presettled", action="store_true", help="at-most-once: send and receive pre-settled"
    )
    client.add_argument("--rate", type=float, help="total send rate (msg/s) across producers")
    client.add_argument(
        "--warmup", type=int, default=0, help="messages per pair sent first and not measured"
    )
    client.add_argument("--credit", type=_positive, default=1000, help="consumer credit window")
    client.add_argument(
        "--max-pending",
        type=int,
        default=10_000,
        help="unsettled messages a producer may have in flight (0: only credit limits)",
    )
    client.add_argument("--timeout", type=float, default=300.0, help="give up after (s)")
    client.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    client.set_defaults(handler=cmd_client)

    sink = sub.add_parser("sink", help="trivial AMQP peer: accepts all, generates for receivers")
    sink.add_argument("--listen", type=_host_port, default=("127.0.0.1", 5673), metavar="HOST:PORT")
    sink.add_argument("--size", type=int, default=100, help="body bytes of generated messages")
    sink.add_argument("--credit", type=_positive, default=1000, help="credit given to senders")
    sink.add_argument(
        "--no-generate", action="store_true", help="send nothing on links the client receives on"
    )
    sink.add_argument("--workers", type=_positive, default=1, help="processes sharing the port")
    sink.set_defaults(handler=cmd_sink)

