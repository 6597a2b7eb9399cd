"""A disk whose syncs stall (a saturated volume, a throttled cloud disk, an NFS server
that hiccups), as `scow run` meets it: fsync and fdatasync hang for as long as a flag
file exists, through a preloaded shim, while everything else works. And a database whose
commits hang (its server stopped with SIGSTOP) under the database store.

Before, the first journal roll with no spare file at hand made one on the event loop and
synced it there: the whole broker froze for as long as the stall lasted (no management
API, no non-durable traffic, no heartbeats, so every client timed out). And nothing bounded
what producers could send ahead of the disk meanwhile but that freeze.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proton import Delivery, Message

from scow.core.testing import amqp_client, scow_command, wait_for
from scow.plugins.database_store.journal import MAX_WAITING
from tests.system.broker import perf_send, scow_behind
from tests.system.topology import PLUGINS, BrokerSpec

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
/* Only the syncs of files whose path holds SCOW_TEST_STALL_ONLY, when it is set. */
static int stalls(int fd) {
    const char *only = getenv("SCOW_TEST_STALL_ONLY");
    char link[64], path[4096];
    if (!only) return 1;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    return strstr(path, only) != NULL;
}
static void wait_while_stalled(int fd) {
    const char *flag = getenv("SCOW_TEST_STALL_FLAG");
    struct stat st;
    if (!stalls(fd)) return;
    while (flag && stat(flag, &st) == 0) usleep(10000);
}
int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    wait_while_stalled(fd);
    return real(fd);
}
int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    wait_while_stalled(fd);
    return real(fd);
}
/* Unlinks hang only when SCOW_TEST_STALL_UNLINK is set, for paths that hold it. */
static void wait_while_unlink_stalled(const char *path) {
    const char *only = getenv("SCOW_TEST_STALL_UNLINK");
    const char *flag = getenv("SCOW_TEST_STALL_FLAG");
    struct stat st;
    if (!only || !strstr(path, only)) return;
    while (flag && stat(flag, &st) == 0) usleep(10000);
}
int unlink(const char *path) {
    static int (*real)(const char *);
    if (!real) real = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    wait_while_unlink_stalled(path);
    return real(path);
}
int unlinkat(int dirfd, const char *path, int flags) {
    static int (*real)(int, const char *, int);
    if (!real) real = (int (*)(int, const char *, int))dlsym(RTLD_NEXT, "unlinkat");
    wait_while_unlink_stalled(path);
    return real(dirfd, path, flags);
}
"""
COUNT, BODY = 20_000, 1024  # 20 MiB: twenty 1 MiB journal files
MiB = 1 << 20


def _stalling(tmp_path: Path, only: str = "", *, unlink: str = "") -> tuple[str, Path]:
    """(a `scow` that syncs through the shim, the flag file that stalls its syncs: of
    every file, or of those whose path holds `only`; and with `unlink`, the unlinks of
    paths that hold it)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: the sync-stalling shim cannot be built")
    source, shim = tmp_path / "stall.c", tmp_path / "libstall.so"
    source.write_text(SHIM)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(shim), str(source), "-ldl"], check=True)
    flag = tmp_path / "stall"
    prelude = f"export LD_PRELOAD={shim} SCOW_TEST_STALL_FLAG={flag}"
    if only:
        prelude += f" SCOW_TEST_STALL_ONLY={only}"
    if unlink:
        prelude += f" SCOW_TEST_STALL_UNLINK={unlink}"
    return scow_behind(tmp_path / "scow-on-a-slow-disk", prelude), flag


@pytest.fixture
def stalling_disk(tmp_path: Path) -> tuple[str, Path]:
    return _stalling(tmp_path)


@pytest.fixture
def stalling_pages(tmp_path: Path) -> tuple[str, Path]:
    """The same for page files only: the journal's syncs go on."""
    return _stalling(tmp_path, "/paging/")


def _held_back(broker, by: str) -> bool:
    return any(r.startswith(by) for r in broker.api("/api/broker")["producers-blocked-by"])


def _answers_quickly(broker, *, non_durable: bool) -> None:
    """The management API, and a non-durable round trip (when its address need not page),
    each answer within 2 s."""
    started = time.monotonic()
    broker.api("/api/broker", timeout=2)
    if non_durable:
        with amqp_client(broker, timeout=2) as conn:
            conn.create_sender("live").send(Message(body="live"), timeout=2)
            receiver = conn.create_receiver("live")
            assert receiver.receive(timeout=2).body == "live"
            receiver.accept()
    assert time.monotonic() - started < 4


@pytest.mark.parametrize(
    ("memory", "journal_type", "held_by"),
    [("256MiB", "NIO", "journal "), ("256MiB", "AIO", "journal "), ("2MiB", "NIO", "")],
    ids=["in-memory", "in-memory-aio", "paging"],
)
def test_a_stalled_disk_holds_durable_producers_back_and_nothing_else(
    system_broker, stalling_disk, memory, journal_type, held_by
):
    """In memory, the journal holds its producers back once it is a file behind; where
    everything pages (2 MiB of memory), so does the page writer, and non-durable messages
    wait for the disk too, as they must: they have nowhere else to go.

    It held them late: the loop was told through a callback, and a fast producer kept it
    reading its socket (libuv reads on while there is data) for 10 MB before it ran; and
    with AIO the writer went on writing batches while their sync waited, each of them
    letting the producers go again."""
    command, flag = stalling_disk
    anycast = {"routing-type": "ANYCAST"}
    spec = BrokerSpec(
        queues={"durable": anycast, "live": anycast},
        global_max_size=memory,
        journal={"journal-file-size": "1MiB", "journal-min-files": 2, "journal-type": journal_type},
    )
    broker = system_broker(spec, command=command)
    in_memory = memory != "2MiB"
    _answers_quickly(broker, non_durable=True)
    rss_before = broker.rss_kib() * 1024
    flag.touch()
    producer = subprocess.Popen(
        [
            *(scow_command(), "perf", "client", "--url", f"{broker.url}/durable", "--json"),
            *("--mode", "send", "--durable", "--max-pending", "0", "--count", str(COUNT)),
            *("--size", str(BODY), "--timeout", "120"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _held_back(broker, held_by), 30)
        stalled_until = time.monotonic() + 3  # past the slow-sync warning's threshold
        while time.monotonic() < stalled_until:
            _answers_quickly(broker, non_durable=in_memory)
        held = broker.api("/api/queues/durable")["message-count"]
        # a file (1 MiB: 1,000 messages) not taken by the writer, with AIO one more written
        # but not synced, and the producer's credit (1,000); it held 1,500 to 3,000 here,
        # and 8,500 to 16,500 (20,000: all, with AIO) before
        assert held <= 4_000, (
            held,
            broker.api("/api/broker")["journal"],
            broker.log_lines("journal behind", "slow disk", "producers"),
        )
        assert broker.rss_kib() * 1024 - rss_before < 64 * MiB
        assert producer.poll() is None  # none of its sends can be confirmed yet
        if in_memory:  # the log's writer thread may not have written it yet
            wait_for(lambda: broker.log_lines("journal behind its disk"), 10)
            (line,) = broker.log_lines("journal behind its disk")
            assert "producers held" in line
    finally:
        flag.unlink()
    out, err = producer.communicate(timeout=120)
    assert producer.returncode == 0, err + out
    assert json.loads(out)["sent"] == COUNT
    assert broker.api("/api/queues/durable")["message-count"] == COUNT
    wait_for(lambda: broker.api("/api/broker")["producers-blocked-by"] == [], 10)
    # and the operator is told where the time went
    wait_for(lambda: broker.log_lines("slow disk: a sync took long"), 10)


def _signal_server(server, sig: int) -> None:
    """`sig` to the PostgreSQL server and every backend of it."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    subprocess.run(["pkill", f"-{sig}", "-P", str(postmaster)], check=False)
    os.kill(postmaster, sig)


@pytest.mark.postgres
def test_a_stalled_database_holds_durable_producers_back_and_nothing_else(
    system_broker, private_postgres
):
    """The database store's journal queued whatever producers sent while its commits
    hung: nothing bounded it but the network time-out, 20 s by default."""
    server = private_postgres
    anycast = {"routing-type": "ANYCAST"}
    spec = BrokerSpec(
        plugins=(*PLUGINS, "database-store"),
        broker={"journal": "database"},
        queues={"durable": anycast, "live": anycast},
        global_max_size="256MiB",
        sections={"database": {"url": server.url(server.create_database())}},
    )
    broker = system_broker(spec)
    _answers_quickly(broker, non_durable=True)
    rss_before = broker.rss_kib() * 1024
    _signal_server(server, signal.SIGSTOP)
    try:
        producer = subprocess.Popen(
            [
                *(scow_command(), "perf", "client", "--url", f"{broker.url}/durable", "--json"),
                *("--mode", "send", "--durable", "--max-pending", "0", "--count", str(COUNT * 4)),
                *("--size", str(BODY), "--timeout", "120"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: _held_back(broker, "journal messages"), 30)
        for _ in range(3):
            _answers_quickly(broker, non_durable=True)
        held = broker.api("/api/queues/durable")["message-count"]
        assert held < 2 * MAX_WAITING, held  # what waits, the batch being written, credit
        assert broker.rss_kib() * 1024 - rss_before < 96 * MiB
        assert producer.poll() is None
        wait_for(lambda: broker.log_lines("database journal behind"), 10)
        (line,) = broker.log_lines("database journal behind")
        assert "producers held" in line
    finally:
        _signal_server(server, signal.SIGCONT)
    out, err = producer.communicate(timeout=120)
    assert producer.returncode == 0, err + out
    assert broker.api("/api/queues/durable")["message-count"] == COUNT * 4
    wait_for(lambda: broker.api("/api/broker")["producers-blocked-by"] == [], 10)


def test_a_stop_waits_for_a_stalled_disk_and_a_second_signal_ends_it_at_once(
    system_broker, stalling_disk
):
    """A clean stop writes what storage was given, so on a stalled disk it waits, and
    said nothing while it did; a second SIGINT or SIGTERM was ignored. It now says what
    it waits for, and a second signal ends it at once: what clients were told is stored
    is on disk already, and they send the rest again."""
    command, flag = stalling_disk
    anycast = {"routing-type": "ANYCAST"}
    spec = BrokerSpec(queues={"durable": anycast, "live": anycast}, global_max_size="256MiB")
    broker = system_broker(spec, command=command)
    assert broker.proc is not None
    flag.touch()
    producer = subprocess.Popen(
        [
            *(scow_command(), "perf", "client", "--url", f"{broker.url}/durable", "--json"),
            *("--mode", "send", "--durable", "--max-pending", "0", "--count", str(COUNT)),
            *("--size", str(BODY), "--timeout", "60"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _held_back(broker, "journal "), 30)
        broker.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: broker.log_lines("still stopping"), 20)
        assert broker.proc.poll() is None  # waiting for the disk
        broker.proc.send_signal(signal.SIGINT)
        assert broker.proc.wait(10) == 1
        broker.deliberate = True  # this exit is what the test is for
        (line,) = broker.log_lines("stopping now, without waiting for storage")
        assert "signal=SIGINT" in line
    finally:
        flag.unlink()
        producer.kill()
        producer.wait(10)
    broker.start()  # on what the disk has: a restart serves
    _answers_quickly(broker, non_durable=True)


def test_a_dead_letter_leaves_its_queue_only_once_its_copy_in_pages_is_stored(
    system_broker, stalling_pages
):
    """A message dead-lettered (or expired) into an address that pages went to the page
    writer, while its acknowledgement on the queue it left went to the journal at once.
    The journal does not wait for the page writer, so a crash while the page writer was
    behind (its syncs stalled: records wait in its memory) lost the message from both.
    Now the move is a transaction whose commit record waits until the copy is stored:
    here no copy can be, so after a SIGKILL every message is still in its queue."""
    command, flag = stalling_pages
    anycast = {"routing-type": "ANYCAST"}
    spec = BrokerSpec(
        queues={"work": anycast, "DLA": anycast, "marker": anycast},
        address_settings={"DLA": {"max-size-bytes": "1KiB"}},
        global_max_size="256MiB",
    )
    broker = system_broker(spec, command=command)
    count = 300
    perf_send(broker, "work", count)
    perf_send(broker, "DLA", 20)  # 2 KiB: every dead letter goes to its pages
    assert broker.api("/api/addresses/DLA")["paging"]
    flag.touch()  # from here on no page file is synced
    try:
        rejected = subprocess.run(
            [sys.executable, "-m", "tests.system.poison", "reject", broker.url, "work", str(count)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert json.loads(rejected.stdout) == {"rejected": count}, rejected.stderr
        wait_for(lambda: broker.api("/api/queues/work")["message-count"] == 0, 30)
        # the journal keeps order: once this one is confirmed, what the journal was given
        # for the rejections before it is on disk
        perf_send(broker, "marker", 1)
        broker.kill()
    finally:
        flag.unlink()
    broker.start()
    work, dead = (broker.api(f"/api/queues/{q}")["message-count"] for q in ("work", "DLA"))
    assert work == count, f"{count - work} left 'work', and 'DLA' holds {dead}"


def test_a_transaction_into_pages_commits_only_once_its_pages_are_stored(
    system_broker, stalling_pages
):
    """A pipeline stage takes messages from one address and sends them on to another
    that pages, in one transaction. Its commit record went to the journal while its
    messages still waited for the page writer, so a crash then applied the
    acknowledgements and lost the messages they were turned into: gone from both
    addresses. Now the commit record waits for the pages: after a SIGKILL the
    transaction is undone, every message still where it came from."""
    command, flag = stalling_pages
    anycast = {"routing-type": "ANYCAST"}
    spec = BrokerSpec(
        queues={"in": anycast, "out": anycast, "marker": anycast},
        address_settings={"out": {"max-size-bytes": "1KiB"}},
    )
    broker = system_broker(spec, command=command)
    count, before = 50, 20
    perf_send(broker, "in", count)
    perf_send(broker, "out", before)  # 2 KiB: what the transaction sends goes to pages
    written = lambda: broker.api("/api/addresses/out")["messages-written-to-pages"]  # noqa: E731
    assert broker.api("/api/addresses/out")["paging"]
    paged = written()
    flag.touch()  # from here on no page file is synced
    forward = subprocess.Popen(
        [sys.executable, "-m", "tests.system.forward", broker.url, "in", "out", str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        assert forward.stdout.readline() == "committing\n"
        wait_for(lambda: written() == paged + count, 30)  # the commit is under way
        # the journal keeps order: once this one is confirmed, what the journal was given
        # for the commit before it is on disk
        perf_send(broker, "marker", 1)
        assert forward.poll() is None  # no outcome: the pages are not stored
        broker.kill()
    finally:
        flag.unlink()
        forward.kill()
        forward.wait(10)
    broker.start()
    left, out = (broker.api(f"/api/queues/{q}")["message-count"] for q in ("in", "out"))
    assert (left, out) == (count, before), f"{count - left} left 'in', and 'out' holds {out}"


@pytest.mark.parametrize("sync", [True, False], ids=["large-message-sync", "no-sync"])
def test_a_durable_large_message_is_accepted_once_its_file_is_synced(system_broker, tmp_path, sync):
    """With `large-message-sync` (the default) a durable large message's outcome waits
    for its file's sync, not only for its journal record: here the file's sync hangs,
    and a durable message sent after it, on the same connection, is accepted first.
    Without it the file is left to the operating system and the message is accepted as
    any other."""
    command, flag = _stalling(tmp_path, "/large-messages/")
    anycast = {"routing-type": "ANYCAST"}
    spec = BrokerSpec(
        queues={"big": anycast, "small": anycast},
        global_max_size="256MiB",
        broker={"large-message-sync": sync},
    )
    broker = system_broker(spec, command=command)
    assert broker.data_dir is not None
    large_files = broker.data_dir / "large-messages"
    body = b"L" * MiB  # over min-large-message-size (100 KiB)
    flag.touch()
    try:
        with amqp_client(broker, timeout=30) as conn:
            big = conn.create_sender("big").link.send(Message(body=body, durable=True))
            # its frames all came before this one's: once this is accepted, the large
            # message's file is complete and its record went to the journal with it or
            # before it
            small = conn.create_sender("small").send(Message(body="s", durable=True))
            assert small.remote_state == Delivery.ACCEPTED
            if sync:
                assert big.remote_state != Delivery.ACCEPTED and not big.settled
                assert len(list(large_files.iterdir())) == 1
            else:
                conn.wait(lambda: big.remote_state == Delivery.ACCEPTED, timeout=10)
        if sync:
            broker.kill()
    finally:
        flag.unlink()
    if sync:
        broker.start()
        # its record was journaled beside the sync, and a SIGKILL keeps what the file
        # was given: the unconfirmed message is there, whole, as any unconfirmed send
        # may be
        assert broker.api("/api/queues/small")["message-count"] == 1
        assert broker.api("/api/queues/big")["message-count"] == 1
    with amqp_client(broker) as conn:
        receiver = conn.create_receiver("big")
        assert receiver.receive(timeout=10).body == body
        receiver.accept()
    wait_for(lambda: not list(large_files.iterdir()), 10, what="the file to go")


def test_a_sigkill_while_an_acknowledged_large_messages_file_is_deleted_leaves_neither(
    system_broker, tmp_path
):
    """The file of an acknowledged large message is deleted after its acknowledgement
    is journaled. Here the deletion hangs (its unlink, through the shim), and the broker
    is SIGKILLed meanwhile: the restart neither delivers the message again nor keeps
    its file (no record refers to it: an orphan, removed at start)."""
    command, flag = _stalling(tmp_path, "/no-file-syncs-stall/", unlink="/large-messages/")
    anycast = {"routing-type": "ANYCAST"}
    spec = BrokerSpec(queues={"big": anycast, "marker": anycast}, global_max_size="256MiB")
    broker = system_broker(spec, command=command)
    assert broker.data_dir is not None
    large_files = broker.data_dir / "large-messages"
    with amqp_client(broker) as conn:
        conn.create_sender("big").send(Message(body=b"L" * MiB, durable=True))
    (stored,) = large_files.iterdir()
    flag.touch()
    try:
        with amqp_client(broker) as conn:
            receiver = conn.create_receiver("big")
            assert receiver.receive(timeout=10).body == b"L" * MiB
            receiver.accept()
            # sent after the acknowledgement, and journaled after it: once this is
            # confirmed, so is the acknowledgement
            conn.create_sender("marker").send(Message(body="m", durable=True))
        assert broker.api("/api/queues/big")["messages-acknowledged"] == 1
        assert stored.exists()  # its unlink hangs
        broker.kill()
    finally:
        flag.unlink()
    assert stored.exists()
    broker.start()
    assert broker.api("/api/queues/big")["message-count"] == 0
    assert broker.api("/api/queues/marker")["message-count"] == 1
    assert not stored.exists()
