"""SCRAM-SHA-256 (RFC 5802, RFC 7677): the stored credential and the server's exchange.

A user's credential is what the server keeps instead of a password: a random salt, an
iteration count, StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey =
HMAC(SaltedPassword, "Server Key"). The same credential checks a SCRAM exchange (the
client proves it knows the password without sending it) and a plain password (SASL
PLAIN, HTTP Basic): derive the StoredKey from the password and compare.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
#: RFC 7677's minimum; PBKDF2 of 4096 rounds costs a few ms, paid once per login.
DEFAULT_ITERATIONS = 4096
_SALT_BYTES = 16


class ScramError(ValueError):
    """The client's SCRAM message is malformed or its proof is wrong."""


@dataclass(frozen=True)
class Credential:
    """What the users file holds for one user's password (never the password)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(
        cls, password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
    ) -> Credential:
        """A credential for `password` with a fresh random salt."""
        salt = salt if salt is not None else os.urandom(_SALT_BYTES)
        salted = _salted_password(password, salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        return cls(salt, iterations, _h(client_key), _hmac(salted, b"Server Key"))

    def verify_password(self, password: str) -> bool:
        """True when `password` is the one this credential was derived from."""
        salted = _salted_password(password, self.salt, self.iterations)
        return hmac.compare_digest(_h(_hmac(salted, b"Client Key")), self.stored_key)


def _salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    # RFC 5802 asks for SASLprep; NFKC is what it amounts to for the passwords people type
    normalized = unicodedata.normalize("NFKC", password).encode("utf-8")
    return hashlib.pbkdf2_hmac("sha256", normalized, salt, iterations)


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _attributes(message: str) -> dict[str, str]:
    """`a=1,b=2` as {"a": "1", "b": "2"}; ScramError when an item is not `x=...`."""
    out: dict[str, str] = {}
    for item in message.split(","):
        if len(item) < 2 or item[1] != "=":
            raise ScramError(f"SCRAM attribute {item!r} is not of the form x=value")
        out.setdefault(item[0], item[2:])
    return out


def _saslname(value: str) -> str:
    """Decode a SCRAM user name (`=2C` is a comma, `=3D` an equals sign)."""
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise ScramError(f"user name {value!r} has a bad '=' escape")
    return value.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM-SHA-256 exchange, server side.

    `first(client_first)` returns the server-first message; `final(client_final)` checks
    the proof and returns the server-final message (`v=...`). Both raise ScramError on a
    malformed message or a wrong proof. An unknown user gets a plausible salt derived
    from a per-process secret and fails at the proof, so the exchange does not tell who
    exists.
    """

    _decoy_secret = secrets.token_bytes(32)

    def __init__(self, lookup: Callable[[str], Credential | None]) -> None:
        self._lookup = lookup
        self.user: str = ""
        self._credential: Credential | None = None
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""

    def first(self, client_first: str) -> str:
        gs2, sep, bare = client_first.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if not sep or not sep2 or (gs2 not in ("n", "y") and not gs2.startswith("p=")):
            raise ScramError("client-first message does not start with a GS2 header (n,,)")
        if gs2.startswith("p="):
            raise ScramError("channel binding is not supported; use the gs2 header 'n,,'")
        if authzid and _saslname(authzid.removeprefix("a=")) != _saslname(
            _attributes(bare).get("n", "")
        ):
            raise ScramError("an authorization identity other than the user is not supported")
        attrs = _attributes(bare)
        if "m" in attrs:
            raise ScramError("SCRAM extensions (m=) are not supported")
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise ScramError("client-first message lacks the user (n=) or nonce (r=)")
        self.user = _saslname(attrs["n"])
        self._credential = self._lookup(self.user)
        credential = self._credential or self._decoy(self.user)
        self._nonce = attrs["r"] + _b64(secrets.token_bytes(18))
        self._client_first_bare = bare
        self._server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        return self._server_first

    def final(self, client_final: str) -> str:
        without_proof, sep, proof_attr = client_final.rpartition(",p=")
        if not sep:
            raise ScramError("client-final message lacks the proof (p=)")
        attrs = _attributes(without_proof)
        if attrs.get("r") != self._nonce:
            raise ScramError("client-final message has the wrong nonce")
        if attrs.get("c") not in ("biws", "eSws"):  # base64 of "n,," and "y,,"
            raise ScramError("channel binding data (c=) does not match the GS2 header")
        try:
            proof = base64.b64decode(proof_attr, validate=True)
        except ValueError:
            raise ScramError("the proof (p=) is not base64") from None
        credential = self._credential
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        if credential is None or len(proof) != len(credential.stored_key):
            raise ScramError(f"authentication failed for user {self.user!r}")
        signature = _hmac(credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(_h(client_key), credential.stored_key):
            raise ScramError(f"authentication failed for user {self.user!r}")
        return "v=" + _b64(_hmac(credential.server_key, auth_message))

    @classmethod
    def _decoy(cls, user: str) -> Credential:
        salt = _hmac(cls._decoy_secret, user.encode())[:_SALT_BYTES]
        return Credential(salt, DEFAULT_ITERATIONS, b"", b"")


class ScramClient:
    """The client side of one exchange (for `scow` commands and tests that cannot use
    Cyrus SASL through proton)."""

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self.password = password
        self._nonce = _b64(secrets.token_bytes(18))
        name = user.replace("=", "=3D").replace(",", "=2C")
        self._first_bare = f"n={name},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> str:
        return "n,," + self._first_bare

    def final(self, server_first: str) -> str:
        attrs = _attributes(server_first)
        nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
        if not nonce.startswith(self._nonce):
            raise ScramError("server nonce does not extend ours")
        salted = _salted_password(self.password, salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{server_first},{without_proof}".encode()
        signature = _hmac(_h(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={_b64(proof)}"

    def verify(self, server_final: str) -> None:
        """Check the server knew our credential too (mutual authentication)."""
        if server_final != "v=" + _b64(self._server_signature):
            raise ScramError("the server's signature is wrong")
