"""Who a client is and what it may do: logins, permissions per address, connection limits.

Protocols authenticate a client once per connection (`authenticate` for a user name and
password, `credential` for SCRAM, `principal` for a certificate's subject) and check a
permission once per link or subscription (`check`), never per message; an anonymous
relay checks each new target address once and caches the answer.

Permissions follow Artemis's security settings: `[security-settings."orders.#"]` tables
grant each permission to roles, and for an address the most specific matching pattern
decides on its own (a permission it does not list is refused). With no security settings
at all, every client may do everything (the embedded default). Every login, refusal and
management action goes to the audit log, a structlog stream of its own.

The package also holds the user store (`users`: the users file), SCRAM credentials
(`scram`) and the TLS contexts of listeners and clients (`tls`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from scow.core import open_files
from scow.core.config import PERMISSIONS, SECURITY_SETTINGS_SECTION, Config, ConfigError
from scow.core.logging import audit_logger
from scow.core.model import ResourceLimitExceeded, Unauthorized
from scow.core.security.scram import Credential
from scow.core.security.users import UsersFile, UsersFileError
from scow.core.wildcard import HierarchicalRepository

__all__ = ["ANONYMOUS", "PERMISSIONS", "Principal", "Security"]

ANONYMOUS = "anonymous"

#: Seconds between two warnings about sockets refused for the open-file limit.
SOCKETS_WARNING_PERIOD = 10.0


@dataclass(frozen=True)
class Principal:
    """An authenticated (or anonymous) client: its user name and roles."""

    name: str
    roles: frozenset[str] = frozenset()
    anonymous: bool = False


class Security:
    """Authentication, authorization and connection limits for one broker."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        security_settings: Mapping[str, Mapping[str, list[str]]] | None = None,
    ) -> None:
        self.anonymous_allowed: bool = bool(settings["allow-anonymous"])
        users_file = str(settings["users-file"])
        try:
            self.users = UsersFile(Path(users_file) if users_file else None)
        except UsersFileError as exc:
            raise ConfigError(f"[security] users-file: {exc}", section="security") from None
        self.anonymous = Principal(
            ANONYMOUS, frozenset(settings["anonymous-roles"]), anonymous=True
        )
        #: Seconds a failed login waits before it is answered (slows password guessing).
        self.login_failure_delay = int(settings["login-failure-delay"]) / 1000
        self.max_connections = int(settings["max-connections"])
        self.max_connections_per_user = int(settings["max-connections-per-user"])
        self.audit = audit_logger(str(settings["audit-log"]))
        self._grants: HierarchicalRepository[dict[str, frozenset[str]]] = HierarchicalRepository()
        for pattern, grants in (security_settings or {}).items():
            self._grants.add(pattern, {p: frozenset(roles) for p, roles in grants.items()})
        #: False when no security settings exist: then `check` allows everything and
        #: protocols skip their per-transfer checks altogether.
        self.enforcing = len(self._grants) > 0
        self.connections = 0
        self._per_user: dict[str, int] = {}
        #: Client sockets open now, counted from accept (before any login) to close, and
        #: how many may be: what the open-file limit leaves after storage's reserve.
        self.sockets = 0
        self.file_limit = open_files.limit()
        self.max_sockets = open_files.socket_ceiling(self.file_limit)
        #: Sockets refused for that, in all and since the last warning (and its time).
        self.sockets_refused = 0
        self._unreported = 0
        self._reported_at = -SOCKETS_WARNING_PERIOD

    @classmethod
    def from_config(cls, config: Config) -> Security:
        """The broker's security from `[security]` and `[security-settings]`."""
        names = config.section_names
        settings = (
            config.section(SECURITY_SETTINGS_SECTION) if SECURITY_SETTINGS_SECTION in names else {}
        )
        return cls(config.section("security"), settings)

    # ------------------------------------------------------------------ authentication

    def authenticate(
        self, username: str, password: str, peer: str, mechanism: str = "PLAIN"
    ) -> Principal | None:
        """The user when `password` is theirs; None (and an audit record) otherwise."""
        user = self._user(username)
        if user is not None and user.credential.verify_password(password):
            principal = Principal(user.name, user.roles)
            self.logged_in(principal, peer, mechanism)
            return principal
        self.login_failed(username, peer, mechanism, "wrong user name or password")
        return None

    def credential(self, username: str) -> Credential | None:
        """The stored SCRAM credential of `username`, for a SCRAM exchange."""
        user = self._user(username)
        return user.credential if user is not None else None

    def principal(self, username: str) -> Principal:
        """The principal of a user proven by other means (SCRAM, a client certificate):
        the roles the users file gives that name, none when it is not there."""
        user = self._user(username)
        return Principal(username, user.roles if user is not None else frozenset())

    def _user(self, username: str) -> Any:
        try:
            self.users.reload()
        except UsersFileError as exc:  # a broken edit: keep the users we had, say why
            self.audit.error("users file not reloaded", reason=str(exc))
        return self.users.get(username)

    def logged_in(self, principal: Principal, peer: str, mechanism: str) -> None:
        self.audit.info("login", user=principal.name, peer=peer, mechanism=mechanism)

    def login_failed(self, username: str, peer: str, mechanism: str, reason: str) -> None:
        """Record a refused login: who it claimed to be and from where, never a password."""
        self.audit.warning(
            "login failed", user=username, peer=peer, mechanism=mechanism, reason=reason
        )

    # ------------------------------------------------------------------ authorization

    def allowed(self, principal: Principal | None, permission: str, address: str) -> bool:
        """True when `principal` (None: anonymous) holds `permission` on `address`."""
        if not self.enforcing:
            return True
        if permission not in PERMISSIONS:
            raise ValueError(
                f"unknown permission {permission!r}; known permissions: {', '.join(PERMISSIONS)}"
            )
        matches = self._grants.match(address)
        if not matches:
            return False
        roles = matches[0].get(permission)
        who = principal if principal is not None else self.anonymous
        return roles is not None and not roles.isdisjoint(who.roles)

    def check(self, principal: Principal | None, permission: str, address: str) -> None:
        """Raise Unauthorized (and audit it) unless `principal` holds `permission` on
        `address`."""
        if self.allowed(principal, permission, address):
            return
        name = principal.name if principal is not None else ANONYMOUS
        self.audit.warning("refused", user=name, permission=permission, address=address)
        raise Unauthorized(f"user '{name}' lacks permission '{permission}' on address '{address}'")

    # ------------------------------------------------------------------ connection limits

    def admit(self, principal: Principal | None) -> None:
        """Count an opening connection of `principal`; ResourceLimitExceeded past
        max-connections or max-connections-per-user (then nothing is counted)."""
        name = principal.name if principal is not None else ANONYMOUS
        if 0 <= self.max_connections <= self.connections:
            self.audit.warning("connection refused", user=name, limit="max-connections")
            raise ResourceLimitExceeded(
                f"the broker has its max-connections ({self.max_connections}) open"
            )
        held = self._per_user.get(name, 0)
        if 0 <= self.max_connections_per_user <= held:
            self.audit.warning("connection refused", user=name, limit="max-connections-per-user")
            raise ResourceLimitExceeded(
                f"user '{name}' has its max-connections-per-user "
                f"({self.max_connections_per_user}) open"
            )
        self.connections += 1
        self._per_user[name] = held + 1

    def take_socket(self, peer: str) -> bool:
        """Count an accepted client socket; False when it must be closed at once: the
        open-file limit leaves no more for client sockets (logged, at most every
        `SOCKETS_WARNING_PERIOD` seconds, with how many were refused meanwhile)."""
        if self.sockets < self.max_sockets:
            self.sockets += 1
            return True
        self.sockets_refused += 1
        self._unreported += 1
        now = time.monotonic()
        if now - self._reported_at >= SOCKETS_WARNING_PERIOD:
            structlog.get_logger().warning(  # the broker's log: an operator's matter
                "connection refused",
                peer=peer,
                limit="open files",
                refused=self._unreported,
                reason=(
                    f"{self.sockets} client sockets open, the most the open-file limit "
                    f"({self.file_limit}) allows with {self.file_limit - self.max_sockets} "
                    "kept for storage; raise it (ulimit -n, systemd's LimitNOFILE) to allow more"
                ),
            )
            self._unreported = 0
            self._reported_at = now
        return False

    def socket_closed(self) -> None:
        """A socket `take_socket` counted is closed."""
        self.sockets -= 1

    def release(self, principal: Principal | None) -> None:
        """A connection `admit` counted has closed."""
        name = principal.name if principal is not None else ANONYMOUS
        self.connections -= 1
        left = self._per_user.get(name, 1) - 1
        if left > 0:
            self._per_user[name] = left
        else:
            self._per_user.pop(name, None)

    # ------------------------------------------------------------------ management

    def management_action(self, principal: Principal | None, action: str, **details: Any) -> None:
        """Record a management action that changed something."""
        name = principal.name if principal is not None else ANONYMOUS
        self.audit.info("management", user=name, action=action, **details)
