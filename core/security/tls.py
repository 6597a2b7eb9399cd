"""The server side of TLS: an `ssl.SSLContext` built from the `[tls]` section."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def server_context(settings: Mapping[str, Any]) -> ssl.SSLContext:
    """A server context from `[tls]`; ValueError naming the setting when it cannot be."""
    cert, key = str(settings["cert-file"]), str(settings["key-file"])
    if not cert or not key:
        raise ValueError(
            "[tls] cert-file and key-file are needed for a TLS listener ([amqp] listen-tls)"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[str(settings["min-version"])]
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"[tls] cert-file {cert!r} / key-file {key!r}: {exc}") from None
    ca = str(settings["ca-file"])
    try:
        if ca:
            context.load_verify_locations(cafile=ca)
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"[tls] ca-file {ca!r}: {exc}") from None
    if settings["need-client-auth"]:
        context.verify_mode = ssl.CERT_REQUIRED
    elif settings["want-client-auth"]:
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def subject_name(peercert: Mapping[str, Any] | None) -> str | None:
    """The common name of a verified peer certificate (`getpeercert()`), if any."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
