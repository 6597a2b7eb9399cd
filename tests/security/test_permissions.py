"""Each permission of the security settings, allowed and refused, over real AMQP clients.

Role `user` holds every permission on `p.#` except the one under test, which only role
`granted` holds there; user `with` has both roles, user `without` only `user`. The admin
prepares what each case needs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from proton import Delivery, Message
from proton.reactor import Copy
from proton.utils import BlockingConnection, LinkDetached, SendException

from scow.core.config import PERMISSIONS
from tests.wire.helpers import connected

PASSWORD = "pw"
LOGIN = {"password": PASSWORD, "allowed_mechs": "PLAIN", "allow_insecure_mechs": True}


def permissions_without(permission: str) -> dict[str, dict[str, list[str]]]:
    others = {p: ["user", "admin"] for p in PERMISSIONS if p != permission}
    return {
        "#": {p: ["admin"] for p in PERMISSIONS},
        "p.#": {**others, permission: ["granted", "admin"]},
        # replies to management requests come back on temporary queues
        "temp.#": {p: ["user", "admin"] for p in PERMISSIONS},
        "$management": {"manage": ["user", "admin"]},
    }


def manage(
    conn: BlockingConnection, operation: str, kind: str, name: str, body: Any = None, **props: Any
) -> tuple[int, str]:
    """One $management request; (statusCode, statusDescription)."""
    replies = conn.create_receiver(None, dynamic=True)
    sender = conn.create_sender("$management")
    sender.send(
        Message(
            id=str(uuid.uuid4()),
            reply_to=replies.link.remote_source.address,
            properties={"operation": operation, "type": kind, "name": name, **props},
            body=body,
        )
    )
    reply = replies.receive(timeout=10)
    replies.accept()
    sender.close()
    replies.close()
    return int(reply.properties["statusCode"]), str(reply.properties["statusDescription"])


def expect_ok(status: tuple[int, str]) -> None:
    assert status[0] < 300, status


# Each case: (prepare as admin, act as the user); acting raises or returns a status.
def _prepare_queue(admin: BlockingConnection) -> None:
    expect_ok(manage(admin, "CREATE", "queue", "p.q", {"durable": True, "routing-type": "ANYCAST"}))
    admin.create_sender("p.q").send(Message(body="waiting"))


def _send(conn: BlockingConnection) -> Any:
    conn.create_sender("p.q").send(Message(body="hello"))


def _consume(conn: BlockingConnection) -> Any:
    assert conn.create_receiver("p.q").receive(timeout=10).body == "waiting"


def _browse(conn: BlockingConnection) -> Any:
    assert conn.create_receiver("p.q", options=Copy()).receive(timeout=10).body == "waiting"


def _create_address(conn: BlockingConnection) -> Any:
    conn.create_sender("p.fresh").send(Message(body="creates the address"))


def _delete_address(conn: BlockingConnection) -> Any:
    return manage(conn, "DELETE", "address", "p.gone")


def _create_durable_queue(conn: BlockingConnection) -> Any:
    return manage(conn, "CREATE", "queue", "p.durable", {"durable": True})


def _delete_durable_queue(conn: BlockingConnection) -> Any:
    return manage(conn, "DELETE", "queue", "p.q")


def _create_non_durable_queue(conn: BlockingConnection) -> Any:
    return manage(conn, "CREATE", "queue", "p.temp", {"durable": False})


def _delete_non_durable_queue(conn: BlockingConnection) -> Any:
    return manage(conn, "DELETE", "queue", "p.nd")


def _manage(conn: BlockingConnection) -> Any:
    return manage(conn, "READ", "queue", "p.q")


CASES: dict[
    str, tuple[Callable[[BlockingConnection], Any], Callable[[BlockingConnection], Any]]
] = {
    "send": (_prepare_queue, _send),
    "consume": (_prepare_queue, _consume),
    "browse": (_prepare_queue, _browse),
    "createAddress": (lambda admin: None, _create_address),
    "deleteAddress": (
        lambda admin: expect_ok(manage(admin, "CREATE", "address", "p.gone")),
        _delete_address,
    ),
    "createDurableQueue": (lambda admin: None, _create_durable_queue),
    "deleteDurableQueue": (_prepare_queue, _delete_durable_queue),
    "createNonDurableQueue": (lambda admin: None, _create_non_durable_queue),
    "deleteNonDurableQueue": (
        lambda admin: expect_ok(manage(admin, "CREATE", "queue", "p.nd", {"durable": False})),
        _delete_non_durable_queue,
    ),
    "manage": (_prepare_queue, _manage),
}


def test_every_permission_has_a_case():
    assert set(CASES) == set(PERMISSIONS)


@pytest.fixture
def permission_broker(secured):
    def start(permission: str):
        return secured(
            users={
                "admin": (PASSWORD, ["admin"]),
                "with": (PASSWORD, ["user", "granted"]),
                "without": (PASSWORD, ["user"]),
            },
            permissions=permissions_without(permission),
            security={"allow-anonymous": False},
        )

    return start


@pytest.mark.parametrize("permission", PERMISSIONS)
def test_permission_allowed_for_a_role_that_holds_it(permission_broker, permission):
    broker = permission_broker(permission)
    prepare, act = CASES[permission]
    with connected(broker.url, user="admin", **LOGIN) as admin:
        prepare(admin)
    with connected(broker.url, user="with", **LOGIN) as conn:
        result = act(conn)
        if result is not None:
            expect_ok(result)


@pytest.mark.parametrize("permission", PERMISSIONS)
def test_permission_refused_names_permission_user_and_address(permission_broker, permission):
    broker = permission_broker(permission)
    prepare, act = CASES[permission]
    with connected(broker.url, user="admin", **LOGIN) as admin:
        prepare(admin)
    with connected(broker.url, user="without", **LOGIN) as conn:
        try:
            result = act(conn)
        except LinkDetached as exc:  # a refused attach
            text = str(exc)
            assert "amqp:unauthorized-access" in text
        else:
            assert result is not None, "the action was not refused"
            status, text = result
            assert status == 403, result
    assert f"'{permission}'" in text and "'without'" in text and "'p." in text
    refusals = [r for r in broker.audit() if r["event"] == "refused"]
    assert {"user": "without", "permission": permission} in [
        {"user": r["user"], "permission": r["permission"]} for r in refusals
    ]
    # the connection's refusal cost nobody else anything
    with connected(broker.url, user="with", **LOGIN) as conn:
        conn.create_sender("p.after").send(Message(body="still served"))


def test_most_specific_pattern_wins(secured):
    broker = secured(
        users={"u": (PASSWORD, ["producers"])},
        permissions={
            "orders.#": {"send": ["producers"], "createAddress": ["producers"]},
            "orders.secret": {"consume": ["producers"]},  # more specific: no send here
        },
        security={"allow-anonymous": False},
    )
    with connected(broker.url, user="u", **LOGIN) as conn:
        conn.create_sender("orders.eu").send(Message(body="ok"))
        with pytest.raises(LinkDetached) as refused:
            conn.create_sender("orders.secret")
        assert "lacks permission 'send' on address 'orders.secret'" in str(refused.value)


def test_anonymous_relay_transfer_refused_per_message(secured):
    broker = secured(
        users={"u": (PASSWORD, ["producers"])},
        permissions={
            "open.#": {"send": ["producers"], "createAddress": ["producers"]},
            "closed.#": {"consume": ["producers"]},
        },
        security={"allow-anonymous": False},
    )
    with connected(broker.url, user="u", **LOGIN) as conn:
        relay = conn.create_sender(None)
        relay.send(Message(address="open.a", body="1"))
        with pytest.raises(SendException) as refused:
            relay.send(Message(address="closed.a", body="2"))
        assert refused.value.state == Delivery.REJECTED
        # the same link keeps working for allowed addresses (the refusal is cached)
        relay.send(Message(address="open.a", body="3"))
        with pytest.raises(SendException):
            relay.send(Message(address="closed.a", body="4"))
    # checked once per link and address: one refusal in the audit log for two transfers
    assert [r["address"] for r in broker.audit() if r["event"] == "refused"] == ["closed.a"]
    assert broker.broker.queue_stats("open.a")["message-count"] == 2
    assert broker.broker.queue_stats("closed.a") is None


def test_anonymous_principal_has_the_anonymous_roles(secured):
    broker = secured(
        permissions={"public.#": {"send": ["guests"], "createAddress": ["guests"]}},
        security={"anonymous-roles": ["guests"]},
    )
    with connected(broker.url) as conn:
        conn.create_sender("public.news").send(Message(body="hi"))
        with pytest.raises(LinkDetached) as refused:
            conn.create_sender("private.x")
        assert "user 'anonymous' lacks permission 'send'" in str(refused.value)


def test_without_security_settings_everything_is_allowed(secured):
    broker = secured(users={"u": (PASSWORD, [])})
    assert broker.broker.call(lambda: broker.broker.broker.security.enforcing) is False
    with connected(broker.url, user="u", **LOGIN) as conn:
        expect_ok(manage(conn, "CREATE", "queue", "anything", {"durable": True}))
        conn.create_sender("anything").send(Message(body="x"))


def test_management_actions_are_audited_with_the_user(secured):
    broker = secured(
        users={"admin": (PASSWORD, ["admin"])},
        permissions={"#": {p: ["admin"] for p in PERMISSIONS}},
        security={"allow-anonymous": False},
    )
    with connected(broker.url, user="admin", **LOGIN) as conn:
        expect_ok(manage(conn, "CREATE", "queue", "audited", {"durable": True}))
        expect_ok(manage(conn, "PURGE", "queue", "audited"))
        expect_ok(manage(conn, "DELETE", "queue", "audited"))
    actions = [(r["user"], r["action"]) for r in broker.audit() if r["event"] == "management"]
    assert actions == [
        ("admin", "create queue"),
        ("admin", "purge queue"),
        ("admin", "delete queue"),
    ]


def test_security_settings_are_checked_at_startup(secured):
    from scow.core.app import StartupError

    with pytest.raises(StartupError, match="unknown permission 'sned'; did you mean 'send'"):
        secured(permissions={"orders.#": {"sned": ["producers"]}})
    with pytest.raises(StartupError, match="expected a list of role names"):
        secured(permissions={"orders.#": {"send": "producers"}})


def test_http_api_needs_manage(secured):
    import base64
    import urllib.error
    import urllib.request

    from scow.core.testing import DEFAULT_PLUGINS

    broker = secured(
        plugins=[*DEFAULT_PLUGINS, "management"],
        sections={"management": {"listen": "127.0.0.1:0"}},
        users={"ops": (PASSWORD, ["ops"]), "dev": (PASSWORD, ["dev"])},
        permissions={"#": {"manage": ["ops"], "send": ["dev"]}},
    )
    url = broker.broker.call(lambda: broker.broker.broker.stats()["management"]["url"])

    def get(user: str | None) -> int:
        request = urllib.request.Request(url + "/api/queues")
        if user:
            token = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert get("ops") == 200
    assert get("dev") == 403  # logged in, but without manage
    assert get(None) == 403  # anonymous (loopback) has no roles here
    refused = [r for r in broker.audit() if r["event"] == "refused"]
    assert {(r["user"], r["permission"]) for r in refused} == {
        ("dev", "manage"),
        ("anonymous", "manage"),
    }
