"""A closed page's index (`scow.plugins.paging.index`): the reader gets from it the run
the frame walk gets, field for field, and falls back to the walk whenever the index or
the records do not check out, ending where the walk ends. Pages are real page files,
closed as the pager and the page writer close them (`_closed_page`)."""

from __future__ import annotations

import asyncio
import errno
import struct
from pathlib import Path
from typing import Any

import pytest
from proton import Message

from scow.core.page_frames import HEADER_SIZE, iter_frames
from scow.core.testing import BrokerThread, wait_for_async
from scow.plugins.paging import index as page_index
from scow.plugins.paging import scan
from scow.plugins.paging.cursor import _read_run, _Run
from scow.plugins.paging.index import PageIndex
from scow.plugins.paging.record import DURABLE, HEAD, INDEX, LARGE, SUMMARY, encode, encode_summary
from scow.plugins.paging.store import FilePageStore
from scow.plugins.paging.summary import PageSummary
from scow.plugins.paging.writer import PageWriter
from tests.paging.helpers import FAST_JOURNAL, PAGE_ALWAYS, PLUGINS, restartable_broker
from tests.wire.helpers import bulk_send, connected, consume_all, receive

QUEUE = 7
OTHER = 8
FIELDS = ("offsets", "nexts", "ids", "expirations", "keys", "datas", "txs", "sizes")


def _large(message_id: int, queue_id: int) -> bytes:
    """A large message's record: its file reference, then its head."""
    head = HEAD.pack(message_id, 0, 0, DURABLE | LARGE, 4, 1)
    return head + struct.pack(">QQQQ", queue_id, 77, 5, 1 << 20) + b"head!"


def _mixed() -> list[tuple[bytes, int]]:
    """(record, queue count) of every kind a page holds."""
    records = []
    for i in range(40):
        if i % 7 == 3:
            queues = [OTHER, QUEUE]  # a multicast message
        elif i % 5 == 4:
            queues = [OTHER]
        else:
            queues = [QUEUE]
        tx = 900 + i if i % 11 == 5 else 0
        expiration = 1_700_000_000_000 + i if i % 3 == 0 else 0
        data = b"m%d:" % i + b"x" * (i * 13 % 300)
        records.append(
            (encode(i + 1, expiration, tx, i % 2 == 0, i % 10, queues, data), len(queues))
        )
    records.insert(17, (_large(500, QUEUE), 1))
    return records


def _closed_page(
    store: FilePageStore,
    records: list[tuple[bytes, int]],
    page: int = 1,
    summary: bytes = b"summary",
) -> int:
    """Write `records` to `page` and close it as the pager and the writer do: the index,
    sealed with what the store appended, then the summary. Returns the index's offset."""
    index = PageIndex()
    for number, (data, queues) in enumerate(records):
        if queues > 1:  # the pager notes what the record's head does not hold
            index.routes[number] = data[HEAD.size : HEAD.size + 8 * queues]
        store.append(page, [data])
        index.note([data])
    state = store.appended(page)
    assert state is not None
    sealed = index.seal(*state)
    assert sealed is not None and index.size == len(sealed)
    store.append(page, [sealed, encode_summary(summary)])
    return state[0]


def _fields(run: _Run) -> dict[str, object]:
    return {name: list(getattr(run, name)) for name in FIELDS if name != "txs"} | {
        "txs": dict(run.txs),
        "end": run.end,
        "plain": run.plain,
        "priority": run.priority,
    }


def _path(store: FilePageStore, page: int = 1) -> Path:
    return store.folder / f"{page:09d}.page"


def test_a_closed_page_is_read_through_its_index_as_the_walk_reads_it(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "a")
    at = _closed_page(store, _mixed())
    buf = store.read(1)
    assert page_index.read(buf, at) is not None
    starts = [start for start, _p, _e in iter_frames(buf)]
    # every queue, from the page's start and from records further on, up to the records'
    # end (a page the pager closed) and up to the file's end (a page recovery found)
    for queue_id in (QUEUE, OTHER, 99):
        for offset in (0, starts[1], starts[17], starts[30], at):
            for end in (at, len(buf), starts[25]):
                if offset > end:
                    continue
                indexed = _read_run(store, 1, offset, end, queue_id, at)
                walked = _read_run(store, 1, offset, end, queue_id)
                assert indexed.indexed and not walked.indexed
                assert _fields(indexed) == _fields(walked), (queue_id, offset, end)
    run = _read_run(store, 1, 0, at, QUEUE, at)
    assert run.txs and not run.plain  # the transactions and the large message are there
    assert any(key >> 8 & LARGE for key in run.keys)
    store.close()


def test_a_page_routed_to_one_set_of_queues_takes_every_record(tmp_path: Path) -> None:
    """The common case: every record for the same queues (one queue, or the same
    subscriptions of a multicast address), read with no test per record."""
    store = FilePageStore(tmp_path, "a")
    records = [(encode(i, 0, 0, True, 4, [QUEUE, OTHER], b"y" * 100), 2) for i in range(50)]
    at = _closed_page(store, records)
    for queue_id in (QUEUE, OTHER):
        indexed = _read_run(store, 1, 0, at, queue_id, at)
        assert indexed.indexed
        assert indexed.ids == list(range(50))
        assert indexed.datas == [b"y" * 100] * 50
        assert (indexed.plain, indexed.priority) == (True, 4)
        assert _fields(indexed) == _fields(_read_run(store, 1, 0, at, queue_id))
    store.close()


def test_every_reader_of_pages_passes_over_the_index(tmp_path: Path) -> None:
    """The index is a record with a flag and no queue, before the summary, which stays
    the page's last record."""
    store = FilePageStore(tmp_path, "a")
    at = _closed_page(store, _mixed())
    buf = store.read(1)
    frames = list(iter_frames(buf))
    flags = [HEAD.unpack_from(buf, start)[3] for _f, start, _e in frames]
    assert flags[-2:] == [INDEX, SUMMARY]
    assert frames[-2][0] == at
    assert HEAD.unpack_from(buf, frames[-2][1])[5] == 0  # routed to no queue
    store.close()


def test_a_page_without_an_index_is_walked(tmp_path: Path) -> None:
    """Pages written before indexes (and the page open at a crash) have none."""
    store = FilePageStore(tmp_path, "a")
    for data, _queues in _mixed():
        store.append(1, [data])
    end = store.append(1, [encode_summary(b"summary")])
    run = _read_run(store, 1, 0, end, QUEUE)
    assert not run.indexed and run.end == end
    assert len(run.ids) == sum(1 for data, _q in _mixed() if QUEUE in _queues_of(data))
    store.close()


def _queues_of(data: bytes) -> tuple[int, ...]:
    n = HEAD.unpack_from(data)[5]
    return struct.unpack_from(f">{n}Q", data, HEAD.size)


@pytest.mark.parametrize("cut", [1, 20, 0.5])
def test_a_torn_index_falls_back_to_the_walk(tmp_path: Path, cut: float) -> None:
    """A page cut in the middle of its index (a crash while the page was closed): the
    records before it are read, by the walk, to the same end."""
    store = FilePageStore(tmp_path, "a")
    at = _closed_page(store, _mixed())
    store.close()
    path = _path(store)
    data = path.read_bytes()
    index_size = HEADER_SIZE + struct.unpack_from(">I", data, at)[0]
    keep = at + (int(index_size * cut) if cut < 1 else index_size - cut)
    path.write_bytes(data[:keep])
    again = FilePageStore(tmp_path, "a", repair=False)
    indexed = _read_run(again, 1, 0, keep, QUEUE, at)
    walked = _read_run(again, 1, 0, keep, QUEUE)
    assert not indexed.indexed
    assert _fields(indexed) == _fields(walked)
    assert indexed.end == at  # every record, and nothing of the torn index
    again.close()


def test_a_corrupt_message_falls_back_to_the_walk_and_ends_where_it_ends(tmp_path: Path) -> None:
    """One byte flipped in a message: the region's CRC fails, the walk finds the frame,
    and it and everything after it are lost, as without an index."""
    store = FilePageStore(tmp_path, "a")
    at = _closed_page(store, _mixed())
    store.close()
    path = _path(store)
    data = bytearray(path.read_bytes())
    starts = [start for start, _p, _e in iter_frames(bytes(data))]
    data[starts[21] - 1] ^= 0xFF  # the last byte of the 21st record's message
    path.write_bytes(bytes(data))
    again = FilePageStore(tmp_path, "a", repair=False)
    indexed = _read_run(again, 1, 0, len(data), QUEUE, at)
    walked = _read_run(again, 1, 0, len(data), QUEUE)
    assert not indexed.indexed
    assert _fields(indexed) == _fields(walked)
    assert indexed.end == starts[20] == len(again.read(1))
    again.close()


def test_a_corrupt_index_falls_back_to_the_walk(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "a")
    at = _closed_page(store, _mixed())
    store.close()
    path = _path(store)
    data = bytearray(path.read_bytes())
    data[at + HEADER_SIZE + HEAD.size + 40] ^= 0x01  # inside its columns
    path.write_bytes(bytes(data))
    again = FilePageStore(tmp_path, "a", repair=False)
    indexed = _read_run(again, 1, 0, at, QUEUE, at)
    assert not indexed.indexed
    assert _fields(indexed) == _fields(_read_run(again, 1, 0, at, QUEUE))
    assert indexed.end == at
    again.close()


def test_an_index_is_not_sealed_over_a_page_it_does_not_list(tmp_path: Path) -> None:
    """A page longer or shorter than the records noted (a write the store did not
    make, or one it refused and undid) gets no index (the page is walked); nor does a
    page the store did not write from its first byte (reopened)."""
    store = FilePageStore(tmp_path, "a")
    index = PageIndex()
    kept = encode(1, 0, 0, True, 4, [QUEUE], b"kept")
    store.append(1, [kept])
    index.note([kept])
    index.note([encode(2, 0, 0, True, 4, [QUEUE], b"never written")])
    assert index.seal(*store.appended(1)) is None  # type: ignore[misc]
    assert index.size == 0
    store.close()
    reopened = FilePageStore(tmp_path, "a")
    reopened.append(1, [encode(3, 0, 0, True, 4, [QUEUE], b"more")])
    assert reopened.appended(1) is None
    reopened.close()


class _RefusingStore(FilePageStore):
    """A page store that refuses (EIO) the append holding `refused`."""

    def __init__(self, folder: Path, address: str, refused: bytes) -> None:
        super().__init__(folder, address)
        self.refused = refused
        self.appends = 0

    def append(self, page: int, records: list[bytes]) -> Any:
        self.appends += 1
        if self.refused in records:
            raise OSError(errno.EIO, "Input/output error")
        return super().append(page, records)


def test_a_page_with_a_refused_append_gets_no_index(tmp_path: Path) -> None:
    """Found in review: the pager keys a multi-queue record's route by its count of the
    page's records, the writer notes only what the store took. After a refused append
    (not a full disk: those records are dropped) an index sealed anyway passed both its
    CRCs and handed the next multi-queue record's route to another record: a message for
    one queue went to the other, cut short, after a restart (when recovery finds the
    index). The page is walked instead."""
    records = [
        (encode(1, 0, 0, True, 4, [QUEUE], b"r1 for one"), [QUEUE]),
        (encode(2, 0, 0, True, 4, [QUEUE, OTHER], b"r2 for both, refused"), [QUEUE, OTHER]),
        (encode(3, 0, 0, True, 4, [QUEUE], b"r3 for one"), [QUEUE]),
        (encode(4, 0, 0, True, 4, [QUEUE, OTHER], b"r4 for both"), [QUEUE, OTHER]),
    ]
    store = _RefusingStore(tmp_path, "a", records[1][0])
    index = PageIndex()

    async def write() -> None:
        loop = asyncio.get_running_loop()
        writer = PageWriter(loop, lambda done: loop.call_soon_threadsafe(run_all, done), 0)
        closed = asyncio.Event()
        writer.index_page(store, 1, index)
        try:
            for number, (data, queues) in enumerate(records):  # as AddressPager._write
                if len(queues) > 1:
                    index.routes[number] = data[HEAD.size : HEAD.size + 8 * len(queues)]
                writer.submit(store, 1, data, True, None)
                await wait_for_async(lambda n=number: store.appends > n, what="one append each")
            writer.close_page(store, 1, closed.set)
            await asyncio.wait_for(closed.wait(), 10)
        finally:
            writer.stop()

    def run_all(done: list[Any]) -> None:
        for completion in done:
            completion()

    asyncio.run(write())
    assert index.size == 0  # nothing sealed
    buf = store.read(1)
    assert not any(HEAD.unpack_from(buf, p)[3] & INDEX for _s, p, _e in iter_frames(buf))
    walked = _read_run(store, 1, 0, len(buf), OTHER)
    assert walked.ids == [4] and walked.datas == [b"r4 for both"]


# ------------------------------------------------------------------ brokers


def durable(i: int) -> Message:
    return Message(body=f"{i}:" + "d" * 500, durable=True, properties={"n": i})


def _numbers(messages: list[Message]) -> list[int]:
    return [m.properties["n"] for m in messages]


def _cursor(broker: BrokerThread, queue: str) -> dict[str, Any]:
    return broker.call(lambda: dict(broker.broker.queues[queue].cursor.stats()))  # type: ignore[no-any-return]


def test_closed_pages_are_read_through_their_index_live_and_after_a_restart(
    tmp_path: Path,
) -> None:
    broker = restartable_broker(tmp_path, "first")
    try:
        bulk_send(broker.url, "q", 200, durable)
        with connected(broker.url) as conn:
            assert _numbers(receive(conn.create_receiver("q", credit=10), 100)) == list(range(100))
        live = _cursor(broker, "q")
    finally:
        broker.stop()
    # ~11 pages read: all but the last one or two (still open, or not yet indexed) by index
    assert live["page-reads-indexed"] >= live["page-reads"] - 2 > 5
    broker = restartable_broker(tmp_path, "second")
    try:
        with connected(broker.url) as conn:
            got = _numbers(receive(conn.create_receiver("q", credit=10), 100))
        assert got == list(range(100, 200))
        again = _cursor(broker, "q")
    finally:
        broker.stop()
    # the page open at the stop has no index: every other one is read through its own
    assert again["page-reads-indexed"] >= again["page-reads"] - 1 > 5


def _index_at(page: Path) -> int | None:
    data = page.read_bytes()
    for start, payload, _end in iter_frames(data):
        if HEAD.unpack_from(data, payload)[3] & INDEX:
            return start
    return None


def test_pages_cut_in_the_middle_of_their_index_lose_no_acknowledged_message(
    scow_broker_process: Any, tmp_path: Path
) -> None:
    """A page whose index was being written when the broker was killed: its messages
    are read by the walk, the acknowledged ones stay acknowledged, none is lost."""
    # `other` stays in memory: its durable send goes through the messages journal after
    # the acknowledgements (a paged one is synced to its page and the bindings journal)
    settings = {**PAGE_ALWAYS, "other": {"max-size-bytes": -1}}
    broker = scow_broker_process(plugins=PLUGINS, sections=FAST_JOURNAL, address_settings=settings)
    bulk_send(broker.url, "cut", 200, durable)
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("cut", credit=10)
        assert _numbers(receive(receiver, 30)) == list(range(30))
        receiver.close()  # the broker has the acks once it answers the detach
        # a durable send accepted after them: the journal wrote them before it
        bulk_send(broker.url, "other", 1, durable)
    broker.kill()
    pages = sorted((tmp_path / "data" / "paging").glob("cut-*/*.page"))
    indexed = [(page, at) for page in pages if (at := _index_at(page)) is not None]
    assert len(indexed) >= len(pages) - 1 > 10  # the open page has none
    for page, at in indexed[len(indexed) // 2 :]:  # the later half, cut mid-index
        data = page.read_bytes()
        length = struct.unpack_from(">I", data, at)[0]
        page.write_bytes(data[: at + HEADER_SIZE + length // 2])
    restarted = scow_broker_process(
        plugins=PLUGINS, sections=FAST_JOURNAL, address_settings=settings, port=broker.port
    )
    assert _numbers(consume_all(restarted.url, "cut")) == list(range(30, 200))


@pytest.mark.parametrize("acked_some", [False, True])
def test_a_restart_counts_an_indexed_page_as_the_walk_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, acked_some: bool
) -> None:
    """A restart counts a closed page from its index (`scan.durable_counts`), with no
    Python per record on the common page: what it finds must be what the walk finds."""
    store = FilePageStore(tmp_path, "a")
    summary = PageSummary()
    summary.close()
    _closed_page(store, _mixed(), 1, summary.encode())
    plain = [(encode(100 + i, 0, 0, True, 4, [QUEUE], b"p" * i + b"!"), 1) for i in range(30)]
    _closed_page(store, plain, 2, summary.encode())
    both = [(encode(200 + i, 0, 0, True, 4, [QUEUE, OTHER], b"q" * i + b"!"), 2) for i in range(9)]
    _closed_page(store, both, 3, summary.encode())
    store.append(4, [encode(300, 0, 0, True, 4, [QUEUE], b"open page")])  # no index
    offsets = {page: [f[0] for f in iter_frames(store.read(page))] for page in (1, 2, 3)}
    acked = (
        {(QUEUE, 1): set(offsets[1][2:9]), (QUEUE, 2): {offsets[2][4]}, (OTHER, 3): {offsets[3][0]}}
        if acked_some
        else {}
    )
    committed = {905, 927}  # two of the page's transactions; the third is not
    assert [scan._indexed(store.read(page)) is not None for page in (1, 2, 3, 4)] == [
        True,
        True,
        True,
        False,
    ]
    pages: dict[int, Any] = {}
    got = scan.durable_counts(store, {QUEUE, OTHER}, acked, committed, pages)
    monkeypatch.setattr(scan, "_indexed", lambda buf: None)
    walked: dict[int, Any] = {}
    assert got == scan.durable_counts(store, {QUEUE, OTHER}, acked, committed, walked)
    assert got[0][QUEUE][0] > 40 and got[0][OTHER][0] > 10 and got[1]  # and the large one
    fields = ("records", "size", "visible", "txs", "expires", "index_at", "large", "damaged")
    for page in (1, 2, 3, 4):
        assert {f: getattr(pages[page], f) for f in fields} == {
            f: getattr(walked[page], f) for f in fields
        }, page
        summaries = [info.summary for info in (pages[page], walked[page])]
        assert [x.encode() if x is not None else None for x in summaries] in (
            [summary.encode()] * 2,
            [None, None],  # the open page's
        )
