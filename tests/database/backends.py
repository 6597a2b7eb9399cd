"""Running a test broker on the database store: the config changes it takes."""

from __future__ import annotations

import copy
from typing import Any

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
