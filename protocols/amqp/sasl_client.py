"""The client end of SASL on a blocking socket, before AMQP (the server end is `sasl`).

proton's Python wheel has no Cyrus SASL, so clients that log in over the engine facade
(the Spark connector) and the tests that exercise SCRAM speak the SASL frames themselves.
"""

from __future__ import annotations

import socket

from scow.protocols.amqp import codec
from scow.protocols.amqp.sasl import FRAME_HEADER, SASL_HEADER, sasl_frame

SASL_MECHANISMS = 0x40
SASL_INIT = 0x41
SASL_CHALLENGE = 0x42
SASL_RESPONSE = 0x43
SASL_OUTCOME = 0x44


class SaslError(Exception):
    """The broker refused the login or answered outside the SASL exchange."""


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"the broker closed the connection ({len(data)} of {n} bytes)")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> codec.Described:
    """The next SASL frame's performative."""
    size, doff, _type, _channel = FRAME_HEADER.unpack(read_exactly(sock, 8))
    body = read_exactly(sock, size - 8)[doff * 4 - 8 :]
    value, _ = codec.decode_value(body, 0)
    return value


def mechanisms(sock: socket.socket) -> list[str]:
    """Send the SASL header; the mechanisms the broker offers."""
    sock.sendall(SASL_HEADER)
    if read_exactly(sock, 8) != SASL_HEADER:
        raise SaslError("the broker does not speak SASL")
    offered = read_frame(sock)
    if int(offered.descriptor) != SASL_MECHANISMS:
        raise SaslError(f"expected sasl-mechanisms, got frame {int(offered.descriptor):#x}")
    names = offered.value[0] if offered.value else []
    return [str(m) for m in (names if isinstance(names, list) else [names])]


def plain_login(sock: socket.socket, username: str, password: str, host: str) -> None:
    """SASL PLAIN: header, mechanisms, init, outcome; SaslError when refused."""
    offered = mechanisms(sock)
    if "PLAIN" not in offered:
        raise SaslError(f"the broker offers no PLAIN login (offers {', '.join(offered)})")
    response = b"\0" + username.encode() + b"\0" + password.encode()
    sock.sendall(sasl_frame(SASL_INIT, [codec.Symbol("PLAIN"), response, host]))
    outcome = read_frame(sock)
    if int(outcome.descriptor) != SASL_OUTCOME:
        raise SaslError(f"unexpected SASL frame {int(outcome.descriptor):#x}")
    if outcome.value and int(outcome.value[0]) != 0:
        raise SaslError(f"login of user {username!r} refused by the broker")
