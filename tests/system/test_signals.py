"""`scow run` stops cleanly on SIGINT (Ctrl-C), SIGTERM (a service manager) and SIGHUP (the
terminal it ran in was closed): status 0, the signal named in its log, and its journal
found closed cleanly at the next start with every durable message in it. Before, SIGHUP
killed it on the spot (Python's default), as SIGKILL would.

The clients connected then are told why they lose their connection: an AMQP close with
`amqp:connection:forced` ("the broker is shutting down"), which a client such as Qpid
JMS takes as its cue to reconnect elsewhere. Before, their sockets were cut and they saw
a framing error ("connection aborted").
"""

from __future__ import annotations

import signal
import socket

import pytest
from proton import Message

from scow.core.testing import amqp_client, broker_processes
from tests.security import frames
from tests.wire.helpers import AMQP_HEADER, close_condition, consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name
)
def test_run_stops_cleanly_on_a_signal(tmp_path, sig):
    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS)
        with amqp_client(broker) as conn:
            conn.create_sender("kept").send(Message(body="durable", durable=True))
        assert broker.proc is not None
        broker.proc.send_signal(sig)
        assert broker.proc.wait(30) == 0
        log = broker.log_path.read_text()
        stopping = [line for line in log.splitlines() if "shutting down" in line]
        assert stopping and f"signal={sig.name}" in stopping[-1], log[-2000:]
        broker.start()
        restarted = broker.log_path.read_text()[len(log) :]
        assert "not stopped cleanly" not in restarted, restarted
        assert [m.body for m in consume_all(broker.url, "kept")] == ["durable"]


def test_clients_connected_at_a_stop_are_told_the_broker_is_shutting_down(tmp_path):
    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS)
        assert broker.proc is not None
        clients = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(3)]
        for sock in clients:
            sock.sendall(AMQP_HEADER + frames.open_())
            sock.settimeout(10)
            assert sock.recv(8) == AMQP_HEADER
        broker.proc.send_signal(signal.SIGTERM)
        assert broker.proc.wait(30) == 0
        for sock in clients:
            heard = b""
            while chunk := sock.recv(65536):
                heard += chunk
            sock.close()
            assert close_condition(AMQP_HEADER + heard) == (
                "amqp:connection:forced",
                "the broker is shutting down",
            )
