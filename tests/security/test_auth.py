"""Logins: SASL PLAIN and SCRAM-SHA-256 against the users file, the audit log, `scow user`."""

from __future__ import annotations

import select
import socket
import time

import pytest
from proton import Connection, ConnectionException, Delivery, Message, Transport

from scow.core import cli
from scow.core.security.scram import Credential, ScramClient, ScramError, ScramServer
from scow.core.security.users import UsersFileError, add_user, read_users
from scow.core.testing import wait_for
from scow.protocols.amqp.sasl import SASL_HEADER, sasl_frame
from scow.protocols.amqp.sasl_client import read_frame
from tests.security.helpers import scram_login
from tests.wire.helpers import connected, round_trip

PLAIN = {"allowed_mechs": "PLAIN", "allow_insecure_mechs": True}


def test_plain_login_with_the_right_password_is_audited(secured):
    broker = secured(
        users={"alice": ("s3cret", ["producers"])}, security={"allow-anonymous": False}
    )
    round_trip(broker.url, user="alice", password="s3cret", **PLAIN)
    logins = [r for r in broker.audit() if r["event"] == "login"]
    assert logins and logins[0]["user"] == "alice" and logins[0]["mechanism"] == "PLAIN"
    assert logins[0]["peer"].startswith("127.0.0.1:")


@pytest.mark.parametrize(("user", "password"), [("alice", "hunter2-guess"), ("mallory", "s3cret")])
def test_failed_plain_login_is_refused_audited_and_never_logs_the_password(secured, user, password):
    broker = secured(users={"alice": ("s3cret", [])}, security={"allow-anonymous": False})
    with (
        pytest.raises(ConnectionException) as refused,
        connected(broker.url, user=user, password=password, **PLAIN),
    ):
        pass
    assert "amqp:unauthorized-access" in str(refused.value)
    failed = [r for r in broker.audit() if r["event"] == "login failed"]
    assert failed[0]["user"] == user and failed[0]["peer"].startswith("127.0.0.1:")
    assert password not in broker.audit_path.read_text()
    round_trip(broker.url, user="alice", password="s3cret", **PLAIN)


def test_a_failed_login_is_answered_after_the_delay(secured):
    broker = secured(users={"alice": ("s3cret", [])}, security={"login-failure-delay": 400})
    with socket.create_connection(("127.0.0.1", broker.broker.port), timeout=5) as sock:
        sock.sendall(SASL_HEADER)
        sock.recv(8)
        read_frame(sock)  # mechanisms
        start = time.monotonic()
        sock.sendall(sasl_frame(0x41, [_symbol("PLAIN"), b"\x00alice\x00wrong"]))
        outcome = read_frame(sock)
        waited = time.monotonic() - start
    assert outcome.descriptor == 0x44 and int(outcome.value[0]) == 1  # auth
    assert waited >= 0.35
    # a right password is answered at once
    with socket.create_connection(("127.0.0.1", broker.broker.port), timeout=5) as sock:
        sock.sendall(SASL_HEADER)
        sock.recv(8)
        read_frame(sock)
        start = time.monotonic()
        sock.sendall(sasl_frame(0x41, [_symbol("PLAIN"), b"\x00alice\x00s3cret"]))
        assert int(read_frame(sock).value[0]) == 0
        assert time.monotonic() - start < 0.3


def _symbol(text: str):
    from scow.protocols.amqp.codec import Symbol

    return Symbol(text)


def test_anonymous_is_refused_when_not_allowed(secured):
    broker = secured(users={"alice": ("s3cret", [])}, security={"allow-anonymous": False})
    with pytest.raises(ConnectionException), connected(broker.url, allowed_mechs="ANONYMOUS"):
        pass
    round_trip(broker.url, user="alice", password="s3cret", **PLAIN)


# --------------------------------------------------------------------------- SCRAM


def amqp_over(sock: socket.socket, address: str, body: str) -> int:
    """After SASL, drive proton's own engine (no SASL layer) over `sock`: open, send one
    message to `address` and return its remote disposition."""
    transport = Transport()
    connection = Connection()
    transport.bind(connection)
    connection.open()
    session = connection.session()
    session.open()
    sender = session.sender("scram-sender")
    sender.target.address = address
    sender.open()
    delivery = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if delivery is None and sender.credit > 0:
            delivery = sender.delivery(b"1")
            sender.send(Message(body=body, durable=False).encode())
            sender.advance()
        if delivery is not None and delivery.remote_state:
            return int(delivery.remote_state)
        pending = transport.pending()
        if pending > 0:
            sock.sendall(transport.peek(pending))
            transport.pop(pending)
        if select.select([sock], [], [], 0.05)[0]:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the connection")
            transport.push(data)
    raise AssertionError("no disposition within 10 s")


def test_scram_sha_256_login_then_amqp_on_the_same_socket(secured):
    broker = secured(
        users={"carol": ("pa,ss=word", ["producers"])}, security={"allow-anonymous": False}
    )
    with socket.create_connection(("127.0.0.1", broker.broker.port), timeout=5) as sock:
        assert scram_login(sock, "carol", "pa,ss=word") == 0  # and the server proved itself
        assert amqp_over(sock, "scram.q", "via scram") == Delivery.ACCEPTED
        server = broker.broker.server.protocols["amqp"]
        users = broker.broker.call(lambda: [c.info.user for c in server.connections])
        assert users == ["carol"]
    assert broker.broker.queue_stats("scram.q")["message-count"] == 1
    assert [r["mechanism"] for r in broker.audit() if r["event"] == "login"] == ["SCRAM-SHA-256"]


@pytest.mark.parametrize(("user", "password"), [("carol", "nope"), ("nobody", "nope")])
def test_scram_with_a_wrong_password_or_unknown_user_is_refused(secured, user, password):
    broker = secured(users={"carol": ("right", [])}, security={"allow-anonymous": False})
    with socket.create_connection(("127.0.0.1", broker.broker.port), timeout=5) as sock:
        assert scram_login(sock, user, password) == 1
        wait_for(lambda: sock.recv(1) == b"", what="the broker to close the socket")
    failed = [r for r in broker.audit() if r["event"] == "login failed"]
    assert failed[0]["user"] == user and failed[0]["mechanism"] == "SCRAM-SHA-256"


def test_scram_of_an_unknown_user_looks_like_a_known_one():
    known = Credential.derive("pw", iterations=4096)
    server = ScramServer(lambda name: known if name == "real" else None)
    first = server.first(ScramClient("ghost", "pw").first())
    assert ",s=" in first and first.endswith(",i=4096")  # salt and count, as for a real user
    # and the same decoy salt every time, so probing twice tells nothing either
    again = ScramServer(lambda name: None).first(ScramClient("ghost", "pw").first())
    assert first.split(",")[1] == again.split(",")[1]


def test_scram_server_refuses_a_replayed_nonce():
    credential = Credential.derive("pw", iterations=64)
    client = ScramClient("u", "pw")
    server = ScramServer(lambda name: credential)
    final = client.final(server.first(client.first()))
    other = ScramServer(lambda name: credential)
    other.first(client.first())
    with pytest.raises(ScramError, match="nonce"):
        other.final(final)


# --------------------------------------------------------------------------- users file


def test_users_file_keeps_no_password_and_is_reloaded_while_running(secured):
    broker = secured(users={"alice": ("a", [])}, security={"allow-anonymous": False})
    assert (
        cli.main(
            [
                "user",
                "add",
                "dave",
                "--password",
                "later-added",
                "--role",
                "ops",
                "--users-file",
                str(broker.users),
            ]
        )
        == 0
    )
    assert "later-added" not in broker.users.read_text()
    assert read_users(broker.users)["dave"].roles == {"ops"}
    round_trip(broker.url, user="dave", password="later-added", **PLAIN)
    assert cli.main(["user", "remove", "dave", "--users-file", str(broker.users)]) == 0
    with (
        pytest.raises(ConnectionException),
        connected(broker.url, user="dave", password="later-added", **PLAIN),
    ):
        pass


def test_user_commands(tmp_path, capsys):
    path = tmp_path / "users.toml"
    assert (
        cli.main(
            [
                "user",
                "add",
                "erin",
                "--password",
                "x",
                "--role",
                "a",
                "--role",
                "b",
                "--users-file",
                str(path),
                "--iterations",
                "100",
            ]
        )
        == 0
    )
    assert cli.main(["user", "list", "--users-file", str(path)]) == 0
    assert "erin" in capsys.readouterr().out.splitlines()[-1]
    assert cli.main(["user", "remove", "frank", "--users-file", str(path)]) == 2
    assert "no user 'frank' (users: erin)" in capsys.readouterr().err
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_users_file_with_a_plain_password_is_refused(tmp_path):
    path = tmp_path / "users.toml"
    path.write_text('[users.alice]\npassword = "secret"\n')
    with pytest.raises(UsersFileError, match="a plain password is never accepted"):
        read_users(path)
    with pytest.raises(UsersFileError, match="empty password"):
        add_user(tmp_path / "other.toml", "bob", "")
