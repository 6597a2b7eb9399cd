"""A peer that crashes: proton's engine on a socket this program owns.

`run_raw` is the `raw` role of `python -m tests.system.clients`: it connects (plain or
TLS), attaches, and ends the connection as a crashing peer does: a TCP reset, a close
without TLS close_notify, a socket that goes away right after sending AMQP close, or a
large message cut off part way through its frames.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import struct
import time

from proton import Collector, Connection, Message, Transport

from tests.system.records import EventLog
from tests.system.topology import LANES

EXIT_DISCONNECTED = 3


class RawPeer:
    """proton's engine (a client Transport and Connection) over a socket we control."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.connection = Connection()
        self.connection.container = f"raw-{os.getpid()}"
        self.transport = Transport()
        self.transport.bind(self.connection)
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()

    def flush(self, limit: int | None = None) -> int:
        """Write what the engine has to send (at most `limit` bytes); returns bytes sent."""
        sent = 0
        while True:
            pending = self.transport.pending()
            if pending <= 0 or (limit is not None and sent >= limit):
                return sent
            size = pending if limit is None else min(pending, limit - sent)
            data = self.transport.peek(size)
            self.sock.sendall(data)
            self.transport.pop(len(data))
            sent += len(data)

    def pump(self, timeout: float) -> bool:
        """Send, then read what arrives within `timeout`; False once the peer closed."""
        self.flush()
        self.sock.settimeout(timeout)
        capacity = self.transport.capacity()
        if capacity <= 0:
            return capacity == 0  # the engine is full (0) or closed for input (< 0)
        try:
            data = self.sock.recv(min(capacity, 65536))
        except (TimeoutError, ssl.SSLWantReadError):
            return True
        if not data:
            self.transport.close_tail()
            return False
        self.transport.push(data)
        self.transport.tick(time.monotonic())
        return True

    def reset(self) -> None:
        """Close with SO_LINGER 0: the kernel sends RST, not FIN (no TLS close_notify)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def vanish(self) -> None:
        """Close the TCP socket (FIN) without TLS close_notify or waiting for anything."""
        self.sock.close()


def _raw_connect(args: argparse.Namespace) -> RawPeer:
    sock = socket.create_connection(("127.0.0.1", args.port), timeout=10)
    if args.tls_ca:
        # the TLS socket takes over the descriptor; closing it sends no close_notify
        context = ssl.create_default_context(cafile=args.tls_ca)
        sock = context.wrap_socket(sock, server_hostname="localhost")
    return RawPeer(sock)


def run_raw(args: argparse.Namespace) -> int:
    """A peer that crashes: `--mode receive` takes up to `--count` messages and ends the
    connection per `--end`; `--mode partial-send` writes part of a large message and
    waits to be killed; `--mode attach` ends the connection right after attaching."""
    log = EventLog(args.log, args.name)
    lane = LANES[args.lane]
    address = args.address or lane.address
    peer = _raw_connect(args)
    log.write("started", pid=os.getpid(), mode=args.mode, end=args.end, tls=bool(args.tls_ca))
    if args.mode == "attach":
        receiver = peer.session.receiver(f"raw-{os.getpid()}")
        receiver.source.address = address
        receiver.open()
        receiver.flow(100)
        peer.flush()
    elif args.mode == "receive":
        receiver = peer.session.receiver(f"raw-{os.getpid()}")
        receiver.source.address = address
        receiver.open()
        receiver.flow(args.count)
        got, deadline = 0, time.monotonic() + args.seconds
        while got < args.count and time.monotonic() < deadline:
            if not peer.pump(0.05):
                break
            delivery = receiver.current
            while delivery is not None and delivery.readable and not delivery.partial:
                data = receiver.recv(delivery.pending)
                receiver.advance()
                message = Message()
                message.decode(data)
                props = message.properties or {}
                log.write(
                    "delivered",
                    lane=lane.name,
                    queue=address,
                    id=str(message.id),
                    producer=props.get("producer"),
                    seq=props.get("seq"),
                    count=message.delivery_count,
                )
                got += 1
                delivery = receiver.current
    elif args.mode == "partial-send":
        sender = peer.session.sender(f"raw-{os.getpid()}")
        sender.target.address = address
        sender.open()
        deadline = time.monotonic() + 10
        while sender.credit <= 0 and time.monotonic() < deadline:
            if not peer.pump(0.05):
                log.write("disconnected")
                return EXIT_DISCONNECTED
        size = args.size
        message = Message(id=f"{args.name}:partial", durable=True, body="p" * size)
        message.properties = {"lane": lane.name, "producer": args.name, "seq": 0}
        delivery = sender.delivery(b"partial")
        sender.send(message.encode())
        sender.advance()
        total = peer.transport.pending()
        sent = peer.flush(limit=int(total * args.fraction))
        log.write("partial", id=str(message.id), sent=sent, total=total, delivery=str(delivery))
        if args.end == "hold":
            time.sleep(120)  # the schedule SIGKILLs us here, mid-message
    if args.end == "close-no-wait":
        peer.connection.close()
        peer.flush()
        peer.vanish()
    elif args.end == "fin":
        peer.vanish()
    else:
        peer.reset()
    log.write("ended", end=args.end)
    return 0
