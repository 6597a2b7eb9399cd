"""`scow perf sink`: a trivial AMQP 1.0 peer that accepts and settles every message and
fills the credit of links the client receives on with freshly stamped ones."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from collections import deque
from typing import Any

from scow.protocols.amqp import engine
from scow.protocols.amqp.perf.messages import _STAMP, make_message
from scow.protocols.amqp.perf.wire import _IO_SIZE, _READ, _SEND_BATCH, _TAG, _WRITE, Wire


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
