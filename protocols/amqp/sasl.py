"""The SASL layer and protocol-header negotiation, ahead of proton's AMQP engine.

proton's built-in SASL server cannot check passwords without Cyrus, so Scow speaks the
SASL frames itself (ANONYMOUS and PLAIN against the configured users) and hands proton
only the AMQP bytes that follow. A connection may also skip SASL and start with the plain
AMQP header when anonymous access is allowed.
"""

from __future__ import annotations

import enum
import hmac
import struct
from collections.abc import Mapping, Sequence

from scow.protocols.amqp import codec

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"

_FRAME = struct.Struct(">IBBH")  # size, data offset (words), type, channel
_SASL_FRAME_TYPE = 1
_SASL_INIT = 0x41
_SASL_MECHANISMS = 0x40
_SASL_OUTCOME = 0x44
MAX_SASL_FRAME = 4096

OUTCOME_OK = 0
OUTCOME_AUTH = 1
OUTCOME_SYS = 2


class State(enum.Enum):
    HEADER = "header"  # waiting for the 8-byte protocol header
    INIT = "init"  # SASL header seen; waiting for sasl-init
    AMQP = "amqp"  # authenticated (or no SASL): bytes go to proton
    FAILED = "failed"  # close after writing what we have


class SaslServer:
    """Consumes the bytes before AMQP proper; tells the connection what to do next."""

    def __init__(
        self,
        *,
        mechanisms: Sequence[str],
        users: Mapping[str, str],
        allow_anonymous: bool,
    ) -> None:
        offered = [m for m in mechanisms if m != "ANONYMOUS" or allow_anonymous]
        self.mechanisms = offered
        self.users = users
        self.allow_anonymous = allow_anonymous
        self.state = State.HEADER
        self.user: str | None = None
        self.error: str | None = None
        self._buffer = b""
        self._after_sasl = False

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Take received bytes; return (bytes to write, bytes left over for AMQP)."""
        self._buffer += data
        out = []
        while self.state in (State.HEADER, State.INIT):
            if self.state is State.HEADER:
                if len(self._buffer) < 8:
                    prefix = self._buffer
                    if not (AMQP_HEADER.startswith(prefix) or SASL_HEADER.startswith(prefix)):
                        return self._fail_header(out)
                    break
                header, self._buffer = self._buffer[:8], self._buffer[8:]
                if header == SASL_HEADER and not self._after_sasl:
                    out.append(SASL_HEADER + self._mechanisms_frame())
                    self.state = State.INIT
                elif header == AMQP_HEADER and (self._after_sasl or self.allow_anonymous):
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
                out.append(self._on_init(frame))
        return b"".join(out), b""

    def _fail_header(self, out: list[bytes]) -> tuple[bytes, bytes]:
        """Not a header we speak: answer with the one we want, as the spec says, and close."""
        got = self._buffer[:8]
        wanted = SASL_HEADER if not self.allow_anonymous else AMQP_HEADER
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
        size, doff, ftype, _channel = _FRAME.unpack_from(self._buffer)
        if size > MAX_SASL_FRAME or size < 8 or doff < 2 or ftype != _SASL_FRAME_TYPE:
            self.error = f"malformed SASL frame (size {size}, type {ftype})"
            self.state = State.FAILED
            return None
        if len(self._buffer) < size:
            return None
        body = self._buffer[doff * 4 : size]
        self._buffer = self._buffer[size:]
        return body

    def _on_init(self, body: bytes) -> bytes:
        try:
            value, _ = codec.decode_value(body, 0)
        except codec.DecodeError as exc:
            self.error = f"malformed sasl-init: {exc}"
            self.state = State.FAILED
            return self._outcome(OUTCOME_SYS)
        if not isinstance(value, codec.Described) or value.descriptor != _SASL_INIT:
            self.error = "expected sasl-init"
            self.state = State.FAILED
            return self._outcome(OUTCOME_SYS)
        fields = [*(value.value or []), None, None, None]
        mechanism, response = str(fields[0] or ""), fields[1] or b""
        if mechanism not in self.mechanisms:
            self.error = f"SASL mechanism {mechanism!r} not offered (offered: {self.mechanisms})"
            self.state = State.FAILED
            return self._outcome(OUTCOME_AUTH)
        if mechanism == "PLAIN":
            parts = bytes(response).split(b"\x00")
            if len(parts) != 3:
                self.error = "malformed PLAIN response"
                self.state = State.FAILED
                return self._outcome(OUTCOME_AUTH)
            user = parts[1].decode("utf-8", "replace")
            password = parts[2].decode("utf-8", "replace")
            expected = self.users.get(user)
            if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
                self.error = f"authentication failed for user {user!r}"
                self.state = State.FAILED
                return self._outcome(OUTCOME_AUTH)
            self.user = user
        else:
            self.user = "anonymous"
        self._after_sasl = True
        self.state = State.HEADER
        return self._outcome(OUTCOME_OK)

    def _mechanisms_frame(self) -> bytes:
        # sasl-mechanisms: described list holding one array of symbols (array8 of sym8)
        items = b"".join(bytes([len(m)]) + m.encode() for m in self.mechanisms)
        array = bytes([0xE0, 2 + len(items), len(self.mechanisms), 0xA3]) + items
        body = b"\x00\x53" + bytes([_SASL_MECHANISMS, 0xC0, 1 + len(array), 1]) + array
        return _FRAME.pack(8 + len(body), 2, _SASL_FRAME_TYPE, 0) + body

    @staticmethod
    def _outcome(code: int) -> bytes:
        body = codec.encode_value(codec.Described(_SASL_OUTCOME, [codec.UByte(code)]))
        return _FRAME.pack(8 + len(body), 2, _SASL_FRAME_TYPE, 0) + body
