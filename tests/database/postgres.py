"""A private PostgreSQL server for tests: initdb + pg_ctl in a temp dir, an ephemeral port.

Run as root (CI containers), the server runs as the `postgres` OS user, since initdb
refuses root. Each test gets a fresh database (`create_database`).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from scow.core.testing import free_port

USER = "scow"
PASSWORD = "s3cret-pw"


def binaries() -> Path | None:
    """The directory holding initdb and pg_ctl, or None when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None


class PostgresServer:
    """One server; `url(db)` is a SQLAlchemy URL for database `db` (password included)."""

    def __init__(self, directory: Path, bin_dir: Path) -> None:
        self.directory = directory
        self.data = directory / "pgdata"
        self.bin = bin_dir
        self.port = free_port()
        self._names = itertools.count(1)
        self._as_postgres = os.geteuid() == 0

    def _cmd(self, *args: str) -> list[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        return ["runuser", "-u", "postgres", "--", *command] if self._as_postgres else command

    def init(self) -> None:
        pwfile = self.directory / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            self._cmd(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
            ),
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.directory} -c max_connections=200"
        )
        subprocess.run(
            self._cmd(
                "pg_ctl",
                "-D",
                str(self.data),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "-l",
                str(self.directory / "server.log"),
                "start",
            ),
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            self._cmd("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"),
            check=False,
            capture_output=True,
        )

    def url(self, database: str, *, password: bool = True) -> str:
        secret = f":{PASSWORD}" if password else ""
        return f"postgresql+psycopg://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its name."""
        import psycopg  # the database extra; only the PostgreSQL tests need it

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=USER,
            password=PASSWORD,
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name
