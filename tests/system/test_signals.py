"""`scow run` stops cleanly on SIGINT (Ctrl-C), SIGTERM (a service manager) and SIGHUP (the
terminal it ran in was closed): status 0, the signal named in its log, and its journal
found closed cleanly at the next start with every durable message in it. Before, SIGHUP
killed it on the spot (Python's default), as SIGKILL would."""

from __future__ import annotations

import signal

import pytest
from proton import Message

from scow.core.testing import amqp_client, broker_processes
from tests.wire.helpers import consume_all

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
