"""TLS listeners with a throwaway CA: proton clients, EXTERNAL, refusals, many connections."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from proton import ConnectionException, Message, SSLDomain
from proton.utils import LinkDetached

from scow.core.testing import wait_for
from scow.protocols.amqp.codec import Described, encode_value
from tests.security.helpers import AMQP_HEADER, client_context, new_ca
from tests.wire.helpers import connected, frame, round_trip


def tls_settings(pki, **extra):
    return {
        "cert-file": str(pki.server_cert),
        "key-file": str(pki.server_key),
        "ca-file": str(pki.ca),
        **extra,
    }


def tls_broker(secured, pki, *, tls=None, **kwargs):
    return secured(
        amqp={"listen-tls": ["127.0.0.1:0"]}, tls=tls_settings(pki, **(tls or {})), **kwargs
    )


def domain(pki, cert=None) -> SSLDomain:
    """proton's client TLS settings: trust the test CA, check the host name."""
    d = SSLDomain(SSLDomain.MODE_CLIENT)
    d.set_trusted_ca_db(str(pki.ca))
    d.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert is not None:
        d.set_credentials(str(cert[0]), str(cert[1]), None)
    return d


def amqps(broker) -> str:
    return f"amqps://localhost:{broker.tls_port}"


def test_tls_listener_serves_proton_clients_with_plain_login(secured, pki):
    broker = tls_broker(
        secured, pki, users={"alice": ("s3cret", [])}, security={"allow-anonymous": False}
    )
    # over TLS, PLAIN needs no allow_insecure_mechs
    round_trip(
        amqps(broker),
        user="alice",
        password="s3cret",
        ssl_domain=domain(pki),
        allowed_mechs="PLAIN",
    )
    round_trip(
        broker.url,
        user="alice",
        password="s3cret",
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )  # the plain listener too


def test_external_login_with_a_client_certificate(secured, pki):
    broker = tls_broker(
        secured,
        pki,
        tls={"need-client-auth": True},
        users={"app-42": ("unused", ["producers"])},
        permissions={"orders.#": {"send": ["producers"], "createAddress": ["producers"]}},
        security={"allow-anonymous": False},
    )
    cert = pki.client("app-42")
    with connected(amqps(broker), ssl_domain=domain(pki, cert), allowed_mechs="EXTERNAL") as conn:
        conn.create_sender("orders.eu").send(Message(body="signed"))
        server = broker.broker.server.protocols["amqp"]
        users = broker.broker.call(lambda: [c.info.user for c in server.connections])
        assert users == ["app-42"]
        with pytest.raises(LinkDetached) as refused:  # the users file's roles apply
            conn.create_sender("billing")
        assert "user 'app-42' lacks permission 'send'" in str(refused.value)
    assert [r["mechanism"] for r in broker.audit() if r["event"] == "login"] == ["EXTERNAL"]


def test_external_is_offered_only_to_clients_with_a_certificate(secured, pki):
    broker = tls_broker(secured, pki, tls={"want-client-auth": True})
    with (
        pytest.raises(ConnectionException),
        connected(amqps(broker), ssl_domain=domain(pki), allowed_mechs="EXTERNAL"),
    ):
        pass
    round_trip(amqps(broker), ssl_domain=domain(pki))  # anonymous, without a certificate


@pytest.mark.parametrize("case", ["wrong-ca", "no-certificate"])
def test_need_client_auth_refuses_a_certificate_from_another_ca_or_none(secured, pki, case):
    broker = tls_broker(secured, pki, tls={"need-client-auth": True})
    cert = pki.client("intruder", signed_by=new_ca("another CA")) if case == "wrong-ca" else None
    with (
        pytest.raises(ConnectionException),
        connected(amqps(broker), ssl_domain=domain(pki, cert), timeout=5),
    ):
        pass
    round_trip(amqps(broker), ssl_domain=domain(pki, pki.client("friend")))


def test_a_client_not_trusting_the_server_certificate_fails(secured, pki):
    broker = tls_broker(secured, pki)
    other = SSLDomain(SSLDomain.MODE_CLIENT)
    other.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)  # system CAs only
    with pytest.raises(ConnectionException), connected(amqps(broker), ssl_domain=other, timeout=5):
        pass


def test_min_version_refuses_older_tls(secured, pki):
    broker = tls_broker(secured, pki, tls={"min-version": "TLSv1.3"})
    old = client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2

    async def handshake(context: ssl.SSLContext) -> None:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", broker.tls_port, ssl=context, server_hostname="localhost"
        )
        writer.close()

    with pytest.raises((ssl.SSLError, ConnectionError)):  # the server resets the handshake
        asyncio.run(handshake(old))
    asyncio.run(handshake(client_context(pki)))


def test_tls_settings_are_checked_at_startup(secured, pki, tmp_path):
    from scow.core.config import ConfigError

    with pytest.raises(ConfigError, match=r"\[tls\] cert-file and key-file are needed"):
        secured(amqp={"listen-tls": ["127.0.0.1:0"]})
    with pytest.raises(ConfigError, match="cert-file"):
        secured(
            amqp={"listen-tls": ["127.0.0.1:0"]},
            tls={"cert-file": str(tmp_path / "nope.pem"), "key-file": str(pki.server_key)},
        )


# --------------------------------------------------------------------------- many connections

OPEN = frame(encode_value(Described(0x10, ["many-tls"])))


async def _hold_connections(port: int, context: ssl.SSLContext, count: int, served) -> int:
    """Open `count` TLS connections at once, each through the AMQP open; hold them all
    until `served()` confirms the broker has every one, then close them."""
    opened = 0
    gate = asyncio.Semaphore(100)  # handshakes in flight from this (single) client thread

    async def one():
        nonlocal opened
        async with gate:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="localhost"
            )
            writer.write(AMQP_HEADER + OPEN)
            got = b""
            while len(got) < 16:  # the broker's header and (the start of) its open
                chunk = await asyncio.wait_for(reader.read(4096), 30)
                assert chunk, "closed by the broker"
                got += chunk
            assert got.startswith(AMQP_HEADER)
        opened += 1
        return writer

    writers = await asyncio.gather(*(one() for _ in range(count)))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: wait_for(served, 30, what="every connection"))
    for writer in writers:
        writer.close()
    return opened


def many_connections(secured, pki, count: int) -> None:
    broker = tls_broker(secured, pki)
    server = broker.broker.server.protocols["amqp"]

    def all_open() -> bool:
        return broker.broker.call(lambda: len(server.connections)) >= count

    opened = asyncio.run(_hold_connections(broker.tls_port, client_context(pki), count, all_open))
    assert opened == count
    wait_for(
        lambda: broker.broker.call(lambda: len(server.connections)) == 0,
        30,
        what="the connections to close",
    )
    round_trip(amqps(broker), ssl_domain=domain(pki))


def test_1000_concurrent_tls_connections_are_served(secured, pki):
    many_connections(secured, pki, 1000)  # about 4 s here


def test_scow_queue_commands_over_tls_need_manage(secured, pki, capsys):
    from scow.core import cli

    broker = tls_broker(
        secured,
        pki,
        users={"ops": ("pw", ["ops"]), "dev": ("pw", ["dev"])},
        permissions={
            "#": {"manage": ["ops"], "createDurableQueue": ["ops"], "createAddress": ["ops"]},
            "temp.#": {"createNonDurableQueue": ["ops", "dev"]},
            "$management": {"manage": ["ops", "dev"]},
        },
        security={"allow-anonymous": False},
    )
    common = ["--url", amqps(broker), "--ca-file", str(pki.ca), "--password", "pw"]
    assert cli.main(["queue", "create", "jobs", *common, "--user", "ops"]) == 0
    assert cli.main(["queue", "list", *common, "--user", "ops"]) == 0
    assert "jobs" in capsys.readouterr().out
    assert cli.main(["queue", "delete", "jobs", *common, "--user", "dev"]) == 1
    assert "lacks permission 'manage' on address 'jobs'" in capsys.readouterr().err
