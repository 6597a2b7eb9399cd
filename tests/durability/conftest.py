"""The crash and restart tests run on every journal: files, SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scow.core.testing import BrokerProcess, broker_processes
from tests.database.backends import on_database

#: The modules whose brokers are parametrized over the journal backends.
PARAMETRIZED = ("test_crash", "test_restart", "test_duplicate_ids")
#: Tests of what only journal files have (their directory, their settings, `scow data`).
FILE_ONLY = (
    "test_export_then_import_round_trip",
    "test_export_and_import_carry_the_ids",
    "test_an_export_of_an_earlier_version_carries_its_ids",
    "test_compaction_keeps_the_cached_ids_and_nothing_else",
    "test_journal_section_settings_reach_the_journal",
)
JOURNALS = [
    pytest.param("file"),
    pytest.param("sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (
        metafunc.module.__name__.rsplit(".", 1)[-1] in PARAMETRIZED
        and "scow_broker_process" in metafunc.fixturenames
        and metafunc.function.__name__ not in FILE_ONLY
    ):
        metafunc.parametrize("journal", JOURNALS)


@pytest.fixture
def journal() -> str:
    """The journal backend the test's brokers use."""
    return "file"


@pytest.fixture
def scow_broker_process(
    tmp_path: Path, journal: str, request: pytest.FixtureRequest
) -> Iterator[Callable[..., BrokerProcess]]:
    url = {"file": None, "sqlite": ""}.get(journal)
    if journal == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
    with broker_processes(tmp_path) as start:
        if url is None:
            yield start
        else:
            yield lambda **kwargs: start(**on_database(kwargs, url))
