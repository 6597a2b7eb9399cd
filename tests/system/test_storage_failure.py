"""Storage that fails for good, as `scow run` meets it: the journal's or the pages'
directory removed under the broker (an operator's clean-up, a volume gone).

Before, the broker served on storing nothing: the producer's next durable send was never
answered (its client timed out), acknowledgements failed with tracebacks in the log, and
so until someone restarted it. Now the broker logs the failure and ends at once with
status 74 (EX_IOERR), as a crash would: its clients see their connections drop (and send
again what was not confirmed), and a supervisor restarts it on what is on disk.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
from proton import ConnectionException, Message, Timeout, symbol
from proton.reactor import Filter

from scow.core.testing import amqp_client, wait_for
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


def test_a_flipped_byte_in_a_journal_file_costs_one_message_not_the_rest_of_the_file(
    system_broker,
):
    """Before, recovery ignored the rest of a file after a damaged record: one flipped
    byte in the middle of the first 1 MiB file lost 177 of 600 acknowledged messages."""
    broker = system_broker(BrokerSpec(queues={QUEUE: {"routing-type": "ANYCAST"}}))
    (first,) = _rotted_after_sending(broker, "journal/*.scow", lambda files: files[:1])
    seqs = _received(broker, COUNT - 1)
    assert len(set(range(COUNT)) - set(seqs)) == 1  # the one the byte was in
    assert seqs == sorted(seqs)
    (warning,) = broker.log_lines("journal file damaged")
    assert "skipped to its next valid record" in warning and first.name in warning


def test_a_flipped_byte_in_a_journal_files_header_costs_nothing(system_broker):
    """Before, a file whose header did not check went to the attic whole: one flipped
    byte there lost every message of the first 1 MiB file (the receive timed out)."""
    broker = system_broker(BrokerSpec(queues={QUEUE: {"routing-type": "ANYCAST"}}))
    (first,) = _rotted_after_sending(broker, "journal/*.scow", lambda files: files[:1], at=12)
    assert _received(broker, COUNT) == list(range(COUNT))
    (warning,) = broker.log_lines("journal file header damaged")
    assert first.name in warning
    assert not broker.log_lines("moved to the attic")


#: Messages the bit-rot tests send, each with its `seq` property.
COUNT = 600


def _rotted_after_sending(broker, pattern: str, which, at: int | None = None) -> list[Path]:
    """COUNT durable messages of 3,000 B sent, the broker stopped, one byte flipped in the
    middle (or at offset `at`) of each of `which(files)` (the data dir's files matching
    `pattern`, sorted), and the broker started again: bit rot in sealed and open files.
    Returns those files."""
    assert broker.data_dir is not None
    with amqp_client(broker) as conn:
        sender = conn.create_sender(QUEUE)
        for seq in range(COUNT):
            body = f"{seq:06d}" * 500
            sender.send(Message(body=body, durable=True, properties={"seq": seq}))
    assert broker.stop() == 0
    files = sorted(broker.data_dir.glob(pattern))
    rotted = which(files)
    for path in rotted:
        with path.open("r+b") as f:
            f.seek(path.stat().st_size // 2 if at is None else at)
            byte = f.read(1)[0]
            f.seek(-1, 1)
            f.write(bytes([byte ^ 0xFF]))
    broker.start()
    return rotted


def _received(broker, count: int) -> list[int]:
    """The `seq` of the first `count` messages a consumer gets (and accepts); the queue
    is empty afterwards."""
    with amqp_client(broker) as conn:
        receiver = conn.create_receiver(QUEUE, credit=COUNT)
        seqs = []
        while len(seqs) < count:
            seqs.append(receiver.receive(timeout=10).properties["seq"])
            receiver.accept()
    wait_for(lambda: broker.api(f"/api/queues/{QUEUE}")["message-count"] == 0, 10)
    return seqs


def _first_and_last(files: list[Path]) -> list[Path]:
    """A sealed file, and the one open at the stop."""
    assert len(files) >= 3, files
    return [files[0], files[-1]]


def test_a_flipped_byte_in_a_page_file_costs_one_message_not_the_rest_of_the_page(
    system_broker,
):
    """Before, a damaged frame ended its page for every reader: one flipped byte in the
    middle of a sealed page lost the rest of it, and in the page still open at the stop
    the store cut everything after it as a torn tail when the broker started again."""
    paged = {"max-size-bytes": 0, "page-size-bytes": "256KiB"}
    broker = system_broker(
        BrokerSpec(queues={QUEUE: {"routing-type": "ANYCAST"}}, address_settings={QUEUE: paged})
    )
    _rotted_after_sending(broker, "paging/**/*.page", _first_and_last)
    seqs = _received(broker, COUNT - 2)
    assert len(set(range(COUNT)) - set(seqs)) == 2  # the two the bytes were in
    assert seqs == sorted(seqs)
    damaged = broker.log_lines("page record unreadable")
    assert len(damaged) == 2, damaged
    assert all("read on at its next valid record" in line for line in damaged), damaged


def test_a_flipped_byte_in_a_stream_segment_costs_one_record_and_is_never_delivered(
    system_broker,
):
    """Before, stream reads trusted a segment's frames without their CRCs: a flipped byte
    in a sealed segment reached readers as a changed message, and the segment still open
    at the stop was cut at the damage when the broker started again."""
    stream = {
        "routing-type": "ANYCAST",
        "arguments": {"x-queue-type": "stream", "segment-bytes": 256 << 10},
    }
    broker = system_broker(BrokerSpec(queues={QUEUE: stream}))
    _rotted_after_sending(broker, "streams/**/*.seg", _first_and_last)
    with amqp_client(broker) as conn:
        receiver = conn.create_receiver(
            QUEUE, credit=COUNT, options=Filter({symbol("scow:stream-offset"): "first"})
        )
        got = {}
        with contextlib.suppress(Timeout):
            while len(got) < COUNT:
                message = receiver.receive(timeout=5)
                got[message.properties["seq"]] = message.body
                receiver.accept()
    assert len(got) == COUNT - 2, sorted(set(range(COUNT)) - set(got))
    assert all(body == f"{seq:06d}" * 500 for seq, body in got.items())
    damaged = broker.log_lines("stream record unreadable")
    assert len(damaged) == 2, damaged
