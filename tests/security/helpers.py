"""Security test helpers: users files, a throwaway CA, and SASL exchanges on raw sockets.

proton's Python client here is built without Cyrus SASL (`proton.SASL.extended()` is
false), so it offers ANONYMOUS, PLAIN and EXTERNAL only. SCRAM-SHA-256 is tested with
`scram_connect`: our SCRAM client speaks the SASL frames on a real socket, then proton's
own engine (a client Transport without a SASL layer) carries AMQP on the same socket.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from scow.core.security.scram import Credential, ScramClient
from scow.core.security.users import User, write_users
from scow.protocols.amqp import codec
from scow.protocols.amqp.sasl import sasl_frame
from scow.protocols.amqp.sasl_client import mechanisms, read_frame

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"

#: Few PBKDF2 rounds keep test logins cheap; the broker reads the count from the file.
TEST_ITERATIONS = 64


def users_file(path: Path, users: Mapping[str, tuple[str, Iterable[str]]]) -> Path:
    """Write a users file: name -> (password, roles)."""
    write_users(
        path,
        [
            User(name, frozenset(roles), Credential.derive(pw, iterations=TEST_ITERATIONS))
            for name, (pw, roles) in users.items()
        ],
    )
    return path


# --------------------------------------------------------------------------- certificates


@dataclass
class Pki:
    """Files of a throwaway CA, a server certificate for 127.0.0.1/localhost, and clients."""

    ca: Path
    server_cert: Path
    server_key: Path
    directory: Path
    authority: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]

    def client(self, name: str, *, signed_by: Authority | None = None) -> tuple[Path, Path]:
        """A client certificate with common name `name` (signed by our CA, or another)."""
        cert, key = _issue(name, signed_by or self.authority, client=True)
        return _write(self.directory, f"client-{name}", cert, key)


Authority = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def new_ca(name: str) -> Authority:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _issue(name: str, ca: Authority, *, client: bool) -> Authority:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if client:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(ca[1], hashes.SHA256()), key


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def make_pki(directory: Path) -> Pki:
    """A CA and a server certificate under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = new_ca("scow test CA")
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    server_cert, server_key = _write(directory, "server", *_issue("localhost", ca, client=False))
    return Pki(ca_path, server_cert, server_key, directory, ca)


def client_context(pki: Pki, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A Python TLS client context trusting the test CA (with a client certificate)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


# --------------------------------------------------------------------------- raw SASL


def scram_login(sock: socket.socket, user: str, password: str) -> int:
    """Run SCRAM-SHA-256 on a connected socket; returns the sasl-outcome code (0: ok).

    Checks the server's signature when it accepts (mutual authentication).
    """
    client = ScramClient(user, password)
    assert "SCRAM-SHA-256" in mechanisms(sock)
    sock.sendall(sasl_frame(0x41, [codec.Symbol("SCRAM-SHA-256"), client.first().encode()]))
    challenge = read_frame(sock)
    if challenge.descriptor == 0x44:  # refused at once
        return int(challenge.value[0])
    assert challenge.descriptor == 0x42, challenge
    final = client.final(bytes(challenge.value[0]).decode())
    sock.sendall(sasl_frame(0x43, [final.encode()]))
    outcome = read_frame(sock)
    assert outcome.descriptor == 0x44, outcome
    code = int(outcome.value[0])
    if code == 0:
        client.verify(bytes(outcome.value[1]).decode())
    return code
