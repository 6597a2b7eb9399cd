"""`pip install scow` (no extras), then `scow run` with the packaged config: it serves."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
import urllib.request

from proton import Message

from scow.core.testing import BrokerProcess, amqp_client, free_port, wait_for
from tests.fresh_venv import ROOT

#: The version pyproject.toml gives the package.
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _packaged_config_on(tmp_path, amqp_port: int, http_port: int):
    """The packaged config as shipped, but on free ports and a data dir of the test's."""
    text = (ROOT / "config" / "scow.toml").read_text()
    text, data = re.subn(r"(?m)^data-dir = .*$", f'data-dir = "{tmp_path / "data"}"', text)
    text, amqp = re.subn(
        r'(?m)^listen = \["localhost:5672"\]$', f'listen = ["127.0.0.1:{amqp_port}"]', text
    )
    text, http = re.subn(
        r'(?m)^# listen = "localhost:8161"$', f'listen = "127.0.0.1:{http_port}"', text
    )
    assert (data, amqp, http) == (1, 1, 1), "the packaged config changed: update this test"
    path = tmp_path / "scow.toml"
    path.write_text(text)
    return path


def test_plain_install_runs_the_packaged_config_with_management(fresh_venv, tmp_path):
    amqp_port, http_port = free_port(), free_port()
    broker = BrokerProcess(
        _packaged_config_on(tmp_path, amqp_port, http_port),
        amqp_port,
        tmp_path / "broker.log",
        command=str(fresh_venv / "bin" / "scow"),
    ).start()
    try:
        with amqp_client(broker) as conn:
            conn.create_sender("orders").send(Message(body="hello", durable=True))
            receiver = conn.create_receiver("orders")
            assert receiver.receive(timeout=10).body == "hello"
            receiver.accept()

        def broker_api() -> dict | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/broker") as r:
                    return json.load(r)
            except OSError:
                return None

        assert wait_for(broker_api, timeout=10, what="the management API")["version"] == VERSION
    finally:
        assert broker.stop() == 0, (tmp_path / "broker.log").read_text()
    # which broker ran is the log's first line; `scow --version` says it too
    first = (tmp_path / "broker.log").read_text().splitlines()[0]
    assert "scow starting" in first and f"version={VERSION}" in first, first
    printed = subprocess.run(
        [fresh_venv / "bin" / "scow", "--version"], capture_output=True, text=True, timeout=60
    )
    assert printed.returncode == 0 and printed.stdout.startswith(f"scow {VERSION} (Python 3.")
    # the hot path's C builds were compiled (`ext-modules`: optional, so a failed build
    # would otherwise go unseen, leaving only the slower Python)
    built = subprocess.run(
        [
            fresh_venv / "bin" / "python",
            "-c",
            "import scow.core._speedups as c, scow.protocols.amqp._speedups as a; "
            "print(c.__file__, a.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert built.returncode == 0, built.stderr
    assert all(path.startswith(str(fresh_venv)) for path in built.stdout.split()), built.stdout
