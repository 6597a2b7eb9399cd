"""What the paging wire tests share: a broker whose every address pages, in small pages."""

from __future__ import annotations

from pathlib import Path

from scow.core.testing import BrokerThread, broker_config, write_config

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging"]
FAST_JOURNAL = {"journal": {"journal-file-size": "1MiB", "journal-buffer-timeout": 500000}}
#: Everything pages, in pages of ~9 messages of 500 bytes; queues stay for the statistics.
PAGE_ALWAYS = {
    "#": {
        "max-size-bytes": 0,
        "page-size-bytes": 5_000,
        "auto-delete-queues": False,
        "auto-delete-addresses": False,
    }
}


def restartable_broker(tmp_path: Path, name: str) -> BrokerThread:
    """A broker paging everything, with its data under `tmp_path / "data"`: another one
    started the same way after it stops finds what it left."""
    config = broker_config(
        tmp_path / "data", plugins=PLUGINS, sections=FAST_JOURNAL, address_settings=PAGE_ALWAYS
    )
    return BrokerThread(write_config(tmp_path / f"{name}.toml", config)).start()
