"""A dead-letter or expiry move stopped by a crash at any point of its journal writes.

A move is two changes: the copy stored on the target address, and the original's
acknowledgement. Written as two, a SIGKILL between them left both, and the restarted
broker moved the original a second time: two copies on the dead-letter address (the
chaos schedule found it, `DLA<-sys.poison ... delivered 2 times`). They are one journal
transaction now. A SIGKILL leaves a prefix of what the journal wrote (the page cache
keeps every write made before it), so the test stops `scow run` once the move is done,
then restarts a copy of its data for every point the journal can end at, record by
record, and counts what each gives back: the message once, never twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import Message

from scow.core.testing import BrokerThread, amqp_client, broker_config, wait_for, write_config
from tests.journal.helpers import cut_copies, records_on_disk

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging"]
QUEUE = "work"
COUNT = 3


def _broker(data: Path, settings: dict) -> BrokerThread:
    # declared, so that none is deleted once empty (the bindings journal is not cut)
    queues = {name: {"routing-type": "ANYCAST"} for name in (QUEUE, "DLA", "ExpiryQueue")}
    tables = broker_config(
        data, plugins=PLUGINS, address_settings=settings, sections={"queues": queues}
    )
    config = write_config(data.with_suffix(".toml"), tables)
    return BrokerThread(config).start()


def _count(broker: BrokerThread, name: str) -> int:
    stats = broker.queue_stats(name)
    return 0 if stats is None else int(stats["message-count"])


def _move(broker: BrokerThread, how: str) -> None:
    """Send COUNT durable messages to QUEUE and have each moved `how`."""
    ttl = {"ttl": 1.0} if how == "expiry" else {}  # all sent before the first expires
    with amqp_client(broker) as conn:
        sender = conn.create_sender(QUEUE)
        for n in range(COUNT):
            sender.send(Message(body=f"m{n}", durable=True, **ttl))
        if how != "expiry":
            receiver = conn.create_receiver(QUEUE, credit=COUNT)
            for _ in range(COUNT):
                receiver.receive(timeout=10)
                receiver.reject()


@pytest.mark.parametrize(
    ("how", "target", "settings"),
    [
        ("dead-letter", "DLA", {}),
        ("expiry", "ExpiryQueue", {}),
        # the copies go to the dead-letter address's pages, not to its queue's memory
        ("dead-letter", "DLA", {"DLA": {"max-size-bytes": 1, "address-full-policy": "PAGE"}}),
    ],
    ids=["dead-letter", "expiry", "dead-letter-to-pages"],
)
def test_a_crash_anywhere_in_a_move_leaves_each_message_once(
    tmp_path: Path, how: str, target: str, settings: dict
) -> None:
    broker = _broker(tmp_path / "data", settings)
    try:
        _move(broker, how)
        wait_for(lambda: _count(broker, target) == COUNT, timeout=20, what="the moves")
    finally:
        broker.stop()

    # the first COUNT messages journaled are the originals: their moves come after
    records = records_on_disk(tmp_path / "data" / "journal")
    originals = [r.offset for r in records if r.valid and r.kind == "ADD"][:COUNT]
    seen = []
    for cut, data in cut_copies(tmp_path / "data"):
        restarted = _broker(data, settings)
        try:
            left, moved = _count(restarted, QUEUE), _count(restarted, target)
        finally:
            restarted.stop()
        seen.append((cut, left, moved))
        sent = sum(offset < cut for offset in originals)
        assert left + moved == sent, f"journal ending at {cut}: {left} left, {moved} moved"
    assert seen[-1][1:] == (0, COUNT), seen  # the whole journal: all moved
    assert any(left == COUNT for _cut, left, _moved in seen), seen  # and before: none
