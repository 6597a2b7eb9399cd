"""The commands that print end quietly when their reader goes away (`scow data print |
head`), as a program killed by SIGPIPE would, while `scow run` ignores SIGPIPE."""

from __future__ import annotations

import subprocess

from scow.core.testing import broker_processes, scow_command

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]


def test_data_print_into_a_closed_pipe_ends_quietly(tmp_path):
    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS)
        sent = subprocess.run(
            [
                scow_command(),
                "perf",
                "client",
                "--url",
                f"{broker.url}/filler",
                "--mode",
                "send",
                "--count",
                "3000",
                "--durable",
                "--warmup",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert broker.stop() == 0
    # `head -n 1` reads one line and exits: every later write meets a closed pipe
    pipeline = subprocess.run(
        f"set -o pipefail; '{scow_command()}' data print --data-dir '{tmp_path / 'data'}' "
        "| head -n 1",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pipeline.stdout.count("\n") == 1, pipeline.stdout
    assert pipeline.stderr == "", pipeline.stderr  # no traceback, no "Exception ignored"
    assert pipeline.returncode == 141  # 128 + SIGPIPE, what shells expect of such a reader
