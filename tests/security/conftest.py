"""Fixtures: a broker with a users file, security settings and (optionally) TLS."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.security.helpers import Pki, make_pki, users_file


class Secured:
    """A running broker plus where its users and audit log live."""

    def __init__(self, broker: Any, audit: Path, users: Path) -> None:
        self.broker = broker
        self.audit_path = audit
        self.users = users

    @property
    def url(self) -> str:
        return self.broker.url

    def audit(self) -> list[dict[str, Any]]:
        """The audit log's records so far."""
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line]

    @property
    def tls_port(self) -> int:
        server = self.broker.server.protocols["amqp"]  # type: ignore[union-attr]
        return int(server.bound_tls[0][1])


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secured(scow_broker: Any, tmp_path: Path) -> Callable[..., Secured]:
    """Factory: secured(users={name: (password, roles)}, permissions={pattern: {...}},
    security={...}, amqp={...}, tls={...}, plugins=[...])."""

    def start(
        *,
        users: Mapping[str, tuple[str, Iterable[str]]] | None = None,
        permissions: Mapping[str, Mapping[str, list[str]]] | None = None,
        security: Mapping[str, Any] | None = None,
        amqp: Mapping[str, Any] | None = None,
        tls: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Secured:
        n = len(list(tmp_path.glob("users-*.toml")))
        path = users_file(tmp_path / f"users-{n}.toml", users or {})
        audit = tmp_path / f"audit-{n}.jsonl"
        sections: dict[str, dict[str, Any]] = {
            "security": {
                "users-file": str(path),
                "audit-log": str(audit),
                "login-failure-delay": 0,
                **(security or {}),
            },
            **({"amqp": dict(amqp)} if amqp else {}),
            **({"tls": dict(tls)} if tls else {}),
            **(
                {"security-settings": {k: dict(v) for k, v in permissions.items()}}
                if permissions
                else {}
            ),
        }
        extra = kwargs.pop("sections", {})
        for name, table in extra.items():
            sections.setdefault(name, {}).update(table)
        return Secured(scow_broker(sections=sections, **kwargs), audit, path)

    return start
