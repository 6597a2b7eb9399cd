"""With `log-format = "json"`, every line `scow run` writes is one JSON object, whoever
logs it: a log shipper parses each line.

Before, only the broker's own (structlog) lines were JSON. The libraries it runs on log
through Python's `logging`, which nothing configured, so its last-resort handler wrote
their records to stderr as plain text, past the log's writer thread: a malformed HTTP
request to the management port (a scanner, a broken health check) put aiohttp's
"Error handling request" and a ten-line traceback into the log.
"""

from __future__ import annotations

import json
import socket

from tests.system.topology import BrokerSpec

#: Requests a management port meets on a network: a bad header, a bad request line.
BAD_REQUESTS = (
    b"GET /api/broker HTTP/1.1\r\nHost: scow\r\nContent-Length: -5\r\n\r\n",
    b"GARBAGE\r\n\r\n",
    b"GET /api/broker HTTP/1.1\r\nHost: scow\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
)


def _answer(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(100)


def test_every_line_of_a_json_log_is_a_json_object(system_broker) -> None:
    broker = system_broker(BrokerSpec(broker={"log-format": "json"}))
    for request in BAD_REQUESTS:
        assert _answer(broker.http_port, request).startswith(b"HTTP/1.")  # a 400
    answer = _answer(broker.http_port, b"GET /api/broker HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 200"), answer  # and it serves on
    assert broker.stop() == 0

    lines = broker.log_path.read_text().splitlines()
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n(log: {lines})") from None
    bad = [r for r in records if r.get("logger") == "aiohttp.server"]
    assert len(bad) == len(BAD_REQUESTS) - 1, records  # aiohttp's own: GARBAGE at debug
    for record in bad:  # a client's mistake: one line, no traceback
        assert record["level"] == "info" and "exception" not in record, record
        assert record["event"].startswith("bad HTTP request from 127.0.0.1"), record
    assert any(r["event"] == "shutting down" for r in records)
