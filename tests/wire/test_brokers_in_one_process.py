"""Two brokers in one process, each on its own loop thread (`BrokerThread`, as plugin
authors and these tests run them), with clients in other processes.

The engines' reused C buffers were one per process, and proton's calls let the GIL go:
both loops copied their output through the same buffer, so each broker sent its clients
some of the other's bytes. Receivers read bodies of the wrong broker and broke off with
"sequencing error" after about a thousand messages; the Spark tests with two brokers
failed now and then with "malformed frame". The buffers are one set per thread now.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
COUNT = 5_000


def _both(mode: str, brokers: list[tuple[Any, str]]) -> list[dict[str, Any]]:
    """Run a `tests.wire.filled` client per broker at once; their reports."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.wire.filled", mode, broker.url, fill, str(COUNT)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for broker, fill in brokers
    ]
    return [json.loads(proc.communicate(timeout=300)[0]) for proc in procs]


def test_two_brokers_in_one_process_keep_their_clients_bytes_apart(scow_broker):
    brokers = [(scow_broker(), "A"), (scow_broker(), "B")]
    for sent in _both("send", brokers):
        assert sent == {"errors": [], "sent": COUNT, "accepted": COUNT, "other": 0}
    for received in _both("receive", brokers):
        assert received == {"errors": [], "received": COUNT, "wrong": 0}
