import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scow.core.config import core_sections
from tests.database.postgres import PostgresServer, binaries
from tests.fresh_venv import make_venv
from tests.tmpfs import tmpfs

pytest_plugins = ["scow.core.testing"]

#: Room the suite wants on its file systems before the brokers' disk monitor blocks
#: their producers: what its journals, pages, large messages and Spark checkpoints hold
#: at once, with room to spare.
SUITE_DISK_ROOM = 3 << 30


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop before the first test when the temp dir's or the checkout's file system is
    within SUITE_DISK_ROOM of the default max-disk-usage: the brokers the tests start
    would block every producer there, and each test that sends would time out with
    nothing in its error about the disk."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checked
        return
    limit = next(
        int(setting.default)  # type: ignore[call-overload]
        for section in core_sections()
        if (setting := section.setting("max-disk-usage")) is not None
    )
    for path in (tempfile.gettempdir(), os.getcwd()):
        st = os.statvfs(path)
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        room = free - total * (100 - limit) // 100
        if room < SUITE_DISK_ROOM:
            used = 100 * (total - free) / total
            pytest.exit(
                f"{path}'s file system is {used:.1f}% used ({free >> 20} MiB free): the "
                f"brokers' disk monitor blocks producers past max-disk-usage {limit}%, "
                f"{max(room, 0) >> 20} MiB from here, and the suite needs "
                f"{SUITE_DISK_ROOM >> 20} MiB; free some space first",
                returncode=4,
            )


#: The databases the database store's tests run on; PostgreSQL ones are marked `postgres`.
DATABASES = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server for the session (skips the test when not installed)."""
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, pg_ctl) are not on PATH nor under "
            "/usr/lib/postgresql/*/bin; install Debian's postgresql package"
        )
    # not under pytest's tmp dir: its 0700 parent keeps the postgres user out
    directory = Path(tempfile.mkdtemp(prefix="scow-pg-"))
    server = PostgresServer(directory, bin_dir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A SQLAlchemy URL of a new, empty PostgreSQL database."""
    return postgres_server.url(postgres_server.create_database())


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, to stop and start."""
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    directory = Path(tempfile.mkdtemp(prefix="scow-pg-own-"))
    server = PostgresServer(directory, bin_dir)
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty database: a SQLite file, then a PostgreSQL database."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv (no system site-packages) with Scow installed from this checkout, no
    extras: what a plain `pip install scow` gives a user. Shared by the tests that need it."""
    return make_venv(tmp_path_factory.mktemp("fresh-venv"))


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at tmp_path/fs for disk-full tests (skips where mounting is refused)."""
    with tmpfs(tmp_path / "fs", "1m") as mount:
        yield mount
