"""`scow run` in a container with a memory limit, on the packaged default
(`global-max-size = -1`).

Before, the broker derived its global-max-size from the host's physical memory (here
24 GiB, so the 128 MiB cap) whatever its cgroup allowed: in a 192 MiB memory cgroup a
producer's flood of 1 KiB messages took it past the limit and the kernel killed it
(SIGKILL, every non-durable message lost; in 160 MiB at about 115,000 messages). Now it
takes 1/16 of the cgroup's limit, as a JVM sizes its heap by it, and pages the rest.

Needs root and a writable memory cgroup (v1 here, v2 where the memory controller is
delegated); skipped elsewhere, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from scow.core.testing import scow_command
from tests.system.broker import scow_behind
from tests.system.topology import BrokerSpec

MiB = 1 << 20
LIMIT = 192 * MiB  # the broker is about 57 MiB at rest
COUNT, BODY = 150_000, 1024  # 150 MiB of messages: more than the container has
QUEUE = "flood"


def _perf(broker, mode: str) -> dict:
    """`scow perf client` (proton's C engine), in a process of its own."""
    done = subprocess.run(
        [
            *(scow_command(), "perf", "client", "--url", f"{broker.url}/{QUEUE}", "--json"),
            *("--mode", mode, "--count", str(COUNT), "--size", str(BODY), "--timeout", "120"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A new memory cgroup limited to LIMIT bytes (v1 or v2), removed at the end."""
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    if (v1 / "memory.limit_in_bytes").exists():
        group, limit_file = v1 / f"scow-test-{os.getpid()}", "memory.limit_in_bytes"
    elif "memory" in (v2 / "cgroup.subtree_control").read_text().split():
        group, limit_file = v2 / f"scow-test-{os.getpid()}", "memory.max"
    else:
        pytest.skip("no memory cgroup controller to put the broker under")
    try:
        group.mkdir()
        (group / limit_file).write_text(str(LIMIT))
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    yield group
    group.rmdir()  # its processes are gone by then


def test_a_broker_in_a_memory_limited_cgroup_sizes_itself_by_the_limit_and_pages(
    system_broker, memory_cgroup: Path, tmp_path: Path
):
    command = scow_behind(tmp_path / "scow-in-cgroup", f"echo $$ > {memory_cgroup}/cgroup.procs")
    broker = system_broker(BrokerSpec(global_max_size="-1"), command=command)
    try:
        assert broker.api("/api/broker")["global-max-size"] == LIMIT // 16
        (derived,) = broker.log_lines("global-max-size derived")
        assert f"bytes={LIMIT // 16}" in derived and f"memory={LIMIT}" in derived
        _perf(broker, "send")
        assert broker.api(f"/api/queues/{QUEUE}")["message-count"] == COUNT
        assert broker.api("/api/broker")["paging-addresses"] == [QUEUE]
        assert broker.rss_kib() * 1024 < LIMIT
        _perf(broker, "receive")  # every one of them, then the queue is empty
        assert broker.api("/api/broker")["paging-addresses"] == []
    finally:
        broker.kill()  # out of the cgroup before it is removed
