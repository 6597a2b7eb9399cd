"""`scow data print|export|import|compact` with paged messages (broker stopped)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from proton import Message

from scow.core.testing import broker_processes
from tests.wire.helpers import bulk_send, connected, consume_all, receive, settle_modified

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging"]
PAGE_ALWAYS = {"#": {"max-size-bytes": 0, "page-size-bytes": 5_000}}


def scow(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "scow.core.cli", *args], capture_output=True, text=True, check=True
    )
    return result.stdout


def durable(i: int) -> Message:
    return Message(body=f"{i}:" + "d" * 300, durable=True, properties={"n": i})


def _fill(start) -> None:
    """60 durable paged messages; 10 acknowledged, one with delivery count 1."""
    broker = start(plugins=PLUGINS, address_settings=PAGE_ALWAYS)
    bulk_send(broker.url, "tools", 60, durable)
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("tools", credit=1)
        receive(receiver, 10)
        receiver.receive(timeout=10)
        settle_modified(receiver, failed=True)
        receiver.close()
    assert broker.stop() == 0


def _drain(start) -> list[tuple[int, int]]:
    broker = start(plugins=PLUGINS, address_settings=PAGE_ALWAYS)
    got = [(m.properties["n"], m.delivery_count) for m in consume_all(broker.url, "tools")]
    broker.stop()
    return got


EXPECTED = [(10, 1)] + [(n, 0) for n in range(11, 60)]


def test_print_export_import_and_compact_keep_paged_messages(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    with broker_processes(tmp_path / "a") as start:
        _fill(start)
    data = tmp_path / "a" / "data"
    printed = scow("data", "print", "--data-dir", str(data))
    assert "# pages of 'tools'" in printed
    assert "queue 'tools': 50 durable messages in pages" in printed
    assert "(with its index and summary)" in printed  # closed pages: read past both
    per_page = [int(n) for n in re.findall(r"(\d+) messages, \d+ bytes", printed)]
    assert sum(per_page) == 60  # the messages written (acknowledged or not), not the trailers
    assert "CURSOR_ACK" in printed

    backup = tmp_path / "backup.jsonl"
    scow("data", "export", "--data-dir", str(data), "--output", str(backup))
    assert backup.read_text().count('"paged":true') == 50
    fresh = tmp_path / "b"
    scow("data", "import", "--data-dir", str(fresh / "data"), "--input", str(backup))
    assert list((fresh / "data" / "paging").glob("tools-*/*.page"))  # back in pages
    with broker_processes(fresh) as start:
        assert _drain(start) == EXPECTED

    scow("data", "compact", "--data-dir", str(data))
    with broker_processes(tmp_path / "a") as start:
        assert _drain(start) == EXPECTED
