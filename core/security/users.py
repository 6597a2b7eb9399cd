"""The users file: who may log in, their roles, and a SCRAM credential instead of a password.

A TOML file, one table per user, written by `scow user add/remove`:

    [users.alice]
    roles = ["producers"]
    iterations = 4096
    salt = "base64"
    stored-key = "base64"
    server-key = "base64"

Only the credential is kept (see `scow.core.security.scram`): from it both SASL PLAIN and
SCRAM-SHA-256 logins are checked. The broker reads the file again when it changes, so
users added while it runs can log in at once.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from scow.core.security.scram import DEFAULT_ITERATIONS, Credential

_NAME = re.compile(r"[^\x00-\x20\x7f]{1,255}")
_HEADER = (
    "# Scow users: written by `scow user add/remove`. Each user has roles and a\n"
    "# SCRAM-SHA-256 credential (salt, iterations, StoredKey, ServerKey), never a password.\n"
)


class UsersFileError(ValueError):
    """The users file cannot be read or holds an entry that is not valid."""


@dataclass(frozen=True)
class User:
    """One entry: a name, its roles, and the credential its password is checked against."""

    name: str
    roles: frozenset[str]
    credential: Credential


def check_name(name: str) -> str:
    """`name` when it can be a user name (1-255 printable characters, no spaces)."""
    if not _NAME.fullmatch(name):
        raise UsersFileError(
            f"user name {name!r} is not accepted: use 1-255 printable characters, no spaces"
        )
    return name


def read_users(path: Path) -> dict[str, User]:
    """Every user in the file; an absent file has none."""
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UsersFileError(f"{path}: cannot read the users file: {exc.strerror}") from None
    try:
        table = tomllib.loads(text).get("users", {})
    except tomllib.TOMLDecodeError as exc:
        raise UsersFileError(f"{path}: invalid TOML: {exc}") from None
    return {name: _user(path, name, entry) for name, entry in table.items()}


def _user(path: Path, name: str, entry: object) -> User:
    where = f"{path}: [users.{name}]"
    if not isinstance(entry, dict):
        raise UsersFileError(f"{where} must be a table")
    keys = {"roles", "iterations", "salt", "stored-key", "server-key"}
    unknown = sorted(set(entry) - keys)
    missing = sorted(keys - set(entry) - {"roles"})
    if unknown or missing:
        raise UsersFileError(
            f"{where}: "
            + (f"unknown key(s) {', '.join(unknown)}; " if unknown else "")
            + (f"missing {', '.join(missing)}; " if missing else "")
            + f"expected {', '.join(sorted(keys))} (a plain password is never accepted)"
        )
    roles = entry.get("roles", [])
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise UsersFileError(f"{where}: roles = {roles!r}: expected a list of strings")
    iterations = entry["iterations"]
    if not isinstance(iterations, int) or iterations < 1:
        raise UsersFileError(f"{where}: iterations = {iterations!r}: expected an integer >= 1")
    try:
        salt, stored, server = (
            base64.b64decode(str(entry[k]), validate=True)
            for k in ("salt", "stored-key", "server-key")
        )
    except (binascii.Error, ValueError):
        raise UsersFileError(f"{where}: salt, stored-key and server-key must be base64") from None
    if len(stored) != 32 or len(server) != 32:
        raise UsersFileError(f"{where}: stored-key and server-key must be 32 bytes (SHA-256)")
    return User(check_name(name), frozenset(roles), Credential(salt, iterations, stored, server))


def write_users(path: Path, users: Iterable[User]) -> None:
    """Replace the file with `users`, atomically, readable by its owner only."""
    lines = [_HEADER]
    for user in sorted(users, key=lambda u: u.name):
        c = user.credential
        roles = ", ".join(_quote(r) for r in sorted(user.roles))
        lines.append(
            f"\n[users.{_quote(user.name)}]\n"
            f"roles = [{roles}]\n"
            f"iterations = {c.iterations}\n"
            f'salt = "{_b64(c.salt)}"\n'
            f'stored-key = "{_b64(c.stored_key)}"\n'
            f'server-key = "{_b64(c.server_key)}"\n'
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("".join(lines))
    os.replace(tmp, path)


def add_user(
    path: Path,
    name: str,
    password: str,
    roles: Iterable[str] = (),
    *,
    iterations: int = DEFAULT_ITERATIONS,
) -> User:
    """Add `name` (or replace its password and roles) in the users file."""
    if not password:
        raise UsersFileError(f"user {name!r}: an empty password is not accepted")
    users = read_users(path)
    user = User(
        check_name(name),
        frozenset(roles),
        Credential.derive(password, iterations=iterations),
    )
    users[name] = user
    write_users(path, users.values())
    return user


def remove_user(path: Path, name: str) -> None:
    """Remove `name`; UsersFileError naming the users there when it is not one."""
    users = read_users(path)
    if name not in users:
        known = ", ".join(sorted(users)) or "none"
        raise UsersFileError(f"{path}: no user {name!r} (users: {known})")
    del users[name]
    write_users(path, users.values())


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class UsersFile:
    """The users file as the broker reads it: reloaded when its modification time changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, User] = {}
        self.reload()

    def reload(self) -> None:
        """Read the file again if it changed (raises UsersFileError when it is broken)."""
        if self.path is None:
            return
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = (0, 0)
        if stamp != self._stamp:
            self._users = read_users(self.path)
            self._stamp = stamp

    def get(self, name: str) -> User | None:
        return self._users.get(name)

    def __len__(self) -> int:
        return len(self._users)
