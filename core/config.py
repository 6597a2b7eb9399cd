"""The broker's TOML configuration, checked against sections the kernel and plugins declare.

Each section (`[broker]`, `[amqp]`, ...) is declared as a `ConfigSection` of `Setting`s;
the kernel declares its own (`core_sections`) and each plugin contributes more. Loading
rejects unknown sections and keys (with a close-match suggestion) and badly typed values,
and fills in defaults, so the rest of the broker reads settled values only.
`[address-settings."<pattern>"]` tables are checked by `AddressSettingsRepository`.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import difflib
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from types import MappingProxyType
from typing import Any

from scow.core.address_settings import (
    AddressSettingsRepository,
    SettingError,
    parse_duration_ms,
    parse_size,
    validate_settings,
)
from scow.core.duplicates import DEFAULT_ID_CACHE_SIZE
from scow.core.large_messages import DEFAULT_DIRECTORY as LARGE_MESSAGES_DIRECTORY

__all__ = [
    "ADDRESS_SETTINGS_SECTION",
    "DEFAULT_PLUGINS",
    "PERMISSIONS",
    "QUEUES_SECTION",
    "SECURITY_SETTINGS_SECTION",
    "Config",
    "ConfigError",
    "ConfigSection",
    "Setting",
    "core_sections",
    "default_config_path",
    "load_config",
    "parse_host_port",
    "read_plugin_list",
]

ADDRESS_SETTINGS_SECTION = "address-settings"
DEFAULT_PLUGINS: tuple[str, ...] = (
    "amqp",
    "file-journal",
    "standard-queues",
    "priority-queues",
    "last-value-queues",
    "qpid-paged-queues",
    "full-policies",
    "paging",
    "spark",
)

_KINDS = ("plain", "size", "duration-ms", "host-port-list")

_TYPE_WORDS: dict[type, str] = {
    bool: "a boolean (true or false)",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a table",
}


def _describe(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(_TYPE_WORDS.get(t, t.__name__) for t in ts)


def _suggest(word: str, candidates: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def parse_host_port(text: str) -> tuple[str, int]:
    """Split "host:port" (IPv6 as "[::1]:5672"; empty host = every interface)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.%\w]+)\]:(\d+)|([^:\[\]\s]*):(\d+)", text)
    if m is None:
        raise ValueError(f"{text!r} is not host:port")
    host = m.group(1) if m.group(1) is not None else m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: port {port} is outside 0-65535")
    return host, port


# --------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class Setting:
    """One key of a config section.

    `type` is the Python type (or types) the TOML value must have; for the kinds "size",
    "duration-ms" and "host-port-list" the kind decides and `type` is informative.
    `item_type` checks the items of a list or the values of a table. `minimum` bounds
    integers (after unit conversion).
    """

    name: str
    type: type | tuple[type, ...]
    default: object
    doc: str
    choices: tuple[object, ...] | None = None
    kind: str = "plain"
    item_type: builtins.type | tuple[builtins.type, ...] | None = None
    minimum: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(
                f"setting {self.name!r}: unknown kind {self.kind!r}; use one of {_KINDS}"
            )

    def validate(self, value: object) -> object:
        """The normalized value; ValueError saying what is accepted otherwise."""
        kind = self.kind
        if kind == "size":
            result: object = self._check_minimum(self._units(parse_size, value))
        elif kind == "duration-ms":
            result = self._check_minimum(self._units(parse_duration_ms, value))
        elif kind == "host-port-list":
            result = self._host_ports(value)
        else:
            result = self._plain(value)
        return result

    def _units(self, parse: Callable[[object, str], int], value: object) -> int:
        try:
            return parse(value, self.name)
        except SettingError as e:
            # The parser's message starts with "name = value: "; keep what follows.
            raise ValueError(str(e).split(": ", 1)[-1]) from None

    def _check_minimum(self, value: int) -> int:
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"expected a value >= {self.minimum}")
        return value

    def _host_ports(self, value: object) -> list[str]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError('expected a list of "host:port" strings, e.g. ["localhost:5672"]')
        for item in items:
            try:
                parse_host_port(item)
            except ValueError as e:
                raise ValueError(
                    f'{e}; expected "host:port", e.g. "localhost:5672", "0.0.0.0:5672", '
                    '"[::1]:5672"'
                ) from None
        return list(items)

    def _plain(self, value: object) -> object:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if isinstance(value, bool) and bool not in types:
            raise ValueError(f"expected {_describe(self.type)}")
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and float in types
            and int not in types
        ):
            value = float(value)
        if not isinstance(value, types):
            raise ValueError(f"expected {_describe(self.type)}")
        if self.item_type is not None and isinstance(value, (list, dict)):
            item_types = self.item_type if isinstance(self.item_type, tuple) else (self.item_type,)
            items = value.values() if isinstance(value, dict) else value
            for item in items:
                if not isinstance(item, item_types) or (
                    isinstance(item, bool) and bool not in item_types
                ):
                    what = "list items" if isinstance(value, list) else "table values"
                    raise ValueError(
                        f"expected {what} to be {_describe(self.item_type)}; {item!r} is not"
                    )
        if self.choices is not None:
            if isinstance(value, list):
                value = [self._choice(v) for v in value]
            else:
                value = self._choice(value)
        if self.minimum is not None and isinstance(value, (int, float)):
            self._check_minimum(value)  # type: ignore[arg-type]
        return value

    def _choice(self, value: object) -> object:
        assert self.choices is not None
        if value in self.choices:
            return value
        if isinstance(value, str):
            # Case-insensitive, returning the declared spelling.
            for c in self.choices:
                if isinstance(c, str) and c.lower() == value.lower():
                    return c
        accepted = ", ".join(repr(c) for c in self.choices)
        hint = None
        if isinstance(value, str):
            hint = _suggest(value, [c for c in self.choices if isinstance(c, str)])
        raise ValueError(
            f"expected one of {accepted}" + (f"; did you mean {hint!r}?" if hint else "")
        )


@dataclass(frozen=True)
class ConfigSection:
    """A top-level table of the config file and the settings it accepts.

    With `open_keys`, keys not declared are accepted as given (user-defined names).
    """

    name: str
    settings: tuple[Setting, ...]
    doc: str
    open_keys: bool = False

    def setting(self, key: str) -> Setting | None:
        for s in self.settings:
            if s.name == key:
                return s
        return None


class ConfigError(ValueError):
    """A config file or override was rejected.

    The message starts with where (file, or file:line:column for syntax errors), then the
    section and key, the value, what would be accepted and, when one is close, a suggestion.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        section: str | None = None,
        key: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        where = str(path) if path is not None else "config"
        if line is not None:
            where += f":{line}" + (f":{column}" if column is not None else "")
        super().__init__(f"{where}: {message}")
        self.path = path
        self.section = section
        self.key = key
        self.line = line
        self.column = column


# --------------------------------------------------------------------------- kernel sections

BROKER_SECTION = ConfigSection(
    "broker",
    (
        Setting("name", str, "scow", "Name of this broker, reported to clients and in logs."),
        Setting(
            "data-dir",
            str,
            "./data",
            "Directory for the journal and page files, relative to the working directory.",
        ),
        Setting(
            "persistence-enabled",
            bool,
            True,
            "Write durable messages to the journal; false keeps everything in memory only.",
        ),
        Setting(
            "journal",
            str,
            "",
            "Journal backend by name (file, memory, ...); empty: the one enabled journal plugin.",
        ),
        Setting(
            "id-cache-size",
            int,
            DEFAULT_ID_CACHE_SIZE,
            "Duplicate detection: _AMQ_DUPL_ID values each address remembers unless its address "
            "settings say: at least its last id-cache-size, at most twice as many (the oldest "
            "are forgotten id-cache-size at a time); 0 turns detection off.",
            minimum=0,
        ),
        Setting(
            "persist-id-cache",
            bool,
            True,
            "Journal the duplicate-id caches with the messages they admit, so that they "
            "survive a restart or a crash; false keeps them in memory only.",
        ),
        Setting(
            "large-messages-directory",
            str,
            LARGE_MESSAGES_DIRECTORY,
            "Directory of large messages' bodies (one file each), relative to data-dir.",
        ),
        Setting(
            "large-message-sync",
            bool,
            True,
            "Sync a durable large message's file before the message is accepted; false "
            "leaves it to the operating system (a crash may lose accepted large messages).",
        ),
        Setting(
            "message-expiry-scan-period",
            int,
            30000,
            "How often (ms) queues are scanned for expired messages; -1 turns the scan off.",
            kind="duration-ms",
            minimum=-1,
        ),
        Setting(
            "global-max-size",
            (int, str),
            -1,
            "Memory (estimated bytes) all addresses together may hold before each applies its "
            "address-full-policy; -1 derives it: 1/16 of the memory the broker may use "
            "(physical memory, or its cgroup's limit in a container), at most 128MiB.",
            kind="size",
            minimum=-1,
        ),
        Setting(
            "global-max-messages",
            int,
            -1,
            "Messages all addresses together may hold in memory before each applies its "
            "address-full-policy; -1 is unlimited.",
            minimum=-1,
        ),
        Setting(
            "max-disk-usage",
            int,
            90,
            "Percent of a storage file system in use past which every producer is blocked; "
            "-1 turns the check off.",
            minimum=-1,
        ),
        Setting(
            "min-disk-free",
            (int, str),
            -1,
            "Free bytes below which every producer is blocked; wins over max-disk-usage; -1 "
            "is unset.",
            kind="size",
            minimum=-1,
        ),
        Setting(
            "disk-scan-period",
            (int, str),
            5000,
            "How often (ms) the disk monitor checks the storage file systems.",
            kind="duration-ms",
            minimum=1,
        ),
        Setting(
            "log-format",
            str,
            "console",
            "Log output: console (human) or json.",
            choices=("console", "json"),
        ),
        Setting(
            "log-level",
            str,
            "info",
            "Least severe log level written.",
            choices=("debug", "info", "warning", "error"),
        ),
    ),
    "The broker as a whole.",
)

PLUGINS_SECTION = ConfigSection(
    "plugins",
    (
        Setting(
            "enable",
            list,
            list(DEFAULT_PLUGINS),
            "Names of the installed plugins to load; an installed plugin not listed is off.",
            item_type=str,
        ),
    ),
    "Which plugins make up the broker.",
)

SECURITY_SECTION = ConfigSection(
    "security",
    (
        Setting(
            "allow-anonymous",
            bool,
            True,
            "Accept connections that do not authenticate (SASL ANONYMOUS or none).",
        ),
        Setting(
            "users-file",
            str,
            "",
            "The users file (`scow user add` writes it): names, roles and SCRAM-SHA-256 "
            "credentials, never passwords. Relative to the working directory; empty: no users.",
        ),
        Setting(
            "anonymous-roles",
            list,
            [],
            "Roles an anonymous client has where [security-settings] apply.",
            item_type=str,
        ),
        Setting(
            "login-failure-delay",
            (int, str),
            500,
            "How long (ms) a failed login waits before it is answered.",
            kind="duration-ms",
            minimum=0,
        ),
        Setting(
            "max-connections",
            int,
            -1,
            "Client connections open at once, all protocols together; -1 is unlimited.",
            minimum=-1,
        ),
        Setting(
            "max-connections-per-user",
            int,
            -1,
            "Connections one user (anonymous counts as one) may have open; -1 is unlimited.",
            minimum=-1,
        ),
        Setting(
            "audit-log",
            str,
            "",
            "File for the audit log (logins, refusals, management actions) as JSON lines; "
            "empty: the broker's log, logger scow.audit.",
        ),
    ),
    "Authentication, connection limits and the audit log.",
)

SECURITY_SETTINGS_SECTION = "security-settings"

#: Permissions a `[security-settings."pattern"]` table grants to roles (Artemis's names).
PERMISSIONS: tuple[str, ...] = (
    "send",
    "consume",
    "browse",
    "createAddress",
    "deleteAddress",
    "createDurableQueue",
    "deleteDurableQueue",
    "createNonDurableQueue",
    "deleteNonDurableQueue",
    "manage",
)

SECURITY_SETTINGS_CONFIG_SECTION = ConfigSection(
    SECURITY_SETTINGS_SECTION,
    (),
    'Permissions per address pattern: [security-settings."orders.#"] send = ["producers"]; '
    "the most specific matching pattern decides. With none, every client may do anything.",
    open_keys=True,
)

TLS_SECTION = ConfigSection(
    "tls",
    (
        Setting("cert-file", str, "", "The server's certificate chain (PEM)."),
        Setting("key-file", str, "", "The server certificate's private key (PEM)."),
        Setting(
            "ca-file",
            str,
            "",
            "CA certificates (PEM) that client certificates must chain to; empty: the system's.",
        ),
        Setting(
            "min-version",
            str,
            "TLSv1.2",
            "Oldest TLS version accepted.",
            choices=("TLSv1.2", "TLSv1.3"),
        ),
        Setting(
            "need-client-auth",
            bool,
            False,
            "Refuse TLS clients without a certificate the ca-file vouches for.",
        ),
        Setting(
            "want-client-auth",
            bool,
            False,
            "Ask TLS clients for a certificate (for SASL EXTERNAL) but accept them without.",
        ),
    ),
    "TLS for the listeners that ask for it ([amqp] listen-tls).",
)

HA_SECTION = ConfigSection(
    "ha",
    (
        Setting(
            "policy",
            str,
            "",
            "This broker's part in a pair sharing one store (the data dir, or the database): "
            '"primary" or "backup"; empty: no HA (the store is this broker\'s alone).',
            choices=("", "primary", "backup"),
        ),
        Setting(
            "allow-failback",
            bool,
            True,
            "A primary that comes back while the backup serves asks for the store back; the "
            "backup hands over and waits again.",
        ),
        Setting(
            "failover-on-shutdown",
            bool,
            False,
            "A clean stop of the serving broker lets the other take over (false: only a crash "
            "or a lost lock does).",
        ),
        Setting(
            "lock-poll-period",
            int,
            200,
            "How often (ms) a waiting broker tries the store's lock and a serving one checks "
            "whether it must hand over.",
            kind="duration-ms",
            minimum=10,
        ),
        Setting(
            "url",
            str,
            "",
            "The AMQP URL clients reach this broker at, announced to the other member for its "
            "failover-server-list; empty: amqp://<this host>:<first [amqp] listen port>.",
        ),
    ),
    "High availability: a primary and a backup over a shared store (Artemis's shared-store HA).",
)

ADDRESS_SETTINGS_CONFIG_SECTION = ConfigSection(
    ADDRESS_SETTINGS_SECTION,
    (),
    'Settings per address pattern: [address-settings."orders.#"]; the most specific '
    "matching pattern wins key by key.",
    open_keys=True,
)


QUEUES_SECTION = "queues"

#: The keys of one `[queues."name"]` table.
QUEUE_SETTINGS = ConfigSection(
    "queues.<name>",
    (
        Setting("address", str, None, "The address the queue is bound to; default: its name."),
        Setting(
            "routing-type",
            str,
            None,
            "ANYCAST or MULTICAST; default: the address's default-queue-routing-type.",
            choices=("ANYCAST", "MULTICAST"),
        ),
        Setting("durable", bool, True, "Kept, with its durable messages, across restarts."),
        Setting("filter", str, None, "Selector: only messages it matches enter the queue."),
        Setting(
            "arguments",
            dict,
            {},
            "Queue arguments choosing its type and tuning it, e.g. "
            '{ "qpid.priorities" = 10 } or { "last-value-key" = "stock" }.',
        ),
        Setting("max-consumers", int, -1, "Consumers at once; -1 is unlimited.", minimum=-1),
        Setting(
            "exclusive", bool, None, "One consumer receives at a time; default: the address's."
        ),
        Setting(
            "non-destructive",
            bool,
            None,
            "Consumers see messages without taking them; default: the address's.",
        ),
    ),
    "One queue.",
)

QUEUES_CONFIG_SECTION = ConfigSection(
    QUEUES_SECTION,
    (),
    'Queues created at startup when missing: [queues."orders"] with the keys of queues.<name>.',
    open_keys=True,
)


def core_sections() -> list[ConfigSection]:
    """The sections the kernel itself declares."""
    return [
        BROKER_SECTION,
        PLUGINS_SECTION,
        SECURITY_SECTION,
        SECURITY_SETTINGS_CONFIG_SECTION,
        TLS_SECTION,
        HA_SECTION,
        ADDRESS_SETTINGS_CONFIG_SECTION,
        QUEUES_CONFIG_SECTION,
    ]


def _queues(table: Mapping[str, object], source: Path | str) -> dict[str, dict[str, object]]:
    """Each `[queues."name"]` table checked, with its defaults filled."""
    queues: dict[str, dict[str, object]] = {}
    for name, settings in table.items():
        if not isinstance(settings, Mapping):
            raise ConfigError(
                f"[{QUEUES_SECTION}] {name} = {settings!r}: expected a table per queue, "
                f'e.g. [{QUEUES_SECTION}."orders"] address = "orders"',
                path=source,
                section=QUEUES_SECTION,
                key=name,
            )
        section = dataclasses.replace(QUEUE_SETTINGS, name=f'{QUEUES_SECTION}."{name}"')
        filled = {s.name: copy.deepcopy(s.default) for s in section.settings}
        filled.update(_validate_table(section, settings, source))
        if filled["address"] is None:
            filled["address"] = name
        queues[name] = filled
    return queues


def _security_settings(
    table: Mapping[str, object], source: Path | str
) -> dict[str, dict[str, list[str]]]:
    """Each `[security-settings."pattern"]` table: permission names -> lists of roles."""
    out: dict[str, dict[str, list[str]]] = {}
    for pattern, grants in table.items():
        where = f'[{SECURITY_SETTINGS_SECTION}."{pattern}"]'
        if not isinstance(grants, Mapping):
            raise ConfigError(
                f'{where} = {grants!r}: expected a table of permissions, e.g. send = ["producers"]',
                path=source,
                section=SECURITY_SETTINGS_SECTION,
                key=pattern,
            )
        checked: dict[str, list[str]] = {}
        for permission, roles in grants.items():
            if permission not in PERMISSIONS:
                hint = _suggest(permission, PERMISSIONS)
                raise ConfigError(
                    f"{where} unknown permission {permission!r}"
                    + (f"; did you mean {hint!r}?" if hint else "")
                    + f" known permissions: {', '.join(PERMISSIONS)}",
                    path=source,
                    section=SECURITY_SETTINGS_SECTION,
                    key=permission,
                )
            if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
                raise ConfigError(
                    f"{where} {permission} = {roles!r}: expected a list of role names",
                    path=source,
                    section=SECURITY_SETTINGS_SECTION,
                    key=permission,
                )
            checked[permission] = list(roles)
        out[pattern] = checked
    return out


def default_config_path() -> Path:
    """The packaged default configuration (`scow.config/scow.toml`)."""
    return Path(str(files("scow.config").joinpath("scow.toml")))


# --------------------------------------------------------------------------- loading

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def _read_toml(path: Path) -> dict:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read config file: {e.strerror or e}", path=path) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file is not UTF-8 text: {e}", path=path) from None
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_POSITION.search(msg)
        line = column = None
        if m is not None:
            line, column = int(m.group(1)), int(m.group(2))
            msg = msg[: m.start()]
        raise ConfigError(f"invalid TOML: {msg}", path=path, line=line, column=column) from None


def read_plugin_list(path: Path | None) -> tuple[str, ...]:
    """`[plugins] enable` from the file (the default list when absent or `path` is None).

    Read before the plugins, and so the other sections, are known; names are not checked.
    """
    if path is None:
        return DEFAULT_PLUGINS
    raw = _read_toml(path)
    table = raw.get("plugins", {})
    if not isinstance(table, dict):
        raise ConfigError(
            f"[plugins] must be a table, got plugins = {table!r}", path=path, section="plugins"
        )
    if "enable" not in table:
        return DEFAULT_PLUGINS
    return _check_plugin_list(table["enable"], path)


def _check_plugin_list(value: object, source: Path | str) -> tuple[str, ...]:
    setting = PLUGINS_SECTION.settings[0]
    try:
        names = setting.validate(value)
    except ValueError as e:
        raise ConfigError(
            f"[plugins] enable = {value!r}: {e}", path=source, section="plugins", key="enable"
        ) from None
    assert isinstance(names, list)
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(
                f"[plugins] enable lists {name!r} twice",
                path=source,
                section="plugins",
                key="enable",
            )
        seen.add(name)
    return tuple(names)


class Config:
    """A loaded, validated configuration."""

    def __init__(
        self,
        path: Path | None,
        raw: dict,
        values: dict[str, dict[str, object]],
        address_settings: AddressSettingsRepository,
        sections: Mapping[str, ConfigSection],
    ) -> None:
        self.path = path
        #: The TOML as read from the file (before overrides); {} without a file.
        self.raw = raw
        self.address_settings = address_settings
        self._values = values
        self._sections = dict(sections)

    @property
    def enabled_plugins(self) -> tuple[str, ...]:
        names = self._values["plugins"]["enable"]
        assert isinstance(names, list)
        return tuple(names)

    @property
    def section_names(self) -> list[str]:
        return list(self._sections)

    def section(self, name: str) -> Mapping[str, object]:
        """Validated values of section `name`, defaults filled, kebab-case keys."""
        if name == ADDRESS_SETTINGS_SECTION:
            return MappingProxyType(dict(self.address_settings.items()))
        try:
            return MappingProxyType(self._values[name])
        except KeyError:
            hint = _suggest(name, list(self._sections))
            raise KeyError(
                f"no config section [{name}]"
                + (f"; did you mean [{hint}]?" if hint else "")
                + f" known sections: {_list_sections(self._sections)}"
            ) from None

    def effective(self) -> dict[str, dict[str, object]]:
        """Every section with its defaults filled; address settings as configured per pattern.

        Unset optional values are None (TOML has no null: drop them to print as TOML).
        """
        out: dict[str, dict[str, object]] = {}
        for name in self._sections:
            if name == ADDRESS_SETTINGS_SECTION:
                out[name] = dict(self.address_settings.items())
            else:
                out[name] = copy.deepcopy(self._values[name])
        return out


def _list_sections(sections: Mapping[str, ConfigSection]) -> str:
    return ", ".join(f"[{n}]" for n in sorted(sections))


def _collect_sections(plugin_sections: Sequence[ConfigSection]) -> dict[str, ConfigSection]:
    known: dict[str, ConfigSection] = {s.name: s for s in core_sections()}
    for s in plugin_sections:
        existing = known.get(s.name)
        if existing is not None:
            if existing == s:
                continue
            raise ValueError(f"config section [{s.name}] is declared twice")
        known[s.name] = s
    return known


def _check_top_level(
    raw: Mapping[str, object], known: Mapping[str, ConfigSection], source: Path | str
) -> None:
    for name, table in raw.items():
        if name not in known:
            if not isinstance(table, dict):
                owners = [s.name for s in known.values() if s.setting(name) is not None]
                hint = f"; did you mean [{owners[0]}] {name}?" if owners else ""
                raise ConfigError(
                    f"key {name!r} is outside any section{hint} "
                    f"known sections: {_list_sections(known)}",
                    path=source,
                    key=name,
                )
            hint_name = _suggest(name, list(known))
            hint = (
                f"; did you mean [{hint_name}]?"
                if hint_name
                else " (a plugin's section is known only when [plugins] enable lists the plugin)"
            )
            raise ConfigError(
                f"unknown section [{name}]{hint} known sections: {_list_sections(known)}",
                path=source,
                section=name,
            )
        if not isinstance(table, dict):
            raise ConfigError(
                f"[{name}] must be a table, got {name} = {table!r}", path=source, section=name
            )


def _validate_table(
    section: ConfigSection, table: Mapping[str, object], source: Path | str
) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in table.items():
        setting = section.setting(key)
        if setting is None:
            if section.open_keys:
                out[key] = value
                continue
            known = [s.name for s in section.settings]
            hint = _suggest(key, known)
            raise ConfigError(
                f"[{section.name}] unknown key {key!r}"
                + (f"; did you mean {hint!r}?" if hint else "")
                + f" known keys: {', '.join(known) or '(none)'}",
                path=source,
                section=section.name,
                key=key,
            )
        try:
            out[key] = setting.validate(value)
        except ValueError as e:
            raise ConfigError(
                f"[{section.name}] {key} = {value!r}: {e}",
                path=source,
                section=section.name,
                key=key,
            ) from None
    return out


def _address_settings(
    file_table: Mapping[str, object],
    override_table: Mapping[str, object],
    path: Path | str,
) -> AddressSettingsRepository:
    # Each source is validated on its own so an error names the file or the overrides.
    layers: dict[str, dict[str, object]] = {}
    for table, source in ((file_table, path), (override_table, "overrides")):
        for pattern, settings in table.items():
            if not isinstance(settings, Mapping):
                raise ConfigError(
                    f"[{ADDRESS_SETTINGS_SECTION}] {pattern} = {settings!r}: expected a table "
                    f'per address pattern, e.g. [{ADDRESS_SETTINGS_SECTION}."orders.#"]',
                    path=source,
                    section=ADDRESS_SETTINGS_SECTION,
                    key=pattern,
                )
            try:
                checked = validate_settings(settings, f"{ADDRESS_SETTINGS_SECTION} {pattern!r}")
            except SettingError as e:
                raise ConfigError(
                    str(e), path=source, section=ADDRESS_SETTINGS_SECTION, key=e.setting
                ) from None
            layers.setdefault(pattern, {}).update(checked)
    repo = AddressSettingsRepository()
    for pattern, layer in layers.items():
        repo.add(pattern, layer)
    return repo


def load_config(
    path: Path | None,
    sections: Sequence[ConfigSection],
    overrides: Mapping[str, Mapping[str, object]] | None = None,
) -> Config:
    """Read, validate and complete the configuration.

    `sections` are the plugins' sections; the kernel's own are always included. `path`
    None means no file: defaults only. `overrides` ({section: {key: value}}, e.g. from CLI
    flags) are validated like the file and win over it; a None value is skipped (a flag
    that was not given).
    """
    known = _collect_sections(sections)
    source: Path | str = path if path is not None else "defaults"
    raw = _read_toml(path) if path is not None else {}
    _check_top_level(raw, known, source)
    cleaned = {
        sec: {k: v for k, v in table.items() if v is not None}
        for sec, table in (overrides or {}).items()
    }
    _check_top_level(cleaned, known, "overrides")

    values: dict[str, dict[str, object]] = {}
    for name, section in known.items():
        if name == ADDRESS_SETTINGS_SECTION:
            continue
        if name == SECURITY_SETTINGS_SECTION:
            grants: dict[str, object] = {}
            grants.update(_security_settings(raw.get(name, {}), source))
            grants.update(_security_settings(cleaned.get(name, {}), "overrides"))
            values[name] = grants
            continue
        if name == QUEUES_SECTION:
            queues: dict[str, object] = {}
            queues.update(_queues(raw.get(name, {}), source))
            queues.update(_queues(cleaned.get(name, {}), "overrides"))
            values[name] = queues
            continue
        from_file = _validate_table(section, raw.get(name, {}), source)
        from_overrides = _validate_table(section, cleaned.get(name, {}), "overrides")
        filled = {s.name: copy.deepcopy(s.default) for s in section.settings}
        filled.update(from_file)
        filled.update(from_overrides)
        values[name] = filled

    # Reject duplicates in the plugin list here too (read_plugin_list runs first in the CLI).
    _check_plugin_list(values["plugins"]["enable"], source)
    address_settings = _address_settings(
        raw.get(ADDRESS_SETTINGS_SECTION, {}),
        cleaned.get(ADDRESS_SETTINGS_SECTION, {}),
        source,
    )
    return Config(path, raw, values, address_settings, known)


# --------------------------------------------------------------------------- writing


def to_toml(tables: Mapping[str, Any], prefix: str = "") -> str:
    """Render {section: {key: value}} as TOML; nested tables become [a."b"] headers."""
    lines: list[str] = []
    nested: list[tuple[str, dict[str, Any]]] = []
    for key, value in tables.items():
        if value is None:
            continue
        if isinstance(value, dict) and prefix == "":
            nested.append((key, value))
        elif isinstance(value, dict):
            nested.append((f"{prefix}.{_key(key)}", value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    for name, table in nested:
        body = to_toml(table, name)
        lines.append(f"\n[{name}]\n{body}".rstrip())
    return "\n".join(lines)


def _key(key: str) -> str:
    return key if key.replace("-", "").replace("_", "").isalnum() else f'"{key}"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)
