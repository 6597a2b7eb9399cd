"""`scow run` on IPv6: listeners on `[::1]`, clients over IPv6, and every address the
broker writes usable as written.

Before, an IPv6 host was written without brackets: `amqp listening on=['::1:5672']` in
the log, `http://::1:8161` as the management API's URL, and `amqp://::1:5672` as the URL
an HA member announces to its peer, which hands it to clients to fail over to: no client
can parse it.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection

from scow.core.testing import broker_config, free_port, wait_for, write_config
from tests.system.broker import SystemBroker
from tests.system.topology import PLUGINS


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")


def test_scow_run_on_ipv6_serves_clients_there_and_writes_its_addresses_as_urls(
    tmp_path: Path,
) -> None:
    port, http_port = free_port(), free_port()
    tables = broker_config(
        tmp_path / "data",
        plugins=PLUGINS,
        sections={
            # IPv4 too, for the harness's wait; the first listener is the announced one
            "amqp": {"listen": [f"[::1]:{port}", f"127.0.0.1:{port}"]},
            "management": {"listen": f"[::1]:{http_port}"},
            "ha": {"policy": "primary"},
        },
    )
    broker = SystemBroker(write_config(tmp_path / "scow.toml", tables), port, tmp_path / "log")
    try:
        broker.start()
        wait_for(lambda: broker.log_lines("management listening"), 30, 0.05, "the API")
        (listening,) = broker.log_lines("amqp listening")
        assert f"on=['[::1]:{port}', '127.0.0.1:{port}']" in listening
        (management,) = broker.log_lines("management listening")
        assert f"url=http://[::1]:{http_port}" in management

        url = f"amqp://[::1]:{port}"
        conn = BlockingConnection(url, timeout=10)
        try:
            conn.create_sender("v6").send(Message(body="over IPv6", durable=True))
            with urllib.request.urlopen(f"http://[::1]:{http_port}/api/broker") as response:
                figures = json.load(response)
            with urllib.request.urlopen(f"http://[::1]:{http_port}/api/connections") as response:
                (connection,) = json.load(response)
            receiver = conn.create_receiver("v6")
            assert receiver.receive(timeout=10).body == "over IPv6"
            receiver.accept()
        finally:
            conn.close()
        assert figures["ha"]["url"] == url  # what a backup's clients would fail over to
        assert connection["remote"].startswith("[::1]:"), connection
    finally:
        broker.kill()
