"""The `[database]` section and the settings resolved from it (URL, password, timeouts).

The URL is a SQLAlchemy URL; empty means the SQLite file `scow.db` under `[broker]
data-dir`, and a relative SQLite path is relative to the data dir as well. A
`postgresql://` URL without a driver uses psycopg 3. The password may come from an
environment variable (`password-env`) or a file (`password-file`) so that it never has to
be written in the config file; either one replaces a password in the URL.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scow.core.config import ConfigSection, Setting

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

SECTION = ConfigSection(
    "database",
    (
        Setting(
            "url",
            str,
            "",
            "SQLAlchemy URL of the database; empty means the SQLite file scow.db under "
            "[broker] data-dir. postgresql://user@host:5432/db uses psycopg 3.",
        ),
        Setting(
            "password-env",
            str,
            "",
            "Name of an environment variable holding the database password.",
        ),
        Setting(
            "password-file",
            str,
            "",
            "File whose content (trailing newline removed) is the database password.",
        ),
        Setting("pool-size", int, 5, "Connections kept open to the database.", minimum=1),
        Setting(
            "jdbc-network-timeout",
            int,
            20_000,
            "Milliseconds a connection attempt or an unanswered request may take before "
            "the database counts as lost. A large message's body is retried that long on "
            "a lost database, then refused to its producer (amqp:resource-limit-exceeded, "
            "a STOMP ERROR) and its rows deleted once the database is back; records and "
            "pages wait for it.",
            kind="duration-ms",
            minimum=1,
        ),
        Setting(
            "jdbc-lock-renew-period",
            int,
            2_000,
            "Milliseconds between renewals of this broker's lock row.",
            kind="duration-ms",
            minimum=1,
        ),
        Setting(
            "jdbc-lock-expiration",
            int,
            20_000,
            "Milliseconds a lock row stays held without renewal; another broker may take "
            "it after that.",
            kind="duration-ms",
            minimum=1,
        ),
        Setting(
            "jdbc-max-page-size-bytes",
            int,
            102_400,
            "Caps page-size-bytes for addresses paged into the database (one row per "
            "page and sync).",
            kind="size",
            minimum=1024,
        ),
        Setting("bindings-table-name", str, "BINDINGS", "Table of the bindings journal."),
        Setting("message-table-name", str, "MESSAGES", "Table of the message journal."),
        Setting(
            "page-store-table-name",
            str,
            "PAGE_STORE",
            "Table listing paged addresses; their pages go to <name>_DATA.",
        ),
        Setting(
            "stream-table-name",
            str,
            "STREAMS",
            "Table listing stream queues and their cursors; their records go to <name>_DATA.",
        ),
        Setting(
            "large-message-table-name",
            str,
            "LARGE_MESSAGES",
            "Table of large messages' bodies, in rows of 1 MiB (with [broker] journal = "
            '"database").',
        ),
        Setting(
            "node-manager-store-table-name",
            str,
            "NODE_MANAGER_STORE",
            "Table holding the lock row (one broker per database, its schema version and HA "
            "state) and the HA members' announcements.",
        ),
    ),
    "The database store (plugin database-store): journal, pages and streams in a SQL database.",
)

DEFAULT_SQLITE_FILE = "scow.db"
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,50}")


class DatabaseError(Exception):
    """The database cannot be used; the message names the URL (password masked) and why."""


@dataclass(frozen=True)
class Tables:
    """The table names one broker uses."""

    bindings: str = "BINDINGS"
    messages: str = "MESSAGES"
    page_store: str = "PAGE_STORE"
    streams: str = "STREAMS"
    large_messages: str = "LARGE_MESSAGES"
    node_manager: str = "NODE_MANAGER_STORE"


@dataclass(frozen=True)
class DatabaseSettings:
    """Everything needed to open the database, resolved and checked."""

    url: URL
    tables: Tables
    pool_size: int
    network_timeout_ms: int
    lock_renew_ms: int
    lock_expiration_ms: int
    max_page_size: int
    #: The broker's data dir: one broker (data dir) per database and tables.
    data_dir: Path

    @property
    def masked_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    @property
    def key(self) -> tuple[str, Tables, str]:
        """What identifies one broker's use of one database."""
        return (self.url.render_as_string(hide_password=False), self.tables, str(self.data_dir))


def mask(url: str) -> str:
    """`url` with any password replaced by ***, even when it does not parse."""
    user = r"(//[^:/@]*:)" if "//" in url else r"^([^:/@]*:)"
    return re.sub(user + r"[^@]*@", r"\1***@", url, count=1)


def resolve(section: Mapping[str, Any], data_dir: Path) -> DatabaseSettings:
    """DatabaseSettings from the validated `[database]` values; DatabaseError if unusable."""
    values = {s.name: s.default for s in SECTION.settings} | dict(section)
    text = str(values["url"]) or f"sqlite:///{DEFAULT_SQLITE_FILE}"
    try:  # an extra: the plugin itself loads without it, so `scow` works on a base install
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
    except ImportError as exc:
        raise DatabaseError(
            f"[database] url = {mask(text)!r}: the database store needs SQLAlchemy "
            f"({exc}); install it with pip install 'scow[database]'"
        ) from None
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise DatabaseError(
            f"[database] url = {mask(text)!r}: not a SQLAlchemy URL ({exc}); expected e.g. "
            "sqlite:///scow.db or postgresql://user@host:5432/db"
        ) from None
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database)
        if not path.is_absolute():
            path = data_dir / path
        url = url.set(database=str(path))
    password = _password(values, url)
    if password is not None:
        url = url.set(password=password)
    tables = Tables(
        bindings=_table(values, "bindings-table-name"),
        messages=_table(values, "message-table-name"),
        page_store=_table(values, "page-store-table-name"),
        streams=_table(values, "stream-table-name"),
        large_messages=_table(values, "large-message-table-name"),
        node_manager=_table(values, "node-manager-store-table-name"),
    )
    if values["jdbc-lock-renew-period"] >= values["jdbc-lock-expiration"]:
        raise DatabaseError(
            f"[database] jdbc-lock-renew-period = {values['jdbc-lock-renew-period']} must be "
            f"below jdbc-lock-expiration = {values['jdbc-lock-expiration']}"
        )
    return DatabaseSettings(
        url=url,
        tables=tables,
        pool_size=int(values["pool-size"]),
        network_timeout_ms=int(values["jdbc-network-timeout"]),
        lock_renew_ms=int(values["jdbc-lock-renew-period"]),
        lock_expiration_ms=int(values["jdbc-lock-expiration"]),
        max_page_size=int(values["jdbc-max-page-size-bytes"]),
        data_dir=Path(data_dir),
    )


def _table(values: Mapping[str, Any], key: str) -> str:
    name = str(values[key])
    if not _TABLE_NAME.fullmatch(name):
        raise DatabaseError(
            f"[database] {key} = {name!r}: expected a table name of letters, digits and "
            "underscores (not starting with a digit, at most 51 characters)"
        )
    return name


def _password(values: Mapping[str, Any], url: URL) -> str | None:
    env, file = str(values["password-env"]), str(values["password-file"])
    where = url.render_as_string(hide_password=True)
    if env and file:
        raise DatabaseError(
            f"[database] url = {where!r}: set password-env or password-file, not both"
        )
    if env:
        password = os.environ.get(env)
        if password is None:
            raise DatabaseError(
                f"[database] url = {where!r}: password-env = {env!r} but the environment "
                "has no such variable"
            )
        return password
    if file:
        try:
            return Path(file).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise DatabaseError(
                f"[database] url = {where!r}: password-file = {file!r} cannot be read "
                f"({exc.strerror or exc})"
            ) from None
    return None
