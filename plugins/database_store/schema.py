"""The database store's tables (SQLAlchemy Core) and the schema version they make.

Journal tables (bindings and messages, same columns) hold one row per journal record,
in the order `seq` gives: an add, an update (replaceable or not), or, for a prepared
transaction, its records, its deletes and the prepare itself (`tx_id` set). A committed
record has no `tx_id`; a delete removes the rows of its id. The page store keeps a
directory of addresses and one row per page and sync (`start` is the row's byte offset
in its page). Streams have a directory too (with each stream's cursors, as JSON) and
one row per record (`segment`: the first sequence number of its segment, the unit of
retention). Large message bodies are rows of their table, one per chunk (id, chunk
number). The node manager table holds the lock row (the holder, the schema version
and the HA state) and, from id 1000 on, one row per HA member's announcement.
"""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa

from scow.plugins.database_store.settings import Tables

#: The version this code writes and reads; a database with a higher one is refused.
SCHEMA_VERSION = 1

# journal row kinds
ADD = 1
UPDATE = 2
UPDATE_REPLACEABLE = 3
DELETE_TX = 4
PREPARE = 5

LOCK_ROW = 1


class Schema:
    """The tables of one broker, named by its `[database]` settings."""

    def __init__(self, tables: Tables) -> None:
        self.metadata = sa.MetaData()
        self.bindings = _journal_table(self.metadata, tables.bindings)
        self.messages = _journal_table(self.metadata, tables.messages)
        self.addresses = sa.Table(
            tables.page_store,
            self.metadata,
            sa.Column("address_id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("address", sa.Text, nullable=False, unique=True),
        )
        self.pages = sa.Table(
            f"{tables.page_store}_DATA",
            self.metadata,
            sa.Column("address_id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("page", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("start", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("data", sa.LargeBinary, nullable=False),
        )
        _stored_as_is(self.pages)
        self.streams = sa.Table(
            tables.streams,
            self.metadata,
            sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("name", sa.Text, nullable=False, unique=True),
            sa.Column("cursors", sa.Text, nullable=False),
        )
        self.stream_records = sa.Table(
            f"{tables.streams}_DATA",
            self.metadata,
            sa.Column("stream_id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("segment", sa.BigInteger, nullable=False),
            sa.Column("enqueued", sa.BigInteger, nullable=False),
            sa.Column("message_id", sa.BigInteger, nullable=False),
            sa.Column("data", sa.LargeBinary, nullable=False),
        )
        self.large_messages = sa.Table(
            tables.large_messages,
            self.metadata,
            sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("chunk", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("data", sa.LargeBinary, nullable=False),
        )
        _stored_as_is(self.large_messages)
        self.node_manager = sa.Table(
            tables.node_manager,
            self.metadata,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("holder_id", sa.Text),
            sa.Column("holder_expiration_time", sa.BigInteger),
            sa.Column("node_id", sa.Text),
            sa.Column("state", sa.Text),
            sa.Column("schema_version", sa.Integer, nullable=False),
        )

    def journal(self, kind: str) -> sa.Table:
        """The table of the "bindings" or "messages" journal."""
        return self.bindings if kind == "bindings" else self.messages


def insert_rows(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert `rows` in one go, inside `conn`'s transaction.

    psycopg's executemany sends a statement per row; a binary COPY sends the batch as one
    stream, several times faster (and without escaping the bytes).
    """
    if conn.dialect.driver != "psycopg" or len(rows) < 2:
        conn.execute(sa.insert(table), rows)
        return
    columns = list(table.columns)
    psycopg_connection: Any = conn.connection.driver_connection
    with (
        psycopg_connection.cursor() as cursor,
        cursor.copy(_copy_statement(conn.dialect, table)) as copy,
    ):
        copy.set_types([_PG_TYPES[type(column.type)] for column in columns])
        names = [column.name for column in columns]
        for row in rows:
            copy.write_row([row[name] for name in names])


_PG_TYPES = {
    sa.BigInteger: "int8",
    sa.SmallInteger: "int2",
    sa.Integer: "int4",
    sa.LargeBinary: "bytea",
    sa.Text: "text",
}


@functools.lru_cache(maxsize=32)
def _copy_statement(dialect: sa.Dialect, table: sa.Table) -> str:
    quote = dialect.identifier_preparer
    columns = ", ".join(quote.quote(column.name) for column in table.columns)
    return f"COPY {quote.format_table(table)} ({columns}) FROM STDIN (FORMAT BINARY)"


def _stored_as_is(table: sa.Table) -> None:
    # PostgreSQL compresses large values by default: pages and bodies of messages seldom
    # shrink much, and compressing costs CPU at every write and read
    sa.event.listen(
        table,
        "after_create",
        sa.DDL("ALTER TABLE %(fullname)s ALTER COLUMN data SET STORAGE EXTERNAL").execute_if(
            dialect="postgresql"
        ),
    )


def _journal_table(metadata: sa.MetaData, name: str) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("id", sa.BigInteger, nullable=False, index=True),
        sa.Column("kind", sa.SmallInteger, nullable=False),
        sa.Column("record_type", sa.SmallInteger, nullable=False),
        sa.Column("tx_id", sa.BigInteger, index=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
