"""The management HTTP API and /metrics over real HTTP, against a broker holding messages."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from proton import Message
from proton.utils import ConnectionClosed, SendException

from scow.core.testing import (
    DEFAULT_PLUGINS,
    BrokerThread,
    broker_config,
    wait_for,
    write_config,
)
from tests.security.helpers import users_file
from tests.wire.helpers import connected, receive, send

AUTH = {"admin": ("secret", ["admins"])}
CREDENTIALS = {"user": "admin", "password": "secret", "allow_insecure_mechs": True}


@pytest.fixture
def managed(scow_broker, tmp_path):
    users = users_file(tmp_path / "users.toml", AUTH)
    broker = scow_broker(
        plugins=[*DEFAULT_PLUGINS, "management"],
        sections={
            "management": {"listen": "127.0.0.1:0"},
            "security": {"users-file": str(users), "allow-anonymous": False},
        },
    )
    broker.http = broker.call(lambda: broker.broker.stats()["management"]["url"])
    return broker


def http(broker, method: str, path: str, body: Any = None, *, auth: bool = True):
    """(status, parsed JSON or text) of one request."""
    request = urllib.request.Request(broker.http + path, method=method)
    if auth:
        token = base64.b64encode(b"admin:secret").decode()
        request.add_header("Authorization", f"Basic {token}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, data, timeout=10) as response:
            status, raw, kind = response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers["Content-Type"]
    if kind and kind.startswith("application/json"):
        return status, json.loads(raw)
    return status, raw.decode()


def test_an_unauthenticated_request_is_refused(managed):
    status, body = http(managed, "GET", "/api/queues", auth=False)
    assert status == 401 and "authentication required" in body["error"]


def test_queues_and_addresses_report_what_was_sent(managed):
    with connected(managed.url, **CREDENTIALS) as conn:
        send(conn, "orders", *(Message(body=f"o{i}") for i in range(30)))
    status, queues = http(managed, "GET", "/api/queues")
    assert status == 200
    (orders,) = [q for q in queues if q["name"] == "orders"]
    assert orders["message-count"] == 30 and orders["messages-added"] == 30
    assert orders["queue-type"] == "standard" and orders["routing-type"] == "ANYCAST"
    status, address = http(managed, "GET", "/api/addresses/orders")
    assert status == 200 and address["messages-in-memory"] == 30
    assert address["settings"]["address-full-policy"] == "PAGE"
    status, broker = http(managed, "GET", "/api/broker")
    assert status == 200 and broker["messages-in-memory"] == 30 and broker["queues"] >= 1
    assert http(managed, "GET", "/api/queues/nope")[0] == 404


def test_create_purge_and_delete_a_queue(managed):
    status, created = http(
        managed, "POST", "/api/queues",
        {"name": "jobs", "routing-type": "ANYCAST", "arguments": {"qpid.priorities": 10}},
    )  # fmt: skip
    assert status == 201 and created["queue-type"] == "priority"
    status, refused = http(managed, "POST", "/api/queues", {"name": "jobs"})
    assert status == 409 and "already exists" in refused["error"]
    status, bad = http(managed, "POST", "/api/queues", ["not", "an", "object"])
    assert status == 400 and "expected a JSON object" in bad["error"]
    status, bad = http(managed, "POST", "/api/queues", {"name": "x", "arguments": {"a": 1}})
    assert status == 400 and "unknown argument 'a'" in bad["error"]
    with connected(managed.url, **CREDENTIALS) as conn:
        send(conn, "jobs", *(Message(body=f"j{i}") for i in range(5)))
    status, purged = http(managed, "POST", "/api/queues/jobs/purge")
    assert status == 200 and purged == {"purged": 5}
    assert http(managed, "GET", "/api/queues/jobs")[1]["message-count"] == 0
    assert http(managed, "DELETE", "/api/queues/jobs")[0] == 204
    assert http(managed, "GET", "/api/queues/jobs")[0] == 404


def test_connections_are_listed(managed):
    with connected(managed.url, container_id="lister", **CREDENTIALS):
        status, connections = http(managed, "GET", "/api/connections")
    assert status == 200
    assert [c["container-id"] for c in connections] == ["lister"]
    assert connections[0]["protocol"] == "amqp"


def test_metrics_use_artemis_names_and_match_what_was_sent_and_consumed(managed):
    with connected(managed.url, **CREDENTIALS) as conn:
        send(conn, "metered", *(Message(body=f"m{i}") for i in range(12)))
        receive(conn.create_receiver("metered"), 5)
    status, text = http(managed, "GET", "/metrics")
    assert status == 200
    lines = text.splitlines()
    labels = '{address="metered",queue="metered"}'
    assert f"artemis_message_count{labels} 7.0" in lines
    assert f"artemis_messages_added{labels} 12.0" in lines
    assert f"artemis_messages_acknowledged{labels} 5.0" in lines
    assert any(line.startswith("artemis_address_size{") for line in lines)
    assert any(line.startswith("artemis_disk_store_usage ") for line in lines)
    assert any(line.startswith("process_resident_memory_bytes ") for line in lines)
    # what an operator alerts on: sockets against the open-file limit, held-back producers
    assert "scow_client_sockets 1.0" in lines  # this request's
    assert "scow_client_sockets_refused_total 0.0" in lines
    assert not any(line.startswith("scow_producers_blocked{") for line in lines)
    limits = managed.broker.limits
    managed.call(lambda: limits.block("disk"))  # as the disk monitor does on a full disk
    try:
        blocked = http(managed, "GET", "/metrics")[1].splitlines()
    finally:
        managed.call(lambda: limits.unblock("disk"))
    assert 'scow_producers_blocked{reason="disk"} 1.0' in blocked


def test_the_api_documents_itself(managed):
    status, document = http(managed, "GET", "/api/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.")
    assert "/api/queues/{name}/purge" in document["paths"]
    status, missing = http(managed, "GET", "/api/nothing")
    assert status == 404 and "GET /api/nothing" in missing["error"]


def test_browse_shows_a_large_messages_size_and_headers_not_its_body(managed):
    body = b"L" * (300 << 10)  # over the default min-large-message-size (100KiB)
    with connected(managed.url, **CREDENTIALS) as conn:
        send(conn, "bulky", Message(body=body, subject="big", properties={"n": 1}))
    status, (message,) = http(managed, "GET", "/api/queues/bulky/messages")
    assert status == 200
    assert message["large"] is True and message["size"] > len(body)
    assert message["subject"] == "big" and message["properties"] == {"n": 1}
    assert message["body-preview"] == ""


def test_browse_shows_the_first_messages_without_taking_them(managed):
    with connected(managed.url, **CREDENTIALS) as conn:
        send(
            conn, "peek",
            *(Message(body=f"b{i}", subject="s", properties={"n": i}) for i in range(5)),
        )  # fmt: skip
    status, messages = http(managed, "GET", "/api/queues/peek/messages?limit=3")
    assert status == 200 and len(messages) == 3
    assert [m["body-preview"] for m in messages] == ["b0", "b1", "b2"]
    assert messages[0]["properties"] == {"n": 0} and messages[0]["subject"] == "s"
    assert http(managed, "GET", "/api/queues/peek")[1]["message-count"] == 5
    assert http(managed, "GET", "/api/queues/peek/messages?limit=x")[0] == 400


def test_a_connection_is_closed_through_the_api(managed):
    with connected(managed.url, container_id="victim", **CREDENTIALS) as conn:
        (victim,) = http(managed, "GET", "/api/connections")[1]
        assert http(managed, "DELETE", f"/api/connections/{victim['id']}")[0] == 204
        with pytest.raises(ConnectionClosed, match="amqp:connection:forced"):
            conn.wait(lambda: False, timeout=5, msg="the broker to close the connection")
    assert http(managed, "DELETE", "/api/connections/999999")[0] == 404


def test_an_address_setting_changes_at_run_time(managed):
    status, changed = http(
        managed, "PATCH", "/api/address-settings/limited.%23",  # "#" URL-encoded
        {"max-size-bytes": 2048, "address-full-policy": "FAIL"},
    )  # fmt: skip
    assert status == 200 and changed["max-size-bytes"] == 2048
    with connected(managed.url, **CREDENTIALS) as conn:
        sender = conn.create_sender("limited.a")
        sender.send(Message(body="x" * 3000))  # fills the address past 2 KiB
        with pytest.raises(SendException):  # rejected: the address is full, policy FAIL
            sender.send(Message(body="refused"))
    assert http(managed, "GET", "/api/queues/limited.a")[1]["message-count"] == 1
    status, refused = http(managed, "PATCH", "/api/address-settings/x", {"max-size-bites": 1})
    assert status == 400 and "max-size-bites" in refused["error"]


def test_move_and_retry_messages(managed):
    with connected(managed.url, **CREDENTIALS) as conn:
        send(conn, "inbox", *(Message(body=f"m{i}", properties={"k": i % 2}) for i in range(4)))
        receiver = conn.create_receiver("inbox")
        receive(receiver, 1, accept=False)
        receiver.reject()  # m0 goes to the dead-letter address DLA
        receiver.close()
    status, moved = http(
        managed, "POST", "/api/queues/inbox/move", {"to": "odd", "filter": "k = 1"}
    )
    assert status == 200 and moved == {"moved": 2}
    assert http(managed, "GET", "/api/queues/odd")[1]["message-count"] == 2
    assert http(managed, "GET", "/api/queues/inbox")[1]["message-count"] == 1  # m2 stays
    assert http(managed, "POST", "/api/queues/inbox/move", {"filter": "k = 1"})[0] == 400
    status, retried = http(managed, "POST", "/api/queues/DLA/retry")
    assert status == 200 and retried == {"moved": 1}
    with connected(managed.url, **CREDENTIALS) as conn:
        back = receive(conn.create_receiver("inbox"), 2)
    assert sorted(m.body for m in back) == ["m0", "m2"]


def test_connections_show_their_links(managed):
    with connected(managed.url, container_id="linked", **CREDENTIALS) as conn:
        conn.create_sender("in", name="producer")
        conn.create_receiver("out", name="consumer", credit=7)
        (connection,) = http(managed, "GET", "/api/connections")[1]
        links = {link["name"]: link for link in connection["links"]}
    assert links["producer"]["role"] == "producer" and links["producer"]["address"] == "in"
    assert links["consumer"]["role"] == "consumer" and links["consumer"]["queue"] == "out"
    assert links["consumer"]["credit"] == 7 and links["consumer"]["unsettled"] == 0
    assert links["consumer"]["output-full"] is False


def test_queue_rates_follow_what_is_sent_and_consumed(managed):
    http(managed, "POST", "/api/queues", {"name": "rated", "routing-type": "ANYCAST"})
    with connected(managed.url, **CREDENTIALS) as conn:
        send(conn, "rated", *(Message(body=f"r{i}") for i in range(50)))
        receive(conn.create_receiver("rated"), 50)

    def rates() -> dict:
        queue = http(managed, "GET", "/api/queues/rated")[1]
        return queue if queue["messages-acknowledged-rate"] > 0 else {}

    queue = wait_for(rates, what="the next samples to see the traffic")
    assert 0 < queue["messages-added-rate"] <= 50
    assert 0 < queue["messages-acknowledged-rate"] <= 50


def test_create_and_delete_addresses(managed):
    status, created = http(
        managed, "POST", "/api/addresses", {"name": "events", "routing-types": ["MULTICAST"]}
    )
    assert status == 201 and created["routing-types"] == ["MULTICAST"]
    assert "events" in [a["name"] for a in http(managed, "GET", "/api/addresses")[1]]
    assert http(managed, "POST", "/api/addresses", {"name": "events"})[0] == 409
    bad = http(managed, "POST", "/api/addresses", {"name": "x", "routing-types": ["BOTH"]})
    assert bad[0] == 400 and "ANYCAST and/or MULTICAST" in bad[1]["error"]
    http(managed, "POST", "/api/queues", {"name": "audit", "address": "events"})
    refused = http(managed, "DELETE", "/api/addresses/events")
    assert refused[0] == 409 and "audit" in refused[1]["error"]
    assert http(managed, "DELETE", "/api/addresses/events?force=true")[0] == 204
    assert http(managed, "GET", "/api/addresses/events")[0] == 404
    assert http(managed, "GET", "/api/queues/audit")[0] == 404


def test_broker_reports_journal_and_paging_figures(managed):
    status, broker = http(managed, "GET", "/api/broker")
    assert status == 200
    assert set(broker["paging"]) == {"page-files", "paged-bytes", "paged-messages"}
    assert isinstance(broker["journal"], dict)  # the memory journal reports nothing
    assert 0 <= broker["disk-usage-percent"] <= 100 and broker["max-disk-usage"] == 90


def test_a_kept_address_setting_survives_a_restart(tmp_path):
    config = write_config(
        tmp_path / "scow.toml",
        broker_config(
            tmp_path / "data",
            plugins=[*DEFAULT_PLUGINS, "management"],
            sections={"management": {"listen": "127.0.0.1:0"}},
        ),
    )
    first = BrokerThread(config).start()
    try:
        first.http = first.call(lambda: first.broker.stats()["management"]["url"])
        kept = http(first, "PATCH", "/api/address-settings/kept.%23?persist=true",
                    {"max-delivery-attempts": 3}, auth=False)  # fmt: skip
        assert kept[0] == 200
        http(first, "PATCH", "/api/address-settings/gone.%23", {"max-delivery-attempts": 4},
             auth=False)  # fmt: skip
    finally:
        first.stop()
    second = BrokerThread(config).start()
    try:
        settings = second.call(lambda: second.broker.settings_for("kept.a").max_delivery_attempts)
        assert settings == 3
        assert second.call(lambda: second.broker.settings_for("gone.a").max_delivery_attempts) == 10
    finally:
        second.stop()


def test_purge_reaches_messages_in_pages(scow_broker):
    broker = scow_broker(
        plugins=[*DEFAULT_PLUGINS, "management"],
        sections={"management": {"listen": "127.0.0.1:0"}},
        address_settings={"deep": {"max-size-bytes": 10_000, "page-size-bytes": 8_000}},
    )
    broker.http = broker.call(lambda: broker.broker.stats()["management"]["url"])
    with connected(broker.url) as conn:
        send(conn, "deep", *(Message(body=f"{i}:" + "x" * 500) for i in range(200)))
    assert broker.queue_stats("deep")["messages-paged"] > 150
    status, purged = http(broker, "POST", "/api/queues/deep/purge", auth=False)
    assert status == 200 and purged == {"purged": 200}
    wait_for(lambda: broker.queue_stats("deep")["message-count"] == 0, what="pages purged")
    with connected(broker.url) as conn:
        send(conn, "deep", Message(body="after"))
        assert [m.body for m in receive(conn.create_receiver("deep"), 1)] == ["after"]
