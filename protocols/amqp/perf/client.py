"""`scow perf client` and `scow perf sink`: an AMQP 1.0 load generator and a trivial peer.

Both drive the engine facade over non-blocking sockets with `selectors`. The client runs
its producers and its consumers in two processes so that it can use two cores; each
producer sends one pre-encoded message whose first 8 body bytes it overwrites with the
send time (CLOCK_MONOTONIC, shared by the processes of one machine), and each consumer
reads that stamp back for the end-to-end latency.

`--mode send` runs the producers alone (to fill a queue) and `--mode receive` the
consumers alone (to drain one): a backlog is then measured apart from the rate it was
built at. Latency needs both ends of one run, so those modes report none.
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
import ssl
import struct
import sys
import time
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_any
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

from scow.protocols.amqp import engine
from scow.protocols.amqp.codec import encode_message

_STAMP = struct.Struct("<q")
_TAG = struct.Struct("<Q")
#: --duplicate-ids: each message's `_AMQ_DUPL_ID`, a binary of the producer's own prefix
#: and its sequence number, written over this placeholder.
_ID = struct.Struct("<QQ")
_ID_PLACEHOLDER = b"\xa5" * _ID.size
_DATA_SECTION = b"\x00Su"  # described type 0x75: an AMQP data section
_IO_SIZE = 1 << 18
_MAX_FRAME = 1 << 17
_PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p99.9", 0.999))
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_SEND_BATCH = 2000  # messages handed to proton between two socket writes
_CLOSE_WAIT = 5.0  # seconds a finished run waits for the peer to answer its close


class PerfError(Exception):
    """A run that cannot start or cannot finish; the message says why."""


# --------------------------------------------------------------------------- messages


def make_message(
    size: int,
    *,
    durable: bool,
    duplicate_id: bool = False,
    properties: dict[str, str] | None = None,
) -> tuple[bytes, int]:
    """The encoded message with a `size`-byte data body, and the offset of its stamp;
    `duplicate_id`: with an `_AMQ_DUPL_ID` to overwrite (at `id_offset`); `properties`:
    application properties every message carries (for selectors)."""
    if size < _STAMP.size:
        raise PerfError(f"--size {size}: a body needs at least {_STAMP.size} bytes for its stamp")
    body = bytes(range(1, 256)) * (size // 255 + 1)  # no zero bytes: no false section match
    properties = dict(properties or {})
    if duplicate_id:
        properties["_AMQ_DUPL_ID"] = _ID_PLACEHOLDER
    data = encode_message(body[:size], durable=durable, application_properties=properties or None)
    offset = stamp_offset(data)
    if offset is None:
        raise PerfError("encoded message has no data section")
    return data, offset


def id_offset(data: bytes) -> int:
    """Where the `_AMQ_DUPL_ID` placeholder of a `make_message(duplicate_id=True)` is."""
    return data.index(_ID_PLACEHOLDER)


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
    out = {
        name: ordered[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1e6 for name, q in _PERCENTILES
    }
    out["max"] = ordered[-1] / 1e6
    return out


# --------------------------------------------------------------------------- socket pump


_in_buf, _in_view = engine.new_buffer(_IO_SIZE)
_out_buf, _out_view = engine.new_buffer(_IO_SIZE)


class Wire:
    """One non-blocking socket and its proton engine, without an event collector."""

    __slots__ = (
        "connection",
        "engine",
        "eof",
        "pending",
        "retry",
        "sock",
        "transport",
        "want_write",
    )

    def __init__(self, sock: socket.socket, *, server: bool) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        #: Decrypted bytes TLS holds that the selector cannot see (0 without TLS).
        self.pending = sock.pending if isinstance(sock, ssl.SSLSocket) else _nothing
        #: A TLS write that would block must be retried with the same length.
        self.retry = 0
        self.engine = engine.Engine(max_frame=_MAX_FRAME, idle_timeout_ms=0, server=server)
        engine.stop_events(self.engine)  # endpoint states and links are polled instead
        self.transport = self.engine.transport
        self.connection = self.engine.connection
        self.eof = False
        self.want_write = False

    def read(self) -> None:
        """Feed proton what the socket has; sets `eof` once either side is done."""
        transport, recv_into, push = self.transport, self.sock.recv_into, engine.transport_push
        while True:
            room = engine.transport_capacity(transport)
            if room <= 0:
                self.eof = self.eof or room < 0
                return
            try:
                got = recv_into(_in_view, min(room, _IO_SIZE))
            except _WOULD_BLOCK:
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
            if got < room and not self.pending():
                return

    def write(self) -> None:
        """Send what proton has for the socket; sets `want_write` while some is left."""
        transport, send = self.transport, self.sock.send
        while True:
            pending = engine.transport_pending(transport)
            if pending <= 0:
                self.eof = self.eof or pending < 0
                self.want_write = False
                return
            got = engine.transport_peek(transport, _out_buf, self.retry or min(pending, _IO_SIZE))
            if got <= 0:
                self.want_write = False
                return
            try:
                sent = send(_out_view[:got])
                self.retry = 0
            except _WOULD_BLOCK:
                sent = 0
                self.retry = got
            except OSError:
                self.eof = True
                self.want_write = False
                return
            if sent:
                engine.transport_pop(transport, sent)
            if sent < got:
                self.want_write = True
                return

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            self.engine.free()


_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def _nothing() -> int:
    return 0


def _connect(host: str, port: int, options: dict[str, Any]) -> socket.socket:
    """A connected socket; for amqps, with its TLS handshake done (blocking)."""
    try:
        sock = socket.create_connection((host, port), timeout=10)
        if options.get("tls"):
            context = ssl.create_default_context(cafile=options.get("ca_file") or None)
            sock = context.wrap_socket(sock, server_hostname=host)
        return sock
    except OSError as exc:
        raise PerfError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc


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


def summarize(
    producers: list[dict[str, Any]], consumers: list[dict[str, Any]], options: dict[str, Any]
) -> dict[str, Any]:
    """The run's figures from the per-connection reports of both processes.

    A side that did not run (`--mode send` or `receive`) reports no list, and its keys
    are None rather than 0: "received 0" would read as a failure to receive.
    """
    pairs = options["pairs"]
    count = options["count"] * pairs
    outcomes: dict[str, int] = {}
    for p in producers:
        for name, n in p["outcomes"].items():
            outcomes[name] = outcomes.get(name, 0) + n
    latencies: array.array[int] = array.array("q")
    for c in consumers:
        latencies.frombytes(c["latencies"])

    def rate(reports: list[dict[str, Any]]) -> float | None:
        if not reports:
            return None
        start = min(r["from_ns"] for r in reports)
        end = max(r["to_ns"] for r in reports)
        return round(count / ((end - start) / 1e9), 1) if end > start else math.nan

    def total(reports: list[dict[str, Any]], key: str) -> int | None:
        return sum(r[key] for r in reports) if reports else None

    start = min(r["from_ns"] for r in producers + consumers)
    end = max(r["to_ns"] for r in producers + consumers)
    return {
        "pairs": pairs,
        "size": options["size"],
        "durable": options["durable"],
        "presettled": options["presettled"],
        "rate_target": options["rate"] or None,
        "count": count,
        "warmup": options["warmup"] * pairs,
        "sent": total(producers, "sent"),
        "outcomes": {k: v for k, v in outcomes.items() if v} if producers else None,
        "received": total(consumers, "received"),
        "unstamped": total(consumers, "unstamped"),
        "mode": options["mode"],
        "send_rate": rate(producers),
        "receive_rate": rate(consumers),
        "elapsed_s": round((end - start) / 1e9, 3),
        # stamps from another run mean nothing: latency only when this run sent them
        "latency_ms": {k: round(v, 3) for k, v in percentiles(latencies).items()}
        if producers and consumers
        else None,
    }


def format_summary(result: dict[str, Any]) -> str:
    """The summary as the readable block `scow perf client` prints; absent figures left out."""
    mode = "pre-settled" if result["presettled"] else "at-least-once"
    if result["durable"]:
        mode += ", durable"
    pace = f", paced at {result['rate_target']:.0f} msg/s" if result["rate_target"] else ""
    who = {"pairs": "pair(s)", "send": "producer(s) only", "receive": "consumer(s) only"}
    lines = [
        f"scow perf client: {result['pairs']} {who[result['mode']]}, "
        f"{result['size']} B bodies, {mode}{pace}",
        f"  messages      {result['count']} measured, {result['warmup']} warm-up",
    ]
    if result["sent"] is not None:
        outcomes = ", ".join(f"{v} {k}" for k, v in result["outcomes"].items())
        lines.append(f"  sent          {result['sent']} ({outcomes or 'pre-settled'})")
    if result["received"] is not None:
        lines.append(f"  received      {result['received']}")
    for label, key in (("send rate", "send_rate"), ("receive rate", "receive_rate")):
        if result[key] is not None:
            lines.append(f"  {label:<12}  {result[key]:>10.0f} msg/s")
    lat = result["latency_ms"]
    if lat is not None:
        lines.append(
            "  latency (ms)  "
            + "  ".join(f"{n} {lat[n]:.3f}" for n in ("p50", "p90", "p99", "p99.9", "max"))
        )
    lines.append(f"  elapsed       {result['elapsed_s']:.3f} s")
    if result["unstamped"]:
        lines.append(f"  unstamped     {result['unstamped']} messages had no readable send time")
    return "\n".join(lines)


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


# --------------------------------------------------------------------------- sink


class _SinkConnection:
    """Server end: accepts every message; fills receiving links with generated ones."""

    def __init__(self, sock: socket.socket, sink: Sink) -> None:
        self.wire = Wire(sock, server=True)
        self.sink = sink
        self.receivers: list[Any] = []  # links the client sends on
        self.senders: dict[Any, deque[Any] | None] = {}  # link -> unsettled (None: pre-settled)
        self.tag, self.tag_view = engine.new_tag()
        self.tags = 0

    def poll(self) -> None:
        """Answer opens and closes: the engine records no events, so look at the states."""
        connection = self.wire.connection
        state = engine.connection_state(connection)
        if state & engine.LOCAL_UNINIT and state & engine.REMOTE_ACTIVE:
            engine.open_connection(connection, "scow-perf-sink", {"product": "scow perf sink"})
        elif state & engine.LOCAL_ACTIVE and state & engine.REMOTE_CLOSED:
            engine.close_connection(connection)
        new = engine.LOCAL_UNINIT | engine.REMOTE_ACTIVE
        ending = engine.LOCAL_ACTIVE | engine.REMOTE_CLOSED
        session = engine.session_head(connection, new)
        while session:
            engine.open_session(session)
            session = engine.session_next(session, new)
        link = engine.link_head(connection, new)
        while link:
            self._open(link)
            link = engine.link_next(link, new)
        link = engine.link_head(connection, ending)
        while link:
            if link in self.receivers:
                self.receivers.remove(link)
            self.senders.pop(link, None)
            engine.close_link(link)
            link = engine.link_next(link, ending)
        session = engine.session_head(connection, ending)
        while session:
            engine.close_session(session)
            session = engine.session_next(session, ending)

    def _open(self, link: Any) -> None:
        if engine.link_is_sender(link):
            engine.open_link(link, address=engine.remote_source(link).address)
            presettled = engine.link_remote_snd_settle_mode(link) == engine.SND_SETTLED
            if presettled:
                engine.set_sender_settle_mode_settled(link)
            self.senders[link] = None if presettled else deque()
        else:
            engine.open_link(link, address=engine.remote_target(link).address)
            engine.link_flow(link, self.sink.credit)
            self.receivers.append(link)

    def consume(self) -> None:
        """Read and accept every complete message; top the senders' credit up."""
        sink = self.sink
        buf, size, window = sink.recv_buf, sink.recv_size, sink.credit
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
        accepted = engine.ACCEPTED
        for link in self.receivers:
            n = 0
            delivery = current(link)
            while delivery and not partial(delivery):
                while recv(link, buf, size) == size:  # bigger than the buffer
                    pass
                advance(link)
                if not remote_settled(delivery):
                    update(delivery, accepted)
                settle(delivery)
                n += 1
                delivery = current(link)
            if n:
                sink.received += n
                credit = engine.link_credit(link)
                if credit <= window // 2:
                    engine.link_flow(link, window - credit)

    def settle(self) -> None:
        """Settle generated deliveries the client has decided on, oldest first."""
        remote_state, remote_settled = engine.delivery_remote_state, engine.delivery_settled
        settle = engine.delivery_settle
        for unsettled in self.senders.values():
            while unsettled:
                delivery = unsettled[0]
                if not remote_state(delivery) and not remote_settled(delivery):
                    break
                settle(delivery)
                unsettled.popleft()

    def generate(self) -> bool:
        """Fill receiving links' credit with freshly stamped messages; True if any is left."""
        sink = self.sink
        if not sink.generate:
            return False
        msg_buf, msg_view, offset, size = sink.msg_buf, sink.msg_view, sink.offset, sink.msg_size
        tag, tag_view = self.tag, self.tag_view
        new_delivery, link_send, advance = (
            engine.new_delivery,
            engine.link_send,
            engine.link_advance,
        )
        pack_tag, pack_stamp, clock = _TAG.pack_into, _STAMP.pack_into, time.monotonic_ns
        n = self.tags
        more = False
        for link, unsettled in self.senders.items():
            credit = engine.link_credit(link)
            room = min(credit, _SEND_BATCH)
            keep = engine.delivery_settle if unsettled is None else unsettled.append
            for _ in range(room):
                n += 1
                pack_tag(tag_view, 0, n)
                pack_stamp(msg_view, offset, clock())
                delivery = new_delivery(link, tag)
                link_send(link, msg_buf, size)
                advance(link)
                keep(delivery)
            sink.generated += room
            more = more or credit > room
        self.tags = n
        return more


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
        self.stopping = False

    def serve(self, listener: socket.socket | None, accepted: list[socket.socket]) -> None:
        """Serve `accepted` sockets and, given a listener, every new one, until stopped."""
        selector = selectors.DefaultSelector()
        if listener is not None:
            listener.setblocking(False)
            selector.register(listener, _READ, None)
        connections: list[_SinkConnection] = []
        for sock in accepted:
            self._add(sock, selector, connections)
        timeout = 1.0
        while not self.stopping and (listener is not None or connections):
            try:
                ready = selector.select(timeout)
            except InterruptedError:
                continue
            for key, _mask in ready:
                if key.data is not None:
                    key.data.wire.read()
                    continue
                while True:
                    try:
                        sock, _addr = listener.accept()  # type: ignore[union-attr]
                    except (BlockingIOError, InterruptedError):
                        break
                    self._add(sock, selector, connections)
            timeout = 1.0
            for conn in list(connections):
                wire = conn.wire
                conn.poll()
                conn.consume()
                conn.settle()
                if not wire.want_write and conn.generate():
                    timeout = 0.0
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

    def _add(
        self,
        sock: socket.socket,
        selector: selectors.BaseSelector,
        connections: list[_SinkConnection],
    ) -> None:
        conn = _SinkConnection(sock, self)
        connections.append(conn)
        selector.register(conn.wire.sock, _READ, conn)


def run_sink(host: str, port: int, *, size: int, credit: int, generate: bool, fork: bool) -> None:
    """Listen on host:port and serve until SIGINT/SIGTERM.

    With `fork`, each connection gets a process of its own (a producer's and a consumer's
    connection then use two cores); otherwise one process serves them all.
    """
    listener = socket.create_server((host, port), backlog=128)
    bound = listener.getsockname()
    print(f"scow perf sink listening on {bound[0]}:{bound[1]}", flush=True)
    sink = Sink(size=size, credit=credit, generate=generate)

    def stop(_signum: int, _frame: Any) -> None:
        sink.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not fork:
        sink.serve(listener, [])
        return
    children: set[int] = set()
    listener.settimeout(0.5)
    try:
        while not sink.stopping:
            try:
                sock, _addr = listener.accept()
            except (TimeoutError, InterruptedError):
                sock = None
            while children:  # reap the children whose connection ended
                pid, _status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                children.discard(pid)
            if sock is None:
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                code = 0
                try:
                    sink.serve(None, [sock])
                except BaseException:
                    code = 1
                os._exit(code)
            sock.close()
            children.add(pid)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except OSError:
                pass


# --------------------------------------------------------------------------- command line


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:5673")
    return host.strip("[]") or "127.0.0.1", int(port)


def _property(value: str) -> tuple[str, str]:
    name, equals, text = value.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(
            f"--property {value!r}: expected NAME=VALUE, such as color=red"
        )
    return name, text


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return n


def _non_negative(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be 0 or more")
    return n


def cmd_client(args: argparse.Namespace) -> int:
    options = {
        "count": args.count,
        "size": args.size,
        "pairs": args.pairs,
        "durable": args.durable,
        "duplicate_ids": args.duplicate_ids,
        "properties": dict(args.property),
        "presettled": args.presettled,
        "rate": args.rate or 0.0,
        "warmup": args.warmup,
        "credit": args.credit,
        "max_pending": args.max_pending,
        "timeout": args.timeout,
        "mode": args.mode,
        "ca_file": args.ca_file,
    }
    conflict = mode_conflict(options)
    if conflict:
        print(f"scow perf client: {conflict}", file=sys.stderr)
        return 2  # a usage error, as argparse exits with
    try:
        result = run_client(args.url, options)
    except PerfError as exc:
        print(f"scow perf client: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else format_summary(result))
    return 0 if completed(result) else 1


def completed(result: dict[str, Any]) -> bool:
    """Whether the run did all it set out to: every message received, or sent and accepted.

    A send-only run has no consumer to count on, so at-least-once it counts the accepted
    outcomes (a rejected message was sent but is not on the queue); pre-settled there are
    no outcomes and sending is all it can know.
    """
    expected = result["count"] + result["warmup"]
    if result["mode"] != "send":
        return bool(result["received"] >= expected)
    if result["presettled"]:
        return bool(result["sent"] >= expected)
    return bool(result["outcomes"].get("accepted", 0) >= expected)


def cmd_sink(args: argparse.Namespace) -> int:
    host, port = args.listen
    try:
        run_sink(
            host,
            port,
            size=args.size,
            credit=args.credit,
            generate=not args.no_generate,
            fork=not args.single_process,
        )
    except PerfError as exc:
        print(f"scow perf sink: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"scow perf sink: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add `scow perf client` and `scow perf sink`."""
    from scow.core.cli import command_group

    sub = command_group(subparsers, "perf", "load generators and measurements")

    client = sub.add_parser(
        "client",
        help="producer/consumer pairs: send and receive rates, end-to-end latency; "
        "or producers only (--mode send) or consumers only (--mode receive)",
    )
    client.add_argument("--url", required=True, help="amqp://HOST:PORT/ADDRESS (amqps:// for TLS)")
    client.add_argument(
        "--ca-file", help="CA certificates (PEM) to trust for amqps (default: the system's)"
    )
    client.add_argument(
        "--count",
        type=_positive,
        default=100_000,
        help="messages per pair (with --mode send or receive: per producer or consumer)",
    )
    client.add_argument("--size", type=int, default=100, help="body bytes, at least 8")
    client.add_argument(
        "--pairs",
        type=_positive,
        default=1,
        help="producer/consumer pairs (with --mode send or receive: producers or consumers)",
    )
    client.add_argument("--durable", action="store_true", help="send durable messages")
    client.add_argument(
        "--duplicate-ids",
        action="store_true",
        help="give each message an _AMQ_DUPL_ID of its own (duplicate detection's cost)",
    )
    client.add_argument(
        "--property",
        type=_property,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an application property (string) on every message sent, repeatable",
    )
    client.add_argument(
        "--presettled",
        action="store_true",
        help="at-most-once: send pre-settled (with --mode receive: ask to receive pre-settled)",
    )
    client.add_argument("--rate", type=float, help="total send rate (msg/s) over all producers")
    client.add_argument(
        "--warmup", type=_non_negative, default=0, help="messages per pair sent first, not measured"
    )
    client.add_argument("--credit", type=_positive, default=1000, help="consumer credit window")
    client.add_argument(
        "--max-pending",
        type=_non_negative,
        default=10_000,
        help="unsettled messages a producer may have in flight (0: credit alone limits)",
    )
    client.add_argument(
        "--mode",
        choices=("pairs", "send", "receive"),
        default="pairs",
        help="pairs (default); send: producers only, to fill a queue; receive: consumers "
        "only, each until it got --count (no latency: the stamps are from another run)",
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
    sink.add_argument(
        "--single-process",
        action="store_true",
        help="serve every connection in one process (default: a process per connection)",
    )
    sink.set_defaults(handler=cmd_sink)
