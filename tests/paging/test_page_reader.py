"""The cursor's page reader (`_read_run`): one walk of a page that checks each frame and
finds the records of its queue, ending where `FilePageStore.read` ends (a corrupt frame,
a torn append), so reading in that one walk loses no corruption check; and the
references the loop makes of them (`QueueCursor._refs`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from scow.core.message import MessageKind, kind_of
from scow.core.page_frames import frame, iter_frames
from scow.plugins.paging.cursor import QueueCursor, _read_run
from scow.plugins.paging.record import encode, encode_summary
from scow.plugins.paging.store import FilePageStore
from scow.protocols.amqp.format import AmqpMessageFormat

QUEUE = 7
OTHER = 8
FORMAT = AmqpMessageFormat()


def _kinds(flags: int, priority: int) -> MessageKind:
    return kind_of("a", FORMAT, bool(flags & 1), priority)


#: What `QueueCursor._refs` reads of its cursor: the queue and the kinds of messages.
CURSOR = SimpleNamespace(queue=SimpleNamespace(id=QUEUE), _kind=_kinds)


def _read(store: FilePageStore, offset: int = 0, end: int = 1 << 40):  # type: ignore[no-untyped-def]
    return _read_run(store, 1, offset, end, QUEUE)  # type: ignore[arg-type]


def _refs(run):  # type: ignore[no-untyped-def]
    """Every reference of `run`, as the loop makes them when it hands them over."""
    return QueueCursor._refs(CURSOR, run, 0, len(run.offsets))  # type: ignore[arg-type]


def _offsets(store: FilePageStore) -> list[int]:
    return [start for start, _s, _e in iter_frames(store.read(1))]


def test_the_reader_finds_its_queues_records_only(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "a")
    store.append(
        1,
        [
            encode(1, 0, 0, True, 4, [QUEUE], b"one"),
            encode(2, 0, 0, False, 4, [OTHER], b"not ours"),
            encode(3, 5_000, 0, False, 4, [OTHER, QUEUE], b"shared"),
            encode_summary(b"s"),  # shorter than any message's record
        ],
    )
    offsets = _offsets(store)
    run = _read(store)
    refs = _refs(run)
    assert [ref.offset for ref in refs] == list(run.offsets) == [offsets[0], offsets[2]]
    assert [(r.message.id, r.message.data, r.message.expiration) for r in refs] == [
        (1, b"one", 0),
        (3, b"shared", 5_000),
    ]
    assert [r.message.kind.durable for r in refs] == [True, False]
    assert [(r.delivery_count, r.consumer, r.page) for r in refs] == [(0, None, 1)] * 2
    assert list(run.nexts) == [offsets[1], offsets[3]]
    assert list(run.sizes) == [0, 3, 9]
    assert (run.plain, run.priority) == (True, 4)
    assert run.end == len(store.read(1))
    # from the second record on: the first is not read again
    later = _read(store, offsets[1])
    assert [ref.offset for ref in _refs(later)] == [offsets[2]]
    assert [ref.message.data for ref in _refs(later)] == [b"shared"]
    store.close()


def test_references_made_after_the_page_file_was_cut_short_keep_their_bytes(
    tmp_path: Path,
) -> None:
    """The reader reads the page rather than mapping it: a page file cut short by
    something else before the loop makes the references costs nothing (a mapped page
    would have faulted, killing the broker with SIGBUS)."""
    store = FilePageStore(tmp_path, "a")
    store.append(1, [encode(i, 0, 0, True, 4, [QUEUE], b"m%d" % i * 500) for i in range(3)])
    run = _read(store)
    (store.folder / "000000001.page").write_bytes(b"")
    assert [ref.message.data for ref in _refs(run)] == [b"m%d" % i * 500 for i in range(3)]
    store.close()


def test_records_in_a_transaction_or_of_mixed_priorities_are_not_plain(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "a")
    store.append(1, [encode(1, 0, 0, False, 4, [QUEUE], b"a")])
    store.append(1, [encode(2, 0, 99, False, 9, [QUEUE], b"b")])
    run = _read(store)
    assert run.plain is False
    assert run.priority == -1
    assert len(run.offsets) == 2  # both found: the loop looks at them one at a time
    store.close()


def test_the_reader_ends_at_a_corrupt_frame_where_the_store_read_ends(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "a")
    store.append(1, [encode(i, 0, 0, True, 4, [QUEUE], b"x" * 100) for i in range(5)])
    store.close()
    page = store.folder / "000000001.page"
    offsets = [start for start, _s, _e in iter_frames(page.read_bytes())]
    data = bytearray(page.read_bytes())
    data[offsets[3] - 1] ^= 0xFF  # the last byte of the third record's message
    page.write_bytes(bytes(data))
    again = FilePageStore(tmp_path, "a", repair=False)
    run = _read(again)
    assert [ref.message.id for ref in _refs(run)] == [0, 1]
    assert run.end == len(again.read(1)) == offsets[2]
    again.close()


def test_the_reader_leaves_out_a_half_written_append(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "a")
    store.append(1, [encode(1, 0, 0, True, 4, [QUEUE], b"whole")])
    whole = len(store.read(1))
    with open(store.folder / "000000001.page", "ab") as f:  # another writer, mid-append
        f.write(frame(encode(2, 0, 0, True, 4, [QUEUE], b"half written"))[:-4])
    run = _read(store)
    assert [ref.message.id for ref in _refs(run)] == [1]
    assert run.end == whole
    store.close()


def test_the_reader_reads_no_further_than_the_visible_end_it_is_given(tmp_path: Path) -> None:
    store = FilePageStore(tmp_path, "a")
    visible = store.append(1, [encode(1, 0, 0, True, 4, [QUEUE], b"visible")])
    store.append(1, [encode(2, 0, 0, True, 4, [QUEUE], b"not yet visible")])
    run = _read(store, 0, visible)
    assert [ref.message.id for ref in _refs(run)] == [1]
    assert run.end == visible
    assert [ref.message.id for ref in _refs(_read(store))] == [1, 2]
    store.close()


def test_a_store_without_unchecked_reads_is_read_the_same_with_page_offsets(
    tmp_path: Path,
) -> None:
    """A page store of another plugin may not have `read_unchecked`: its `read` is
    walked, with the references' offsets still the page's."""
    store = FilePageStore(tmp_path, "a")
    store.append(
        1, [encode(i, 0, 0, True, 4, [QUEUE, OTHER] if i % 2 else [QUEUE], b"m") for i in range(4)]
    )
    offsets = _offsets(store)
    plain = SimpleNamespace(read=store.read)
    run = _read_run(plain, 1, offsets[1], 1 << 40, QUEUE)  # type: ignore[arg-type]
    assert [ref.offset for ref in _refs(run)] == offsets[1:]
    assert [ref.message.id for ref in _refs(run)] == [1, 2, 3]
    assert [ref.message.data for ref in _refs(run)] == [b"m"] * 3
    assert list(run.nexts) == [*offsets[2:], len(store.read(1))]
    assert run.end == len(store.read(1))
    store.close()
