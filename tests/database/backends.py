"""Running a test broker on the database store: the config changes it takes."""

from __future__ import annotations

import copy
from typing import Any

import sqlalchemy as sa

from scow.core.testing import DEFAULT_PLUGINS

#: Short lock times so that a restarted broker never waits long for a dead one's lock.
FAST_LOCK = {"jdbc-lock-renew-period": 200, "jdbc-lock-expiration": 3_000}


def on_database(
    kwargs: dict[str, Any], url: str, *, journal: bool = True, page_store: bool = False
) -> dict[str, Any]:
    """`kwargs` for `scow_broker` / `scow_broker_process` with the database store enabled,
    keeping the journal and/or the pages in the database at `url` ("" = SQLite default)."""
    out = dict(kwargs)
    plugins = list(out.get("plugins", DEFAULT_PLUGINS))
    out["plugins"] = [*plugins, "database-store"]
    sections = copy.deepcopy(dict(out.get("sections") or {}))
    sections.setdefault("database", {}).update({"url": url, **FAST_LOCK})
    if journal:
        sections.setdefault("broker", {})["journal"] = "database"
    else:  # the journal the plugins give, now that database-store offers one too
        kept = "file" if "file-journal" in plugins else "memory"
        sections.setdefault("broker", {}).setdefault("journal", kept)
    if page_store and "paging" in plugins:
        sections.setdefault("paging", {})["store"] = "database"
    out["sections"] = sections
    return out


#: What the database says when `refuse_rows` refuses one.
REFUSED = "LARGE_MESSAGES takes no third row of a body"


def refuse_rows(url: str, *, from_chunk: int = 2) -> None:
    """Make the database refuse every row of LARGE_MESSAGES numbered `from_chunk` or more
    (a trigger raising REFUSED): a large message's first rows go in, the next is refused,
    as by a table made read-only mid-message. Deleting rows still works."""
    statements = {
        "sqlite": [
            f'CREATE TRIGGER refuse_rows BEFORE INSERT ON "LARGE_MESSAGES" '
            f"WHEN NEW.chunk >= {from_chunk} BEGIN SELECT RAISE(ABORT, '{REFUSED}'); END"
        ],
        "postgresql": [
            "CREATE FUNCTION refuse_rows() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{REFUSED}'; END $$",
            'CREATE TRIGGER refuse_rows BEFORE INSERT ON "LARGE_MESSAGES" FOR EACH ROW '
            f"WHEN (NEW.chunk >= {from_chunk}) EXECUTE FUNCTION refuse_rows()",
        ],
    }
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements[engine.dialect.name]:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def allow_rows(url: str) -> None:
    """Undo `refuse_rows`: LARGE_MESSAGES takes every row again."""
    engine = sa.create_engine(url)
    on = ' ON "LARGE_MESSAGES"' if engine.dialect.name == "postgresql" else ""
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TRIGGER refuse_rows{on}")
    finally:
        engine.dispose()
