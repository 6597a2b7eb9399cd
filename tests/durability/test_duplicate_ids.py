"""Duplicate-id caches across restarts and crashes (persist-id-cache), on every journal.

A producer that lost its connection resends what it is unsure of with the same
`_AMQ_DUPL_ID`; whatever the broker went through meanwhile, each message is kept once.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection

from scow.core import app
from scow.core.storage import DUPLICATE_ID, DUPLICATE_IDS
from scow.core.testing import BrokerThread, broker_config, wait_for, write_config
from tests.journal.helpers import cut_copies
from tests.wire.helpers import consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]
PAGING = [*PLUGINS, "paging"]
FAST_JOURNAL = {"journal": {"journal-file-size": "1MiB", "journal-buffer-timeout": 500000}}
DUPL = "_AMQ_DUPL_ID"
SCOW = [sys.executable, "-m", "scow.core.cli"]


def dupl(body: str, key: Any) -> Message:
    return Message(body=body, durable=True, properties={DUPL: key})


def send(url: str, address: str, *messages: Message) -> None:
    conn = BlockingConnection(url, timeout=10)
    try:
        sender = conn.create_sender(address)
        for message in messages:
            assert sender.send(message).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()


def bodies(url: str, address: str) -> list[str]:
    return [m.body for m in consume_all(url, address)]


def _broker(start, port: int | None = None, broker: dict | None = None, **kwargs: Any):
    sections = {**FAST_JOURNAL, "broker": broker or {}}
    kwargs.setdefault("plugins", PLUGINS)
    return start(sections=sections, port=port, **kwargs)


@pytest.mark.slow  # a variation on the SIGKILL tests, kept out of the default run
def test_ids_survive_a_clean_restart(scow_broker_process):
    broker = _broker(scow_broker_process)
    send(broker.url, "kept", dupl("a", "k-1"), dupl("b", b"k-2"))
    assert broker.stop() == 0
    restarted = _broker(scow_broker_process, broker.port)
    send(restarted.url, "kept", dupl("a again", "k-1"), dupl("b again", b"k-2"), dupl("c", "k-3"))
    assert bodies(restarted.url, "kept") == ["a", "b", "c"]


def test_ids_survive_sigkill(scow_broker_process):
    broker = _broker(scow_broker_process)
    send(broker.url, "killed", dupl("a", "s-1"))
    broker.kill()  # right after the outcome: the id was synced with the message
    restarted = _broker(scow_broker_process, broker.port)
    send(restarted.url, "killed", dupl("a again", "s-1"))
    assert bodies(restarted.url, "killed") == ["a"]


def test_without_persist_id_cache_ids_do_not_outlive_the_process(scow_broker_process):
    memory_only = {"persist-id-cache": False}
    broker = _broker(scow_broker_process, broker=memory_only)
    send(broker.url, "volatile", dupl("a", "v-1"), dupl("a again", "v-1"))  # detected...
    broker.kill()
    restarted = _broker(scow_broker_process, broker.port, broker=memory_only)
    send(restarted.url, "volatile", dupl("a after restart", "v-1"))  # ...but not kept
    assert bodies(restarted.url, "volatile") == ["a", "a after restart"]


@pytest.mark.slow  # a variation on the SIGKILL tests, kept out of the default run
def test_journaled_ids_are_dropped_when_persist_id_cache_is_turned_off(scow_broker_process):
    broker = _broker(scow_broker_process)
    send(broker.url, "switched", dupl("a", "w-1"))
    assert broker.stop() == 0
    off = _broker(scow_broker_process, broker.port, broker={"persist-id-cache": False})
    assert off.stop() == 0
    on = _broker(scow_broker_process, broker.port)
    send(on.url, "switched", dupl("a again", "w-1"), dupl("a once more", "w-1"))
    assert bodies(on.url, "switched") == ["a", "a again"]


def test_a_paged_message_s_id_survives_a_crash(scow_broker_process):
    paging = {"paged": {"max-size-bytes": 10_000, "page-size-bytes": 8_000}}
    broker = _broker(scow_broker_process, plugins=PAGING, address_settings=paging)
    send(broker.url, "paged", *(Message(body=f"{i}:" + "x" * 500, durable=True) for i in range(40)))
    send(broker.url, "paged", dupl("p", "p-1"))
    broker.kill()
    restarted = _broker(scow_broker_process, broker.port, plugins=PAGING, address_settings=paging)
    send(restarted.url, "paged", dupl("p again", "p-1"))
    got = bodies(restarted.url, "paged")
    assert len(got) == 41 and got[-1] == "p"


def _duplicate_ids_in_store(config: Path) -> int:
    """How many duplicate-id records the store holds (`scow data print --config`)."""
    out = subprocess.run(
        [*SCOW, "data", "print", "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # "# <journal>: ..., N duplicate ids" (after the journals' log lines)
    head = next(line for line in out.splitlines() if line.endswith(" duplicate ids"))
    return int(head.rsplit(",", 1)[1].split()[0])


@pytest.mark.slow  # a variation on the SIGKILL tests, kept out of the default run
def test_ids_pushed_out_of_the_cache_leave_the_journal(scow_broker_process, tmp_path):
    small = {"ids": {"id-cache-size": 3}}
    broker = _broker(scow_broker_process, address_settings=small)
    send(broker.url, "ids", *(dupl(f"m{i}", f"i-{i}") for i in range(30)))
    assert broker.stop() == 0
    assert _duplicate_ids_in_store(tmp_path / "scow.toml") == 6  # two generations of 3
    restarted = _broker(scow_broker_process, broker.port, address_settings=small)
    send(restarted.url, "ids", dupl("old", "i-0"), dupl("recent", "i-29"))
    got = bodies(restarted.url, "ids")
    assert got == [f"m{i}" for i in range(30)] + ["old"]


@pytest.mark.slow  # a variation on the SIGKILL tests, kept out of the default run
def test_a_lowered_id_cache_size_forgets_the_oldest_ids_at_start(scow_broker_process, tmp_path):
    broker = _broker(scow_broker_process)
    send(broker.url, "shrunk", *(dupl(f"m{i}", f"r-{i}") for i in range(5)))
    assert broker.stop() == 0
    lowered = _broker(scow_broker_process, broker.port, broker={"id-cache-size": 2})
    assert lowered.stop() == 0
    # replayed in generations of 2: r-0 and r-1 dropped, r-2 and r-3 old, r-4 young
    assert _duplicate_ids_in_store(tmp_path / "scow.toml") == 3
    again = _broker(scow_broker_process, broker.port)
    send(again.url, "shrunk", *(dupl(f"m{i} again", f"r-{i}") for i in range(5)))
    assert bodies(again.url, "shrunk") == [f"m{i}" for i in range(5)] + [
        f"m{i} again" for i in range(2)
    ]


def _producer(url: str, start: int, confirmed: list[int], stop: threading.Event) -> None:
    """Send numbered messages, each with its number as id, until stopped or killed."""
    try:
        conn = BlockingConnection(url, timeout=10)
        sender = conn.create_sender("exactly")
        n = start
        while not stop.is_set():
            sender.send(dupl(str(n), f"n-{n}"))
            confirmed.append(n)
            n += 1
    except Exception:
        return  # the broker was killed under us: message n is in doubt


def test_resending_after_a_sigkill_loses_nothing_and_doubles_nothing(scow_broker_process):
    broker = _broker(scow_broker_process)
    stop = threading.Event()
    confirmed: list[list[int]] = [[], [], []]
    threads = [
        threading.Thread(target=_producer, args=(broker.url, i * 10**6, confirmed[i], stop))
        for i in range(3)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(len(c) > 20 for c in confirmed), timeout=30, what="traffic")
    time.sleep(0.5)  # the crash point, mid-traffic
    broker.kill()
    stop.set()
    for thread in threads:
        thread.join(20)
    restarted = _broker(scow_broker_process, broker.port)
    # each producer resends what it is unsure of (the send killed under it) and, being
    # careful, its last 20 confirmed ones too
    resent = []
    for part, numbers in enumerate(confirmed):
        last = numbers[-1] if numbers else part * 10**6 - 1
        resent += [*numbers[-20:], last + 1]
    send(restarted.url, "exactly", *(dupl(str(n), f"n-{n}") for n in resent))
    got = [int(body) for body in bodies(restarted.url, "exactly")]
    assert len(got) == len(set(got)), "a message was kept twice"
    everything = {n for part in confirmed for n in part} | set(resent)
    assert set(got) == everything


def test_export_and_import_carry_the_ids(scow_broker_process, tmp_path):
    small = {"gens": {"id-cache-size": 3}}
    broker = _broker(scow_broker_process, address_settings=small)
    send(broker.url, "moved", dupl("a", "e-1"), dupl("b", b"\x00e-2"))
    assert bodies(broker.url, "moved") == ["a", "b"]
    # two generations: g-0..g-2 the old one, g-3 and g-4 the young one
    send(broker.url, "gens", *(dupl(f"g{i}", f"g-{i}") for i in range(5)))
    assert len(bodies(broker.url, "gens")) == 5
    assert broker.stop() == 0
    assert _duplicate_ids_in_store(tmp_path / "scow.toml") == 7
    data, export, fresh = tmp_path / "data", tmp_path / "export.jsonl", tmp_path / "fresh"
    _scow_data("export", "--data-dir", str(data), "--output", str(export))
    imported = _scow_data("import", "--data-dir", str(fresh), "--input", str(export))
    assert "'duplicate-ids': 7" in imported
    data.rename(tmp_path / "old")
    fresh.rename(data)
    restarted = _broker(scow_broker_process, broker.port, address_settings=small)
    send(restarted.url, "moved", dupl("a again", "e-1"), dupl("b again", b"\x00e-2"))
    assert bodies(restarted.url, "moved") == []
    # the same generations: one more id fills the young one and g-0 is still kept; the
    # next ages it, and g-0..g-2 go
    send(restarted.url, "gens", dupl("g0 again", "g-0"), dupl("n0", "n-0"))
    send(restarted.url, "gens", dupl("g0 again", "g-0"), dupl("n1", "n-1"))
    send(restarted.url, "gens", dupl("g0 again, new", "g-0"), dupl("g3 again", "g-3"))
    assert bodies(restarted.url, "gens") == ["n0", "n1", "g0 again, new"]


def test_ids_journaled_by_an_earlier_version_are_still_detected(scow_broker_process, tmp_path):
    # Before 2026-11-25 a block of ids was a DUPLICATE_IDS record: each key after its
    # length, a key a tag byte (1: string, 2: binary) and the id; before blocks, one id
    # a DUPLICATE_ID record. Written here into the broker's own store, whichever it is.
    broker = _broker(scow_broker_process)
    assert broker.stop() == 0
    plugins, config = app.load(tmp_path / "scow.toml")
    storage = app.open_storage(plugins.unique("scow_register_journals", "journal"), config)
    try:
        storage.load()
        name = b"\x00\x05older"
        one = name + b"\x01o-0"
        block = name + b"".join(len(k).to_bytes(4, "big") + k for k in (b"\x01o-1", b"\x02o-2"))
        storage.messages.append_add(storage.next_id(), DUPLICATE_ID, one, sync=True)
        storage.messages.append_add(storage.next_id(), DUPLICATE_IDS, block, sync=True)
    finally:
        storage.stop()
    restarted = _broker(scow_broker_process, broker.port)
    send(restarted.url, "older", *(dupl("again", key) for key in ("o-0", "o-1", b"o-2")))
    send(restarted.url, "older", dupl("c", b"o-1"), dupl("d", "o-2"))  # other types
    assert bodies(restarted.url, "older") == ["c", "d"]
    restarted.kill()  # the new ids' block, then the old ones, after another start
    again = _broker(scow_broker_process, broker.port)
    send(again.url, "older", *(dupl("again", key) for key in ("o-0", "o-1", b"o-2", b"o-1")))
    assert bodies(again.url, "older") == []


def test_an_export_of_an_earlier_version_carries_its_ids(scow_broker_process, tmp_path):
    # Before 2026-11-25 an id's key was a tag byte (1: string, 2: binary) and its bytes;
    # now it is the id's AMQP encoding. An export of such a data dir carries the old
    # keys: its import converts them.
    broker = _broker(scow_broker_process)
    send(broker.url, "older", dupl("a", "o-1"), dupl("b", b"\x00o-2"))
    assert bodies(broker.url, "older") == ["a", "b"]
    assert broker.stop() == 0
    data, export, fresh = tmp_path / "data", tmp_path / "export.jsonl", tmp_path / "fresh"
    _scow_data("export", "--data-dir", str(data), "--output", str(export))
    old_keys = {b"\xa1\x03o-1": b"\x01o-1", b"\xa0\x04\x00o-2": b"\x02\x00o-2"}
    lines = []
    for text in export.read_text().splitlines():
        line = json.loads(text)
        if line.get("type") == "duplicate-id":
            line["id"] = base64.b64encode(old_keys.pop(base64.b64decode(line["id"]))).decode()
        lines.append(json.dumps(line))
    assert old_keys == {}  # both ids were exported, under the keys of this version
    export.write_text("\n".join(lines) + "\n")
    _scow_data("import", "--data-dir", str(fresh), "--input", str(export))
    data.rename(tmp_path / "old")
    fresh.rename(data)
    restarted = _broker(scow_broker_process, broker.port)
    send(restarted.url, "older", dupl("a again", "o-1"), dupl("b again", b"\x00o-2"))
    send(restarted.url, "older", dupl("c", b"o-1"), dupl("d", "\x00o-2"))  # other types
    assert bodies(restarted.url, "older") == ["c", "d"]


def _scow_data(*command: str) -> str:
    """Run `scow data COMMAND...`; its output (it must succeed)."""
    run = subprocess.run([*SCOW, "data", *command], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_compaction_keeps_the_cached_ids_and_nothing_else(scow_broker_process, tmp_path):
    small = {"compacted": {"id-cache-size": 3}}
    broker = scow_broker_process(plugins=PLUGINS, address_settings=small)
    for batch in range(4):
        send(broker.url, "compacted", *(dupl("m", f"c-{batch}-{i}") for i in range(50)))
        assert len(bodies(broker.url, "compacted")) == 50
    assert broker.stop() == 0
    run = subprocess.run(
        [*SCOW, "data", "compact", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    # 200 ids in generations of 3: c-3-45..c-3-47 the old one, c-3-48 and c-3-49 the young
    assert _duplicate_ids_in_store(tmp_path / "scow.toml") == 5
    restarted = scow_broker_process(plugins=PLUGINS, address_settings=small, port=broker.port)
    send(
        restarted.url,
        "compacted",
        dupl("old", "c-3-44"),
        dupl("kept", "c-3-45"),
        dupl("newest", "c-3-49"),
    )
    assert bodies(restarted.url, "compacted") == ["old"]


# --------------------------------------------------------------------------- id blocks


def test_a_transaction_s_block_comes_back_in_its_generation(scow_broker_process):
    from tests.wire.test_duplicate_detection import commit

    small = {"blocks": {"id-cache-size": 5}}
    broker = _broker(scow_broker_process, address_settings=small)
    first = [dupl(f"t{i}", f"t-{i}") for i in range(5)]
    assert commit(broker.url, "blocks", *first).outcome == "committed"  # fills the young
    # a block of 2 does not fit: t-0..t-4 become the old generation
    second = [dupl("t5", "t-5"), dupl("t6", "t-6")]
    assert commit(broker.url, "blocks", *second).outcome == "committed"
    broker.kill()  # both commits were synced before their outcomes
    restarted = _broker(scow_broker_process, broker.port, address_settings=small)
    # the same generations: three more ids fill the young one and t-0 is still kept;
    # one more ages it, and t-0..t-4 go
    send(restarted.url, "blocks", dupl("t0 again", "t-0"))
    send(restarted.url, "blocks", *(dupl(f"n{i}", f"n-{i}") for i in range(3)))
    send(restarted.url, "blocks", dupl("t4 again", "t-4"), dupl("n3", "n-3"))
    send(restarted.url, "blocks", dupl("t0 again, new", "t-0"), dupl("t5 again", "t-5"))
    assert bodies(restarted.url, "blocks") == [f"t{i}" for i in range(7)] + [
        "n0",
        "n1",
        "n2",
        "n3",
        "t0 again, new",
    ]


def test_ids_admitted_in_passes_come_back_in_order_after_sigkill(scow_broker_process):
    from tests.wire.helpers import bulk_send

    small = {"ring": {"id-cache-size": 50}}
    broker = _broker(scow_broker_process, address_settings=small)
    # not durable, sent without waiting: their ids are journaled a block per loop pass
    bulk_send(
        broker.url,
        "ring",
        120,
        lambda i: Message(body=f"r{i}", durable=False, properties={DUPL: f"r-{i}"}),
    )
    assert len(bodies(broker.url, "ring")) == 120
    # a durable message's sync covers the blocks journaled before it
    send(broker.url, "ring", dupl("synced", "s"))
    broker.kill()
    restarted = _broker(scow_broker_process, broker.port, address_settings=small)
    # the generations came back as they were: r-50..r-99 the old one, r-100..r-119 and
    # s the young one (21 ids); r-49 is new again and makes it 22
    send(
        restarted.url,
        "ring",
        *(dupl(f"r{i} again", f"r-{i}") for i in (49, 50, 99, 119)),
        dupl("synced again", "s"),
    )
    # 28 more fill the young generation: r-50 is still kept; the next ages it
    send(restarted.url, "ring", *(dupl(f"n{i}", f"n-{i}") for i in range(28)))
    send(restarted.url, "ring", dupl("r50 again", "r-50"), dupl("n28", "n-28"))
    send(restarted.url, "ring", dupl("r50 again, new", "r-50"), dupl("s again", "s"))
    assert bodies(restarted.url, "ring") == [
        "synced",
        "r49 again",
        *(f"n{i}" for i in range(29)),
        "r50 again, new",
    ]


def _cut_broker(data: Path) -> BrokerThread:
    queues = {"once": {"routing-type": "ANYCAST"}}  # declared: the bindings stay uncut
    tables = broker_config(data, plugins=PLUGINS, sections={"queues": queues})
    return BrokerThread(write_config(data.with_suffix(".toml"), tables)).start()


def test_a_journal_cut_anywhere_keeps_each_message_with_its_id(tmp_path: Path) -> None:
    """An id is recorded in the same journal transaction as the message it admits: cut
    the journal at any record (what a crash leaves), and each message is back with its
    id or not at all. A message kept without its id would be stored again by the
    producer's resend, and an id kept without its message would drop the resend."""
    count = 3
    broker = _cut_broker(tmp_path / "data")
    try:
        send(broker.url, "once", *(dupl(f"m{n}", f"id-{n}") for n in range(count)))
    finally:
        broker.stop()
    seen = []
    for cut, data in cut_copies(tmp_path / "data"):
        restarted = _cut_broker(data)
        try:
            kept = restarted.queue_stats("once")["message-count"]
            # the producer resends all: whatever was kept is dropped, the rest stored
            send(restarted.url, "once", *(dupl(f"m{n}", f"id-{n}") for n in range(count)))
            after = restarted.queue_stats("once")["message-count"]
        finally:
            restarted.stop()
        seen.append((cut, kept))
        assert after == count, f"journal ending at {cut}: {kept} kept, {after} after the resend"
    assert seen[0][1] == 0 and seen[-1][1] == count, seen
