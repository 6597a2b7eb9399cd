"""Storage that fails for good, as `scow run` meets it: the journal's or the pages'
directory removed under the broker (an operator's clean-up, a volume gone).

Before, the broker served on storing nothing: the producer's next durable send was never
answered (its client timed out), acknowledgements failed with tracebacks in the log, and
so until someone restarted it. Now the broker logs the failure and ends at once with
status 74 (EX_IOERR), as a crash would: its clients see their connections drop (and send
again what was not confirmed), and a supervisor restarts it on what is on disk.
"""

from __future__ import annotations

import shutil

import pytest
from proton import ConnectionException, Message

from scow.core.testing import amqp_client
from tests.system.topology import PAGING, BrokerSpec

EXIT_STORAGE_FAILED = 74
QUEUE = "doomed"


@pytest.mark.parametrize(
    ("removed", "spec", "storage"),
    [
        ("journal", BrokerSpec(), "journal"),
        ("paging", BrokerSpec(address_settings={QUEUE: PAGING}), f"address '{QUEUE}'"),
    ],
)
def test_storage_that_fails_for_good_ends_scow_run_with_status_74(
    system_broker, removed, spec, storage
):
    broker = system_broker(spec)
    assert broker.proc is not None and broker.data_dir is not None
    with amqp_client(broker) as conn:
        sender = conn.create_sender(QUEUE)
        for seq in range(10):
            sender.send(Message(body=b"x" * 4096, durable=True, properties={"seq": seq}))
        shutil.rmtree(broker.data_dir / removed)
        # its next file cannot be made: the connection drops, nothing hangs
        with pytest.raises(ConnectionException, match="disconnected"):
            for seq in range(10, 2_000):  # 8 MiB: past the 1 MiB journal files at hand
                sender.send(
                    Message(body=b"x" * 4096, durable=True, properties={"seq": seq}), timeout=20
                )
    broker.proc.wait(30)
    broker.deliberate = True  # this exit is what the test is for
    assert broker.proc.returncode == EXIT_STORAGE_FAILED, broker.log_tail()
    (line,) = broker.log_lines("storage failed")
    assert storage in line and "No such file or directory" in line, line

    broker.start()  # a supervisor's restart, on what is left
    with amqp_client(broker) as conn:
        conn.create_sender("other").send(Message(body="after", durable=True))
        receiver = conn.create_receiver("other")
        assert receiver.receive(timeout=10).body == "after"
        receiver.accept()
