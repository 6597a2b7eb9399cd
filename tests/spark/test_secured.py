"""The connector's client against a broker that wants a login, over TLS and plain."""

from __future__ import annotations

from pathlib import Path

import pytest

from scow.core.testing import BrokerThread, broker_config, wait_for, write_config
from scow.plugins.spark.client import Client, ClientError, Endpoint
from scow.protocols.amqp.codec import encode_message
from tests.security.helpers import make_pki, users_file
from tests.spark.conftest import PLUGINS, stream


@pytest.fixture
def secured_broker(tmp_path: Path):
    pki = make_pki(tmp_path / "pki")
    users = users_file(tmp_path / "users.toml", {"alice": ("s3cret", ["admin"])})
    sections = {
        "queues": {"s": stream()},
        "broker": {"log-level": "warning"},
        "security": {"users-file": str(users), "allow-anonymous": False, "login-failure-delay": 0},
        "amqp": {"listen-tls": ["127.0.0.1:0"]},
        "tls": {"cert-file": str(pki.server_cert), "key-file": str(pki.server_key)},
    }
    config = broker_config(tmp_path / "data", plugins=PLUGINS, sections=sections)
    broker = BrokerThread(write_config(tmp_path / "scow.toml", config)).start()
    tls_port = int(broker.server.protocols["amqp"].bound_tls[0][1])  # type: ignore[union-attr]
    yield broker, pki, tls_port
    broker.stop()


def test_client_logs_in_with_plain_over_tls_and_reads(secured_broker):
    _broker, pki, tls_port = secured_broker
    endpoint = Endpoint.parse(
        f"amqps://localhost:{tls_port}", username="alice", password="s3cret", ca_file=str(pki.ca)
    )
    client = Client(endpoint)
    client.send("s", [encode_message(f"m{i}", durable=True) for i in range(5)])
    wait_for(lambda: client.call("stream", "s", "READ")["next-sequence"] >= 5)
    assert sum(len(b) for b in client.read("s", 0, 5)) == 5
    client.close()


def test_client_refusals_are_clear(secured_broker):
    broker, _pki, tls_port = secured_broker
    with pytest.raises(ClientError, match="login of user 'alice' refused"):
        Client(Endpoint.parse(broker.url, username="alice", password="wrong"))
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):  # an unknown CA
        Client(Endpoint.parse(f"amqps://localhost:{tls_port}", username="alice", password="s3cret"))


def test_data_source_options_carry_login_and_tls_files_to_the_client(secured_broker, tmp_path):
    pytest.importorskip("pyspark")
    from scow.plugins.spark.source import Options, pooled

    _broker, pki, tls_port = secured_broker
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    options = Options.parse(
        {
            "URL": f"amqps://localhost:{tls_port}",  # option names are case-insensitive
            "username": "alice",
            "passwordFile": str(secret),
            "caFile": str(pki.ca),
            "queues": "s",
        }
    )
    assert options.endpoints[0].password is None  # read where the connection is made
    client = pooled(options)
    assert pooled(options) is client  # one connection per worker
    assert client.call("stream", "s", "READ")["first-sequence"] == 0
    client.close()
