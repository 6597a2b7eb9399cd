"""The duplicate-id cache: what it keeps, what it pushes out, how ids are keyed."""

from __future__ import annotations

import pytest

from scow.core.duplicates import (
    DuplicateIdCache,
    current_key,
    describe_id,
    id_key,
    key_of,
    split_keys,
)
from scow.core.model import InvalidField


def test_an_id_is_found_until_size_more_are_admitted_then_its_generation_goes_whole():
    cache = DuplicateIdCache(3, journaled=False)
    for key in (b"a", b"b", b"c"):  # the third fills the young generation
        cache.admit(key)
    assert set(cache.young) == {b"a", b"b", b"c"} and not cache.old
    cache.admit(b"d")  # the young generation ages first
    cache.admit(b"e")
    cache.admit(b"f")
    # a is 5 admissions old: still found, as is every id at most `size` admissions old
    assert all(key in cache for key in (b"a", b"c", b"f")) and len(cache) == 6
    cache.admit(b"g")  # d, e, f age: a, b, c go whole
    assert b"d" in cache and b"c" not in cache and len(cache) == 4
    assert set(cache.old) == {b"d", b"e", b"f"} and set(cache.young) == {b"g"}
    assert cache.holds_any([b"x", b"e"]) and not cache.holds_any([b"x", b"a"])


def test_an_id_exactly_size_admissions_old_is_caught_at_every_phase():
    size = 5
    for skew in range(size):  # the generations' boundary anywhere relative to the id
        cache = DuplicateIdCache(size, journaled=False)
        for n in range(skew):
            cache.admit(b"before%d" % n)
        cache.admit(b"id")
        for n in range(size - 1):
            cache.admit(b"after%d" % n)
            assert b"id" in cache
        cache.admit(b"last")  # the id is now exactly `size` admissions old
        assert b"id" in cache, skew
        assert len(cache) <= 2 * size


def test_ids_admitted_alone_form_one_block_per_close_cut_where_the_generation_ages():
    cache = DuplicateIdCache(3)
    assert cache.admit(b"a") is True  # opened the block: a close is due
    assert cache.admit(b"b") is False
    blocks, dead = cache.close()  # each block's keys come back to back, as journaled
    assert [keys for _block, keys in blocks] == [b"ab"] and dead == []
    blocks[0][0].record_id = 20
    cache.admit(b"c")  # fills the young generation
    cache.admit(b"d")  # ages it first: a, b, c are the old one
    blocks, dead = cache.close()
    assert [keys for _block, keys in blocks] == [b"c", b"d"] and dead == []
    blocks[0][0].record_id, blocks[1][0].record_id = 21, 22
    for key in (b"e", b"f", b"g"):  # g ages the young generation: a, b, c go, and 20, 21
        cache.admit(key)
    assert cache.close()[1] == [20, 21]
    # h and i are in a generation dropped before their block was written: not written
    for key in (b"h", b"i", b"j", b"k", b"l", b"m"):
        cache.admit(key)
    blocks, dead = cache.close()
    assert [keys for _block, keys in blocks] == [b"jkl", b"m"] and dead == [22]
    assert cache.close() == ([], [])


def test_a_cache_that_is_not_journaled_writes_nothing():
    cache = DuplicateIdCache(2, journaled=False)
    assert [cache.admit(key) for key in (b"a", b"b", b"c")] == [False] * 3
    assert set(cache.old) == {b"a", b"b"} and set(cache.young) == {b"c"}
    assert cache.unwritten == [] and cache.old_blocks == []
    assert cache.close() == ([], [])


def test_ids_admitted_together_keep_the_newest_that_fit_in_one_generation():
    cache = DuplicateIdCache(3)
    assert cache.kept([b"a", b"b"]) == [b"a", b"b"]
    assert cache.kept([b"a", b"b", b"c", b"d"]) == [b"b", b"c", b"d"]
    assert DuplicateIdCache(0).kept([b"a"]) == []
    assert cache.add_block([b"x"], 1) == []
    assert cache.add_block([b"y"], 0) == []
    assert cache.emptied_by([b"z"]) == []  # fits in the young generation
    assert cache.add_block([b"z"], 3) == [] and set(cache.young) == {b"x", b"y", b"z"}
    assert cache.emptied_by([b"p"]) == []  # ages it, but the old one has no records
    assert cache.add_block([b"p", b"q"], 4) == [] and set(cache.young) == {b"p", b"q"}
    # two do not fit in the young generation: it ages first, and x, y, z go
    assert cache.emptied_by([b"r", b"s"]) == [1, 3]  # y was never journaled
    assert cache.add_block([b"r", b"s"], 5) == [1, 3]
    assert set(cache.old) == {b"p", b"q"} and set(cache.young) == {b"r", b"s"}
    assert cache.clear() == [4, 5] and len(cache) == 0


def test_an_id_admitted_again_moves_to_the_young_generation():
    cache = DuplicateIdCache(3)
    cache.add_block([b"a", b"b"], 10)
    assert cache.add_block([b"c", b"d"], 11) == []  # ages a, b first
    cache.add_block([b"a"], 12)  # recovery: a is in a newer block too
    assert set(cache.old) == {b"b"} and set(cache.young) == {b"c", b"d", b"a"} and len(cache) == 4
    # a is young already: one more id only, which does not fit: b's generation goes
    assert cache.add_block([b"a", b"e"], 13) == [10]
    assert set(cache.old) == {b"c", b"d"} and set(cache.young) == {b"a", b"e"}
    # an import may hold an id twice: it counts once
    assert cache.add_block([b"x", b"x"], 14) == [] and set(cache.young) == {b"a", b"e", b"x"}


def test_replaying_the_blocks_in_order_rebuilds_the_same_generations():
    live = DuplicateIdCache(4)
    records: list[tuple[list[bytes], int]] = []
    record_id = 0

    def write() -> None:
        nonlocal record_id
        for block, keys in live.close()[0]:
            record_id += 1
            block.record_id = record_id
            records.append((split_keys(keys), record_id))

    n = 0
    for step in range(9):
        for _ in range(step % 3 + 1):  # ids on their own, a loop pass's worth
            live.admit(key_of(str(n)))
            n += 1
        write()
        if step % 4 == 3:  # a transaction's block
            keys = [key_of(str(n + i)) for i in range(3)]
            n += 3
            record_id += 1
            live.add_block(keys, record_id)
            records.append((keys, record_id))
    dropped = {r for r in range(1, record_id + 1)} - {
        b.record_id for b in live.young_blocks + live.old_blocks
    }
    replayed = DuplicateIdCache(4)
    for keys, rid in records:
        if rid not in dropped:
            assert replayed.add_block(keys, rid) == []
    assert (list(replayed.young), list(replayed.old)) == (list(live.young), list(live.old))


def test_strings_and_binaries_are_distinct_keys_and_other_types_are_refused():
    assert id_key("a", "q") != id_key(b"a", "q")
    # a key is the id's shortest AMQP encoding (str8/vbin8, str32/vbin32 past 255 bytes)
    assert id_key("a", "q") == b"\xa1\x01a" and id_key(b"a", "q") == b"\xa0\x01a"
    assert id_key(memoryview(b"a"), "q") == b"\xa0\x01a"
    assert id_key("\u00e9" * 128, "q") == b"\xb1\x00\x00\x01\x00" + "\u00e9".encode() * 128
    assert id_key(b"", "q") == b"\xa0\x00"
    assert describe_id(id_key("order-1", "q")) == "'order-1'"
    assert describe_id(id_key(b"\x00\xff", "q")) == "binary 00ff"
    assert describe_id(id_key(b"x" * 300, "q")) == f"binary {'78' * 64}..."
    with pytest.raises(InvalidField, match=r"address 'q'.*_AMQ_DUPL_ID = 7 .*string or binary"):
        id_key(7, "q")


def test_keys_of_earlier_data_dirs_become_the_keys_of_the_same_ids():
    assert current_key(b"\x01order-1") == id_key("order-1", "q")
    assert current_key(b"\x02\x00\xff") == id_key(b"\x00\xff", "q")
    assert current_key(b"\x02") == id_key(b"", "q")
    assert current_key(b"\x02" + b"x" * 300) == id_key(b"x" * 300, "q")
    assert current_key(id_key("s", "q")) == id_key("s", "q")  # current keys stay
    assert describe_id(b"\x01order-1") == "'order-1'"  # as `scow data` shows a journal's


def _encoded(message: object) -> bytes:
    return bytes(message.encode())  # type: ignore[attr-defined]


@pytest.mark.parametrize("speedups", [True, False], ids=["c", "python"])
def test_inspect_reads_the_header_and_the_duplicate_id_of_every_message_shape(speedups):
    from proton import Message as ProtonMessage

    from scow.protocols.amqp.codec import DecodeError
    from scow.protocols.amqp.format import AmqpMessageFormat

    AMQP_FORMAT = AmqpMessageFormat(speedups=speedups)

    # only a body (the perf client's messages): defaults, no id, nothing else read
    assert AMQP_FORMAT.inspect(b"\x00\x53\x75\xa0\x03abc") == (False, 4, 0, None)
    assert AMQP_FORMAT.inspect(b"\x00\x53\x77\xa1\x03abc") == (False, 4, 0, None)
    durable = ProtonMessage(body="x", durable=True, priority=7, ttl=5)
    assert AMQP_FORMAT.inspect(_encoded(durable)) == (True, 7, 5000, None)
    # an id as its key
    with_id = ProtonMessage(body="x", properties={"_AMQ_DUPL_ID": "order-1"})
    assert AMQP_FORMAT.inspect(_encoded(with_id)) == (False, 4, 0, id_key("order-1", "q"))
    both = ProtonMessage(body=b"x", durable=True, properties={"_AMQ_DUPL_ID": b"\x01"})
    assert AMQP_FORMAT.inspect(_encoded(both)) == (True, 4, 0, id_key(b"\x01", "q"))
    # read the long way (past 255 bytes): the same keys; another type: its value
    long_id = ProtonMessage(body="x", properties={"_AMQ_DUPL_ID": "s" * 300})
    assert AMQP_FORMAT.inspect(_encoded(long_id))[3] == id_key("s" * 300, "q")
    number = ProtonMessage(body="x", properties={"_AMQ_DUPL_ID": 7})
    assert AMQP_FORMAT.inspect(_encoded(number))[3] == 7
    # a body that merely contains the name is no id
    assert AMQP_FORMAT.inspect(_encoded(ProtonMessage(body="_AMQ_DUPL_ID")))[3] is None
    with pytest.raises(DecodeError):
        AMQP_FORMAT.inspect(b"\x00")


def test_inspect_reads_ids_of_messages_alike_up_to_the_name_from_the_first_one_s_layout():
    from proton import Message as ProtonMessage

    from scow.protocols.amqp.format import AmqpMessageFormat

    fmt = AmqpMessageFormat(speedups=False)  # the Python's layout cache, of its own

    def inspect(**kwargs: object) -> object:
        found = fmt.inspect(_encoded(ProtonMessage(**kwargs)))[3]
        return None if found is None else describe_id(found)  # type: ignore[arg-type]

    # one layout (the map's size is in it), learnt from the first message, read for the
    # next ones
    assert inspect(body="a", properties={"_AMQ_DUPL_ID": b"\x01\x02"}) == "binary 0102"
    assert inspect(body="b", properties={"_AMQ_DUPL_ID": b"\x03\x04"}) == "binary 0304"
    assert len(fmt._id_layouts) == 1
    # string ids, read by their layout too, or an id after another key
    assert inspect(body="c", properties={"_AMQ_DUPL_ID": "s-1"}) == "'s-1'"
    assert inspect(body="c", properties={"_AMQ_DUPL_ID": "s-2"}) == "'s-2'"
    assert inspect(body="c", properties={"_AMQ_DUPL_ID": "\u00e9"}) == "'\u00e9'"
    assert len(fmt._id_layouts) == 2
    assert inspect(body="d", properties={"k": "v", "_AMQ_DUPL_ID": b"\x04"}) == "binary 04"
    # the name first seen as a value, then as the key; as an annotation's key only; in
    # the body only
    both = {"k": "_AMQ_DUPL_ID", "_AMQ_DUPL_ID": b"\x05"}
    assert inspect(body="e", properties=both) == "binary 05"
    assert inspect(body="f", annotations={"_AMQ_DUPL_ID": b"\x06"}) is None
    assert inspect(body="_AMQ_DUPL_ID") is None
    # a message cut short after the name of a known layout has no id it can trust
    whole = _encoded(ProtonMessage(body="g", properties={"_AMQ_DUPL_ID": b"\x07" * 8}))
    cut = whole[: whole.index(b"_AMQ_DUPL_ID") + 16]
    assert fmt.inspect(whole)[3] == id_key(b"\x07" * 8, "q")
    assert fmt.inspect(cut)[3] is None


def old_ids_record(address: str, keys: list[bytes]) -> bytes:
    """A DUPLICATE_IDS record as written before 2026-11-25: each key after its length."""
    name = address.encode()
    return (
        len(name).to_bytes(2, "big")
        + name
        + b"".join(len(key).to_bytes(4, "big") + key for key in keys)
    )


def test_blocks_and_the_records_of_earlier_data_dirs_are_recovered_in_order(tmp_path):
    from scow.core.storage import DUPLICATE_ID, DUPLICATE_IDS, StorageManager
    from scow.plugins.file_journal.journal import FileJournal
    from scow.plugins.file_journal.plugin import journal_settings

    def storage() -> StorageManager:
        return StorageManager(
            FileJournal(journal_settings(tmp_path, "bindings", {})),
            FileJournal(journal_settings(tmp_path, "messages", {})),
        )

    written = storage()
    written.load()
    # an id as written before blocks: its address's length and name, then its key
    written.messages.append_add(5, DUPLICATE_ID, b"\x00\x01q" + b"\x02old", sync=True)
    # a block as written before keys were encodings
    old = old_ids_record("q", [b"\x02a", b"\x01b" * 300, b"\x02"])
    written.messages.append_add(7, DUPLICATE_IDS, old, sync=True)
    long_key = id_key("b" * 300, "q")
    written.store_duplicate_ids(6, "r", [id_key(b"c", "q")])
    written.store_duplicate_ids(8, "q", [id_key(b"x", "q")])
    written.store_duplicate_ids(9, "q", [id_key(b"d", "q"), long_key], deleting=[8])
    written.stop()
    recovered = storage()
    try:
        found = recovered.load().duplicate_ids
    finally:
        recovered.stop()
    # as journaled: the broker converts the older keys as it rebuilds its caches
    assert [(d.record_id, d.address, d.key) for d in found] == [
        (5, "q", b"\x02old"),
        (6, "r", b"\xa0\x01c"),
        (7, "q", b"\x02a"),
        (7, "q", b"\x01b" * 300),
        (7, "q", b"\x02"),
        (9, "q", b"\xa0\x01d"),
        (9, "q", long_key),
    ]


def test_keys_written_back_to_back_are_split_by_their_own_lengths():
    keys = [id_key("s", "q"), id_key(b"", "q"), id_key(b"x" * 300, "q"), id_key("\u00e9", "q")]
    assert split_keys(b"".join(keys)) == keys
    assert split_keys(b"ab" + keys[0], 2) == [keys[0]]
    with pytest.raises(ValueError, match=r"type code 0x02 at byte 0; expected str8"):
        split_keys(b"\x02old")
    with pytest.raises(ValueError, match=r"key at byte 3 runs past the end"):
        split_keys(keys[0] + keys[2][:-1])
    with pytest.raises(ValueError, match=r"key at byte 0 runs past the end"):
        split_keys(b"\xa0")


def _generation_builds() -> list[type]:
    from scow.core import duplicates

    builds: list[type] = [duplicates.PyIdGenerations]
    try:
        from scow.core._speedups import IdGenerations
    except ImportError:  # not built: the Python runs alone (test_plain_install checks it is)
        pass
    else:
        builds.append(IdGenerations)
    return builds


@pytest.mark.parametrize("base", _generation_builds(), ids=lambda base: base.__module__)
def test_both_builds_of_the_generations_check_and_admit_alike(base):
    class Cache(base):  # type: ignore[misc, valid-type]
        __slots__ = ("slow",)

        def _admit(self, key: bytes) -> bool:
            self.slow.append(key)
            self._add(key)
            return True

    cache = Cache(2, journaled=True)
    cache.slow = []
    assert (cache.size, cache.journaled, cache.open) == (2, True, None)
    assert len(cache.young) == len(cache.old) == len(cache) == 0
    # no open block: the subclass's `_admit` decides
    assert cache.admit(b"a") is True and cache.slow == [b"a"]
    cache.open = bytearray(b"a")
    assert cache.admit_new(b"b") is False and cache.open == b"ab"
    assert list(cache.young) == [b"a", b"b"] and len(cache) == 2
    assert cache.admit_new(b"a") is None and cache.admit_new(b"b") is None  # duplicates
    # the young generation full: `_admit` again
    assert cache.admit(b"c") is True and cache.slow == [b"a", b"c"]
    cache._age_generations()
    assert len(cache.young) == 0 and list(cache.old) == [b"a", b"b", b"c"]
    assert b"a" in cache and b"c" in cache and b"d" not in cache and len(cache) == 3
    assert cache.admit_new(b"c") is None
    # a refused send's admission is withdrawn: from the young generation and the block,
    # whose keys (encodings, each giving its length) are read to find it
    x, d, y = key_of("x"), key_of("d"), key_of("y" * 300)
    cache.open = bytearray(x)
    assert cache.admit_new(d) is False and cache.open == x + d
    cache.withdraw(d)
    assert d not in cache and cache.open == x and len(cache.young) == 0
    cache.open = bytearray(x + d + y)  # not the last of the block (a send within a send)
    cache.withdraw(d)
    assert cache.open == x + y
    cache.withdraw(d)  # no longer there: nothing changes
    assert cache.open == x + y
    assert cache.old.pop(b"b", 0) is None and cache.old.pop(b"b", 0) == 0
    assert list(cache.old) == [b"a", b"c"] and b"b" not in cache
    with pytest.raises(KeyError):
        cache.old.pop(b"b")
    assert "a" not in cache and "a" not in cache.old  # a str is no key, as in a dict
    with pytest.raises(TypeError):
        [] in cache  # noqa: B015  (unhashable, as in a dict)
    # not journaled: no block opens, and the usual admission needs none
    quiet = Cache(2, journaled=False)
    quiet.slow = []
    assert quiet.admit_new(b"a") is False and quiet.open is None and quiet.slow == []


@pytest.mark.parametrize("base", _generation_builds(), ids=lambda base: base.__module__)
def test_the_generations_find_every_id_they_hold_whatever_changed_them(base):
    """The C build keeps each generation in a table of its own (keys packed in order, an
    open-addressing index, removed keys marked): no id it holds may be missed, none it
    dropped found, nor their order changed, through admissions, withdrawals, ageing,
    ids moved out of the old generation, clearing and sizes changed (its index grows)."""
    import random

    class Cache(base):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def _admit(self, key: bytes) -> bool:
            self._add(key)
            return False

    rng = random.Random(18)
    cache = Cache(500)
    cache.open = bytearray()
    young: dict[bytes, None] = {}
    old: dict[bytes, None] = {}
    for step in range(40_000):
        # keys as the AMQP format gives them: vbin8, and vbin32 beyond 255 bytes
        key = key_of(rng.randrange(6_000).to_bytes(2, "big") * rng.choice([1, 2, 200]))
        assert key is not None
        action = rng.random()
        if action < 0.6:
            if len(cache.young) < cache.size:
                held = key in young or key in old
                assert cache.admit_new(key) is (None if held else False), step
                if not held:
                    young[key] = None
        elif action < 0.62:
            cache._age_generations()
            cache.open = bytearray()  # as `_age` begins a block (its ids are distinct)
            old, young = young, {}
        elif action < 0.63 and old:
            moved = rng.choice(list(old))
            assert cache.old.pop(moved) is None  # as add_block moves an id
            cache._add(moved)
            del old[moved]
            young[moved] = None
        elif action < 0.64 and cache.open and len(cache.young) < cache.size:
            if key not in young and key not in old:  # a refused send: admitted, withdrawn
                assert cache.admit_new(key) is False
                cache.withdraw(key)
                assert key not in split_keys(bytes(cache.open))
        elif action < 0.642:
            cache._clear_generations()
            cache.open = bytearray()
            young, old = {}, {}
        elif action < 0.644:
            cache.size = rng.choice([50, 500, 5_000])
        assert (key in cache) == (key in young or key in old), step
        assert len(cache) == len(young) + len(old)
        if step % 1_000 == 0:
            assert list(cache.young) == list(young) and list(cache.old) == list(old), step
    assert list(cache.young) == list(young) and list(cache.old) == list(old)


def test_the_python_builds_run_the_duplicate_tests_alone():
    """SCOW_PURE_PYTHON=1: the Python builds of the hot path, as where no compiler is."""
    import os
    import subprocess
    import sys

    tests = ["tests/unit/test_duplicates.py", "tests/wire/test_duplicate_detection.py"]
    probe = (
        "from scow.core.duplicates import DuplicateIdCache as C; "
        "from scow.protocols.amqp.format import AMQP_FORMAT as F; "
        "print(C.__mro__[1].__module__, type(F.inspect).__name__)"
    )
    env = {**os.environ, "SCOW_PURE_PYTHON": "1"}
    probed = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert probed.stdout.split() == ["scow.core.duplicates", "method"], probed.stderr
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-k",
            "not python_builds",
            *tests,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout[-3000:]
