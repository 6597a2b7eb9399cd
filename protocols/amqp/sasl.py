"""The SASL layer and protocol-header negotiation, ahead of proton's AMQP engine.

proton's built-in SASL server cannot check passwords without Cyrus, so Scow speaks the
SASL frames itself and hands proton only the AMQP bytes that follow. Mechanisms:
ANONYMOUS (while anonymous access is allowed), PLAIN and SCRAM-SHA-256 against the users
file (`scow.core.security`), and EXTERNAL with the TLS client certificate's common name.
A connection may also skip SASL and start with the plain AMQP header when anonymous
access is allowed. A failed login is answered `auth` only after the security's
login-failure-delay (the connection writes `deferred` then).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Any

from scow.core.security import Principal, Security
from scow.core.security.scram import MECHANISM as SCRAM_SHA_256
from scow.core.security.scram import ScramError, ScramServer
from scow.protocols.amqp import codec

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"

MECHANISMS = ("ANONYMOUS", "PLAIN", SCRAM_SHA_256, "EXTERNAL")

#: A frame header: size, data offset (words), type, channel.
FRAME_HEADER = struct.Struct(">IBBH")
_SASL_FRAME_TYPE = 1
_SASL_MECHANISMS = 0x40
_SASL_INIT = 0x41
_SASL_CHALLENGE = 0x42
_SASL_RESPONSE = 0x43
_SASL_OUTCOME = 0x44
MAX_SASL_FRAME = 4096


def sasl_frame(descriptor: int, fields: list[Any]) -> bytes:
    """A SASL frame carrying the performative `descriptor` with `fields` (either end)."""
    body = codec.encode_value(codec.Described(descriptor, fields))
    return FRAME_HEADER.pack(8 + len(body), 2, _SASL_FRAME_TYPE, 0) + body


OUTCOME_OK = 0
OUTCOME_AUTH = 1
OUTCOME_SYS = 2


class State(enum.Enum):
    HEADER = "header"  # waiting for the 8-byte protocol header
    INIT = "init"  # SASL header seen; waiting for sasl-init
    RESPONSE = "response"  # a challenge was sent; waiting for sasl-response
    AMQP = "amqp"  # authenticated (or no SASL): bytes go to proton
    FAILED = "failed"  # close after writing what we have (and `deferred`, after the delay)


class SaslServer:
    """Consumes the bytes before AMQP proper; tells the connection what to do next."""

    def __init__(
        self,
        *,
        mechanisms: Sequence[str],
        security: Security,
        peer: str,
        certificate_name: str | None = None,
    ) -> None:
        self.security = security
        self.peer = peer
        self.certificate_name = certificate_name
        self.mechanisms = [
            m
            for m in mechanisms
            if (m != "ANONYMOUS" or security.anonymous_allowed)
            and (m != "EXTERNAL" or certificate_name is not None)
        ]
        self.state = State.HEADER
        self.principal: Principal | None = None
        self.error: str | None = None
        #: The `auth` outcome of a failed login, to be written after the delay.
        self.deferred = b""
        self._buffer = b""
        self._after_sasl = False
        self._scram: ScramServer | None = None

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Take received bytes; return (bytes to write, bytes left over for AMQP)."""
        self._buffer += data
        out = []
        while self.state in (State.HEADER, State.INIT, State.RESPONSE):
            if self.state is State.HEADER:
                if len(self._buffer) < 8:
                    prefix = self._buffer
                    if not (AMQP_HEADER.startswith(prefix) or SASL_HEADER.startswith(prefix)):
                        return self._fail_header(out)
                    break
                header, self._buffer = self._buffer[:8], self._buffer[8:]
                anonymous = self.security.anonymous_allowed
                if header == SASL_HEADER and not self._after_sasl:
                    out.append(SASL_HEADER + self._mechanisms_frame())
                    self.state = State.INIT
                elif header == AMQP_HEADER and (self._after_sasl or anonymous):
                    if not self._after_sasl:
                        self.principal = self.security.anonymous
                    self.state = State.AMQP
                    # proton answers with its own AMQP header once fed this one
                    rest, self._buffer = AMQP_HEADER + self._buffer, b""
                    return b"".join(out), rest
                else:
                    self._buffer = header + self._buffer
                    return self._fail_header(out)
            else:
                frame = self._take_frame()
                if frame is None:
                    break
                out.append(self._on_frame(frame))
        return b"".join(out), b""

    def _fail_header(self, out: list[bytes]) -> tuple[bytes, bytes]:
        """Not a header we speak: answer with the one we want, as the spec says, and close."""
        got = self._buffer[:8]
        wanted = SASL_HEADER if not self.security.anonymous_allowed else AMQP_HEADER
        self.error = (
            f"unsupported protocol header {got!r}; expected {AMQP_HEADER!r} or {SASL_HEADER!r}"
        )
        self.state = State.FAILED
        self._buffer = b""
        out.append(wanted)
        return b"".join(out), b""

    def _take_frame(self) -> bytes | None:
        if len(self._buffer) < 8:
            return None
        size, doff, ftype, _channel = FRAME_HEADER.unpack_from(self._buffer)
        if size > MAX_SASL_FRAME or size < 8 or doff < 2 or ftype != _SASL_FRAME_TYPE:
            self.error = f"malformed SASL frame (size {size}, type {ftype})"
            self.state = State.FAILED
            return None
        if len(self._buffer) < size:
            return None
        body = self._buffer[doff * 4 : size]
        self._buffer = self._buffer[size:]
        return body

    def _on_frame(self, body: bytes) -> bytes:
        expected = _SASL_INIT if self.state is State.INIT else _SASL_RESPONSE
        try:
            value, _ = codec.decode_value(body, 0)
        except codec.DecodeError as exc:
            return self._broken(f"malformed SASL frame: {exc}")
        if not isinstance(value, codec.Described) or value.descriptor != expected:
            wanted = "sasl-init" if expected == _SASL_INIT else "sasl-response"
            return self._broken(f"expected {wanted}")
        if not isinstance(value.value, list):
            return self._broken("a SASL performative's fields must be a list")
        fields = [*value.value, None, None]
        if expected == _SASL_RESPONSE:
            return self._on_response(fields[0])
        return self._on_init(fields[0], fields[1])

    def _on_init(self, mechanism_field: object, response_field: object) -> bytes:
        mechanism = str(mechanism_field or "")
        response = bytes(response_field) if isinstance(response_field, bytes) else b""
        if mechanism not in self.mechanisms:
            return self._refuse(
                "",
                mechanism,
                f"SASL mechanism {mechanism!r} not offered (offered: {self.mechanisms})",
                defer=False,
            )
        if mechanism == "PLAIN":
            parts = response.split(b"\x00")
            if len(parts) != 3:
                return self._refuse("", mechanism, "malformed PLAIN response")
            authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
            if authzid and authzid != user:
                return self._refuse(user, mechanism, "authorization identity differs from user")
            principal = self.security.authenticate(user, password, self.peer, mechanism)
            if principal is None:
                return self._failed(f"authentication failed for user {user!r}")
            return self._succeed(principal)
        if mechanism == SCRAM_SHA_256:
            self._scram = ScramServer(self.security.credential)
            try:
                challenge = self._scram.first(response.decode("utf-8"))
            except (ScramError, UnicodeDecodeError) as exc:
                return self._refuse(self._scram.user, mechanism, str(exc))
            self.state = State.RESPONSE
            return sasl_frame(_SASL_CHALLENGE, [challenge.encode()])
        if mechanism == "EXTERNAL":
            name = self.certificate_name or ""
            authzid = response.decode("utf-8", "replace")
            if authzid and authzid != name:
                return self._refuse(authzid, mechanism, f"certificate is for {name!r}")
            principal = self.security.principal(name)
            self.security.logged_in(principal, self.peer, mechanism)
            return self._succeed(principal)
        self.security.logged_in(self.security.anonymous, self.peer, mechanism)
        return self._succeed(self.security.anonymous)

    def _on_response(self, response_field: object) -> bytes:
        scram = self._scram
        assert scram is not None
        response = bytes(response_field) if isinstance(response_field, bytes) else b""
        try:
            verifier = scram.final(response.decode("utf-8"))
        except (ScramError, UnicodeDecodeError) as exc:
            return self._refuse(scram.user, SCRAM_SHA_256, str(exc))
        principal = self.security.principal(scram.user)
        self.security.logged_in(principal, self.peer, SCRAM_SHA_256)
        return self._succeed(principal, verifier.encode())

    def _succeed(self, principal: Principal, additional: bytes | None = None) -> bytes:
        self.principal = principal
        self._after_sasl = True
        self.state = State.HEADER
        return self._outcome(OUTCOME_OK, additional)

    def _refuse(self, user: str, mechanism: str, reason: str, *, defer: bool = True) -> bytes:
        self.security.login_failed(user, self.peer, mechanism, reason)
        if defer:
            return self._failed(reason)
        self.error = reason
        self.state = State.FAILED
        return self._outcome(OUTCOME_AUTH)

    def _failed(self, reason: str) -> bytes:
        """A wrong password or proof: nothing now, `auth` after the delay."""
        self.error = reason
        self.state = State.FAILED
        self.deferred = self._outcome(OUTCOME_AUTH)
        return b""

    def _broken(self, reason: str) -> bytes:
        self.error = reason
        self.state = State.FAILED
        return self._outcome(OUTCOME_SYS)

    def _mechanisms_frame(self) -> bytes:
        # sasl-mechanisms: described list holding one array of symbols (array8 of sym8);
        # the codec encodes no arrays
        items = b"".join(bytes([len(m)]) + m.encode() for m in self.mechanisms)
        array = bytes([0xE0, 2 + len(items), len(self.mechanisms), 0xA3]) + items
        body = b"\x00\x53" + bytes([_SASL_MECHANISMS, 0xC0, 1 + len(array), 1]) + array
        return FRAME_HEADER.pack(8 + len(body), 2, _SASL_FRAME_TYPE, 0) + body

    @staticmethod
    def _outcome(code: int, additional: bytes | None = None) -> bytes:
        fields: list[object] = [codec.UByte(code)]
        if additional is not None:
            fields.append(additional)
        return sasl_frame(_SASL_OUTCOME, fields)
