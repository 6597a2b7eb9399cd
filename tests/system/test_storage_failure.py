"""A journal that fails for good, as `scow run` meets it: its directory removed under it
(an operator's clean-up, a volume gone).

Before, the broker served on storing nothing: the producer's next durable send was never
answered (its client timed out) and every acknowledgement failed with a traceback in the
log, until someone restarted it. Now the broker logs the failure and ends at once with
status 74 (EX_IOERR), as a crash would: its clients see their connections drop (and send
again what was not confirmed), and a supervisor restarts it on what is on disk.
"""

from __future__ import annotations

import shutil

import pytest
from proton import ConnectionException, Message

from scow.core.testing import amqp_client
from tests.system.topology import BrokerSpec

EXIT_STORAGE_FAILED = 74
QUEUE = "doomed"


def test_a_journal_that_fails_for_good_ends_scow_run_with_status_74(system_broker):
    broker = system_broker(BrokerSpec())
    assert broker.proc is not None and broker.data_dir is not None
    with amqp_client(broker) as conn:
        sender = conn.create_sender(QUEUE)
        for seq in range(10):
            sender.send(Message(body=b"x" * 4096, durable=True, properties={"seq": seq}))
        shutil.rmtree(broker.data_dir / "journal")
        # the journal's next file cannot be made: the connection drops, nothing hangs
        with pytest.raises(ConnectionException, match="disconnected"):
            for seq in range(10, 2_000):  # 8 MiB: past the 1 MiB files at hand
                sender.send(
                    Message(body=b"x" * 4096, durable=True, properties={"seq": seq}), timeout=20
                )
    broker.proc.wait(30)
    broker.deliberate = True  # this exit is what the test is for
    assert broker.proc.returncode == EXIT_STORAGE_FAILED, broker.log_tail()
    (line,) = broker.log_lines("storage failed")
    assert "journal" in line and "No such file or directory" in line

    broker.start()  # a supervisor's restart: a fresh journal where the old one was
    with amqp_client(broker) as conn:
        conn.create_sender(QUEUE).send(Message(body="after", durable=True))
        receiver = conn.create_receiver(QUEUE)
        assert receiver.receive(timeout=10).body == "after"
        receiver.accept()
