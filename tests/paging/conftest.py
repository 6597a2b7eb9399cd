"""The paging tests run on every page store: the file store and the database store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scow.core.testing import BrokerProcess, BrokerThread, broker_processes
from tests.database.backends import on_database

#: The modules whose brokers are parametrized over the page store backends.
PARAMETRIZED = ("test_paging", "test_paging_durability", "test_page_summaries")
#: Tests of what only page files have (torn tails, summaries read from the files).
FILE_ONLY = (
    "test_torn_page_tail_is_cut_and_every_whole_message_delivered",
    "test_page_summaries_are_on_disk_and_used_after_sigkill",
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (
        metafunc.module.__name__.rsplit(".", 1)[-1] in PARAMETRIZED
        and ({"scow_broker", "scow_broker_process"} & set(metafunc.fixturenames))
        and metafunc.function.__name__ not in FILE_ONLY
    ):
        metafunc.parametrize("page_store", ["file", "database"])


@pytest.fixture
def page_store() -> str:
    """The page store backend the test's brokers use."""
    return "file"


def _on(page_store: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    if page_store == "file":
        return kwargs
    return on_database(kwargs, "", journal=False, page_store=True)


@pytest.fixture
def scow_broker(
    scow_broker: Callable[..., BrokerThread], page_store: str
) -> Callable[..., BrokerThread]:
    return lambda **kwargs: scow_broker(**_on(page_store, kwargs))


@pytest.fixture
def scow_broker_process(tmp_path: Path, page_store: str) -> Iterator[Callable[..., BrokerProcess]]:
    with broker_processes(tmp_path) as start:
        yield lambda **kwargs: start(**_on(page_store, kwargs))
