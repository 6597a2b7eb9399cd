"""Selectors over paged messages: page summaries that skip pages, selectors run on bytes.

The wire tests page everything in pages of ~9 messages, so a few hundred messages make
dozens of pages; `pages-skipped` (the cursor's statistic) says a summary was used.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Message, Timeout
from proton.reactor import Copy, Selector

from scow.core.message import Message as StoredMessage
from scow.core.page_frames import iter_frames
from scow.core.selector import SelectorFilter, compile_selector, value_key
from scow.core.testing import wait_for
from scow.plugins.paging.record import HEAD, SUMMARY
from scow.plugins.paging.scan import durable_records
from scow.plugins.paging.store import FilePageStore
from scow.plugins.paging.summary import PageSummary
from scow.protocols.amqp import codec
from scow.protocols.amqp.format import AmqpMessageFormat
from tests.paging.helpers import FAST_JOURNAL, PAGE_ALWAYS, PLUGINS, restartable_broker
from tests.wire.helpers import bulk_send, connected, receive

BLUE = 300  # ~33 pages of blue messages, then a few red ones


def colored(i: int, *, durable: bool = False) -> Message:
    color = "red" if i >= BLUE or i % 100 == 7 else "blue"
    return Message(body=f"{i}:" + "x" * 500, durable=durable, properties={"color": color, "n": i})


RED = [i for i in range(BLUE + 5) if i >= BLUE or i % 100 == 7]


def ns(messages: list[Message]) -> list[int]:
    return [m.properties["n"] for m in messages]


def cursor_stats(broker: Any, queue: str) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        return dict(broker.broker.queues[queue].cursor.stats())

    return broker.call(read)  # type: ignore[no-any-return]


def paged_broker(scow_broker: Any) -> Any:
    return scow_broker(plugins=PLUGINS, address_settings=PAGE_ALWAYS)


def take_matching(broker: Any, queue: str, selector: str, count: int) -> list[int]:
    """What a consumer with `selector` gets (accepting each), then nothing more."""
    with connected(broker.url) as conn:
        receiver = conn.create_receiver(queue, credit=50, options=[Selector(selector)])
        got = ns(receive(receiver, count, accept=True))
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.3)
    return got


def test_selector_skips_pages_and_gets_exactly_the_matching_messages_in_order(scow_broker):
    broker = paged_broker(scow_broker)
    bulk_send(broker.url, "colors", BLUE + 5, colored)
    assert take_matching(broker, "colors", "color = 'red'", len(RED)) == RED
    stats = cursor_stats(broker, "colors")
    assert stats["pages-skipped"] >= 25  # ~33 pages, most without a red message
    with connected(broker.url) as conn:  # the others are all still there, in order
        rest = ns(receive(conn.create_receiver("colors", credit=100), BLUE + 5 - len(RED)))
    assert rest == [i for i in range(BLUE + 5) if i not in RED]


@pytest.mark.parametrize(
    "selector",
    [
        "color IN ('red', 'green')",
        "color = 'red' AND n >= 0",
        "(color = 'red' AND n > 1) OR (color = 'red' AND n <= 1)",
    ],
)
def test_selectors_a_summary_can_use_skip_pages(scow_broker, selector):
    broker = paged_broker(scow_broker)
    bulk_send(broker.url, "colors", BLUE + 5, colored)
    assert take_matching(broker, "colors", selector, len(RED)) == RED
    assert cursor_stats(broker, "colors")["pages-skipped"] >= 25


@pytest.mark.parametrize(
    "selector",
    [
        "color LIKE 'r%'",
        "n >= 300 OR n IN (7, 107, 207)",
        "color = 'red' OR n < 0",
        "NOT color <> 'red'",
        "JMSPriority = 4 AND color = 'red'",
    ],
)
def test_selectors_a_summary_cannot_use_still_get_every_match(scow_broker, selector):
    broker = paged_broker(scow_broker)
    bulk_send(broker.url, "colors", BLUE + 5, colored)
    assert take_matching(broker, "colors", selector, len(RED)) == RED
    if not selector.startswith("JMS"):  # JMSPriority: the color part may still skip
        assert cursor_stats(broker, "colors")["pages-skipped"] == 0


def test_a_property_no_paged_message_has_skips_every_page(scow_broker):
    broker = paged_broker(scow_broker)
    bulk_send(broker.url, "colors", 100, colored)
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("colors", credit=10, options=[Selector("size = 3")])
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.5)
        wait_for(lambda: cursor_stats(broker, "colors")["pages-skipped"] >= 10, what="skips")
        # a match sent now, while the consumer waits, still reaches it
        conn.create_sender("colors").send(Message(body="m", properties={"size": 3, "n": -1}))
        assert ns(receive(receiver, 1, accept=True)) == [-1]


def test_browser_with_a_selector_skips_pages_and_sees_the_matches_once(scow_broker):
    broker = paged_broker(scow_broker)
    bulk_send(broker.url, "colors", BLUE + 5, colored)
    with connected(broker.url) as conn:
        browser = conn.create_receiver(
            "colors", credit=3, name="b", options=[Copy(), Selector("color = 'red'")]
        )
        assert ns(receive(browser, len(RED), accept=False)) == RED
        with pytest.raises(Timeout):
            browser.receive(timeout=0.3)
    assert cursor_stats(broker, "colors")["pages-skipped"] >= 25
    assert broker.queue_stats("colors")["message-count"] == BLUE + 5  # browsing takes none


def test_page_summaries_survive_a_restart(tmp_path):
    broker = restartable_broker(tmp_path, "first")
    try:
        bulk_send(broker.url, "colors", BLUE + 5, lambda i: colored(i, durable=True))
    finally:
        broker.stop()
    broker = restartable_broker(tmp_path, "second")
    try:
        assert take_matching(broker, "colors", "color = 'red'", len(RED)) == RED
        assert cursor_stats(broker, "colors")["pages-skipped"] >= 25
    finally:
        broker.stop()


def _summaries(data_dir) -> dict[int, PageSummary | None]:
    """Each page's summary as recovery finds it (stored, or rebuilt when missing)."""
    (folder,) = (data_dir / "paging").iterdir()
    store = FilePageStore(data_dir / "paging", (folder / "address.txt").read_text(), repair=False)
    pages: dict = {}
    list(durable_records(store, set(), {}, set(), pages, AmqpMessageFormat().properties))
    return {number: info.summary for number, info in pages.items()}


def _stored_summary(data_dir, page: int) -> bool:
    (folder,) = (data_dir / "paging").iterdir()
    data = (folder / f"{page:09d}.page").read_bytes()
    last = None
    for _start, pstart, _end in iter_frames(data):
        last = pstart
    return last is not None and bool(HEAD.unpack_from(data, last)[3] & SUMMARY)


def test_page_summaries_are_on_disk_and_used_after_sigkill(scow_broker_process, tmp_path):
    broker = scow_broker_process(
        plugins=PLUGINS, sections=FAST_JOURNAL, address_settings=PAGE_ALWAYS
    )
    bulk_send(broker.url, "colors", BLUE + 5, lambda i: colored(i, durable=True))
    broker.kill()
    summaries = _summaries(tmp_path / "data")
    pages = sorted(summaries)
    assert len(pages) > 25
    # every closed page has its summary stored; the head page's is rebuilt
    assert all(_stored_summary(tmp_path / "data", page) for page in pages[:-1])
    assert not _stored_summary(tmp_path / "data", pages[-1])
    red = {"color": frozenset({b"sred"})}
    assert all(summaries[page] is not None for page in pages)
    skippable = [page for page in pages if not summaries[page].may_match(red)]  # type: ignore[union-attr]
    assert len(skippable) >= 25
    assert pages[-1] not in skippable  # the last page holds the 5 red ones
    broker = scow_broker_process(
        plugins=PLUGINS, sections=FAST_JOURNAL, address_settings=PAGE_ALWAYS
    )
    assert take_matching(broker, "colors", "color = 'red'", len(RED)) == RED
    with connected(broker.url) as conn:
        rest = ns(receive(conn.create_receiver("colors", credit=100), BLUE + 5 - len(RED)))
    assert rest == [i for i in range(BLUE + 5) if i not in RED]


# ------------------------------------------------------------------ properties


_NAMES = st.sampled_from(["a", "b", "c"])
_VALUES = st.one_of(
    st.sampled_from(["x", "y", "red", ""]),
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, 2.5, -1.0]),
    st.booleans(),
)
_PROPERTIES = st.dictionaries(_NAMES, _VALUES, max_size=3)


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


@st.composite
def _selectors(draw: Any, depth: int = 2) -> str:
    name = draw(_NAMES)
    kind = draw(
        st.sampled_from(
            ["=", "<>", "in", "like", "null", "lt"] + ["and", "or", "not"] * (depth > 0)
        )
    )
    if kind in ("=", "<>"):
        value = draw(_VALUES)
        return f"{name} {kind} {_literal(value)}"
    if kind == "in":
        items = draw(
            st.lists(
                st.one_of(st.sampled_from(["x", "red"]), st.integers(-2, 2)), min_size=1, max_size=3
            )
        )
        return f"{name} IN ({', '.join(_literal(i) for i in items)})"
    if kind == "like":
        return f"{name} LIKE 'r%'"
    if kind == "null":
        return f"{name} IS NULL"
    if kind == "lt":
        return f"{name} < {draw(st.integers(-2, 2))}"
    if kind == "not":
        return f"NOT ({draw(_selectors(depth - 1))})"
    word = "AND" if kind == "and" else "OR"
    return f"({draw(_selectors(depth - 1))}) {word} ({draw(_selectors(depth - 1))})"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(properties=_PROPERTIES, text=_selectors())
def test_selectors_on_encoded_properties_agree_with_the_message_filter(properties, text):
    data = codec.encode_message(b"body", application_properties=properties)
    fmt = AmqpMessageFormat()
    message = StoredMessage(1, data, "a", fmt)
    selector = compile_selector(text)
    assert selector.matches(fmt.properties(data).get) is SelectorFilter(selector)(message)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages=st.lists(_PROPERTIES, max_size=6), text=_selectors())
def test_a_summary_never_skips_a_page_holding_a_match(pages, text):
    selector = compile_selector(text)
    summary = PageSummary()
    for properties in pages:
        summary.add(properties)
    matched = any(selector.matches(properties.get) for properties in pages)
    open_verdict = summary.may_match(selector.requires)
    stored = PageSummary.decode(summary.encode())
    assert stored is not None
    if matched:
        assert open_verdict and stored.may_match(selector.requires), (text, pages)


def test_value_keys_are_equal_where_selector_equality_holds():
    assert value_key(1) == value_key(1.0) == b"n1"
    assert value_key(True) != value_key(1)
    assert value_key("1") != value_key(1)
    assert value_key(float("nan")) is None
    assert value_key(b"red") is None


def test_requirements_of_selectors():
    assert compile_selector("color = 'red'").requires == {"color": frozenset({b"sred"})}
    assert compile_selector("'red' = color AND n IN (1, 2)").requires == {
        "color": frozenset({b"sred"}),
        "n": frozenset({b"n1", b"n2"}),
    }
    assert compile_selector("color = 'red' OR color = 'blue'").requires == {
        "color": frozenset({b"sred", b"sblue"})
    }
    for unusable in ("color LIKE 'r%'", "n > 1", "color = 'red' OR n = 1", "NOT color = 'x'"):
        assert compile_selector(unusable).requires == {}, unusable
