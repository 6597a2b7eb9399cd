"""CONNECT's `login` / `passcode` checked by the broker's security.

`broker.security` authenticates (a principal, or None for a wrong login), says whether
anonymous clients are allowed, counts connections against its limits, and checks each
permission (`send`, `consume`, `createAddress`, ...) once per destination, never per
message.
"""

from __future__ import annotations

from typing import Any

from scow.core import Broker, BrokerError, Principal


class LoginRefused(Exception):
    """CONNECT is refused; `delayed` answers only after the security's failure delay."""

    def __init__(self, message: str, *, delayed: bool) -> None:
        super().__init__(message)
        self.delayed = delayed


def login(
    broker: Broker, username: str | None, passcode: str | None, peer: str
) -> Principal | None:
    """The connection's principal (None: anonymous), counted against connection limits.

    Raises LoginRefused saying why the client may not connect.
    """
    security = broker.security
    principal: Principal | None = None
    if username is None:
        if not security.anonymous_allowed:
            raise LoginRefused(
                "CONNECT without login: this broker does not accept anonymous clients",
                delayed=False,
            )
    else:
        principal = security.authenticate(username, passcode or "", peer)
        if principal is None:
            raise LoginRefused(
                f"CONNECT: login failed for user '{username}' (unknown user or wrong passcode)",
                delayed=True,
            )
    try:
        security.admit(principal)
    except BrokerError as exc:
        raise LoginRefused(f"CONNECT refused: {exc.description}", delayed=False) from None
    return principal


def authorizer(broker: Broker, principal: Principal | None) -> Any:
    """`authorize(permission, address)` raising Unauthorized; None while nothing is enforced."""
    security = broker.security
    if not security.enforcing:
        return None
    return lambda permission, address: security.check(principal, permission, address)
