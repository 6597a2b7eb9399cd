"""Per-address settings (Artemis names and defaults), merged across matching patterns.

Settings are configured per address pattern (`[address-settings."orders.#"]`). For one
address, every matching pattern contributes a layer: a key set in a more specific layer
wins, a key it leaves unset falls through to the next less specific layer, and a key set
nowhere takes its default below.

Size settings accept an integer byte count or a string with a unit: `KiB`/`MiB`/`GiB`/
`TiB` and the bare `K`/`M`/`G`/`T` (as Artemis) are powers of 1024; `KB`/`MB`/`GB`/`TB`
are powers of 1000. Durations are integer milliseconds or strings such as `250ms`, `30s`,
`5m`, `2h`, `1d`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from scow.core.wildcard import HierarchicalRepository, WildcardMatcher

__all__ = [
    "ADDRESS_FULL_POLICIES",
    "ADDRESS_SETTING_DOCS",
    "PAGE_FULL_POLICIES",
    "ROUTING_TYPES",
    "AddressSettings",
    "AddressSettingsRepository",
    "SettingError",
    "parse_duration_ms",
    "parse_size",
    "validate_settings",
]

#: PAGE, DROP, FAIL, BLOCK, or the name of a policy a plugin registers.
AddressFullPolicy = str
RoutingType = Literal["ANYCAST", "MULTICAST"]

ADDRESS_FULL_POLICIES: tuple[str, ...] = ("PAGE", "DROP", "FAIL", "BLOCK")
PAGE_FULL_POLICIES: tuple[str, ...] = ("DROP", "FAIL")
ROUTING_TYPES: tuple[str, ...] = ("ANYCAST", "MULTICAST")

DEFAULT_PAGE_SIZE_BYTES = 10 * 1024 * 1024


class SettingError(ValueError):
    """A setting's name or value was rejected; the message says what would be accepted."""

    def __init__(self, message: str, *, setting: str | None = None, value: object = None):
        super().__init__(message)
        self.setting = setting
        self.value = value


# --------------------------------------------------------------------------- units

_SIZE_UNITS: dict[str, int] = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):
    for _suffix in (_p, _p + "i", _p + "ib"):
        _SIZE_UNITS[_suffix] = 1024**_i
    _SIZE_UNITS[_p + "b"] = 1000**_i

_DURATION_UNITS: dict[str, int] = {
    "": 1,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}

_NUMBER_WITH_UNIT = re.compile(r"^\s*(-?[0-9][0-9_]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")

_SIZE_ACCEPTED = "an integer byte count or a string such as '10MiB', '512KiB', '1GB', '512K'"
_DURATION_ACCEPTED = "integer milliseconds or a string such as '250ms', '30s', '5m', '2h'"


def _parse_with_units(
    value: object, setting_name: str, units: Mapping[str, int], accepted: str
) -> int:
    if isinstance(value, bool):
        raise SettingError(
            f"{setting_name} = {value!r}: expected {accepted}", setting=setting_name, value=value
        )
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _NUMBER_WITH_UNIT.match(value)
        if m is not None:
            number, unit = m.group(1).replace("_", ""), m.group(2).lower()
            factor = units.get(unit)
            negative = number.startswith("-")
            # A negative value is only meaningful as the bare "-1" (disabled).
            if factor is not None and (not negative or (unit == "" and number == "-1")):
                if "." in number:
                    return int(float(number) * factor)
                return int(number) * factor
        unit_names = ", ".join(sorted(u for u in units if u))
        raise SettingError(
            f"{setting_name} = {value!r}: expected {accepted} (units: {unit_names})",
            setting=setting_name,
            value=value,
        )
    raise SettingError(
        f"{setting_name} = {value!r}: expected {accepted}, got {type(value).__name__}",
        setting=setting_name,
        value=value,
    )


def parse_size(value: object, setting_name: str) -> int:
    """A byte count from an int or a unit string ("10MiB", "1GB", "512K"); -1 passes through."""
    return _parse_with_units(value, setting_name, _SIZE_UNITS, _SIZE_ACCEPTED)


def parse_duration_ms(value: object, setting_name: str) -> int:
    """Milliseconds from an int or a unit string ("250ms", "30s", "5m", "2h", "1d")."""
    return _parse_with_units(value, setting_name, _DURATION_UNITS, _DURATION_ACCEPTED)


# --------------------------------------------------------------------------- schema


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    kind: str  # "int" | "size" | "duration" | "bool" | "str" | "choice" | "policy"
    default: object
    doc: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    nullable: bool = False  # settings whose default None means "not set"

    @property
    def field(self) -> str:
        return self.name.replace("-", "_")


_SPECS: tuple[_Spec, ...] = (
    # --- paging and full policy
    _Spec("max-size-bytes", "size", -1,
          "Memory an address may hold before its full policy applies; -1 is unlimited.",
          minimum=-1),
    _Spec("max-size-messages", "int", -1,
          "Messages an address may hold before its full policy applies; -1 is unlimited.",
          minimum=-1),
    _Spec("page-size-bytes", "size", DEFAULT_PAGE_SIZE_BYTES,
          "Size of each page file written while the address is paging.", minimum=1),
    _Spec("page-max-cache-size", "int", 5,
          "Accepted for compatibility and not used (as in Artemis since 2.24): each queue "
          "holds only the part of a page it is reading.", minimum=0),
    _Spec("address-full-policy", "policy", "PAGE",
          "What happens when the address is full: PAGE to disk, DROP, FAIL the producer, "
          "BLOCK it, or a policy a plugin provides.", choices=ADDRESS_FULL_POLICIES),
    _Spec("max-read-page-messages", "int", -1,
          "Paged messages read back into memory per queue; -1 is unlimited.", minimum=-1),
    _Spec("max-read-page-bytes", "size", 2 * DEFAULT_PAGE_SIZE_BYTES,
          "Bytes of paged messages read back into memory per queue; defaults to twice "
          "page-size-bytes; -1 is unlimited.", minimum=-1),
    _Spec("prefetch-page-messages", "int", -1,
          "Paged messages read ahead into memory per queue, not counting those being "
          "delivered; defaults to max-read-page-messages.", minimum=-1),
    _Spec("prefetch-page-bytes", "size", 2 * DEFAULT_PAGE_SIZE_BYTES,
          "Bytes of paged messages read ahead into memory per queue, not counting those "
          "being delivered; defaults to max-read-page-bytes.", minimum=-1),
    _Spec("page-limit-bytes", "size", -1,
          "Bytes an address may page to disk before page-full-policy applies; -1 is unlimited.",
          minimum=-1),
    _Spec("page-limit-messages", "int", -1,
          "Messages an address may page to disk before page-full-policy applies; -1 is "
          "unlimited.", minimum=-1),
    _Spec("page-full-policy", "choice", None,
          "What happens when a page limit is reached: DROP or FAIL; unset means no limit "
          "applies.", choices=PAGE_FULL_POLICIES, nullable=True),
    # --- delivery, dead letters and expiry
    _Spec("max-delivery-attempts", "int", 10,
          "Deliveries tried before a message goes to the dead-letter address; -1 is infinite.",
          minimum=-1),
    _Spec("redelivery-delay", "duration", 0,
          "Milliseconds to wait before redelivering a message that was released or rejected.",
          minimum=0),
    _Spec("dead-letter-address", "str", None,
          "Address receiving messages that exhausted max-delivery-attempts; unset drops them.",
          nullable=True),
    _Spec("send-to-dla-on-no-route", "bool", False,
          "Send messages that match no queue to the dead-letter address instead of dropping."),
    _Spec("expiry-address", "str", None,
          "Address receiving expired messages; unset drops them.", nullable=True),
    _Spec("expiry-delay", "duration", -1,
          "Time to live in ms given to messages that arrive without one; -1 leaves them "
          "without.", minimum=-1),
    _Spec("min-expiry-delay", "duration", -1,
          "Lower bound in ms applied to a message's time to live; -1 is no bound.", minimum=-1),
    _Spec("max-expiry-delay", "duration", -1,
          "Upper bound in ms applied to a message's time to live; -1 is no bound.", minimum=-1),
    # --- auto-create and auto-delete
    _Spec("auto-create-addresses", "bool", True,
          "Create an address when a client sends to or consumes from one that does not exist."),
    _Spec("auto-create-queues", "bool", True,
          "Create a queue when a client consumes from or sends to one that does not exist."),
    _Spec("auto-delete-addresses", "bool", True,
          "Delete auto-created addresses once they have no queues."),
    _Spec("auto-delete-addresses-delay", "duration", 0,
          "Milliseconds an auto-created address must stay without queues before deletion.",
          minimum=0),
    _Spec("auto-delete-queues", "bool", True,
          "Delete auto-created queues once they have no consumers and no messages."),
    _Spec("auto-delete-created-queues", "bool", False,
          "Also auto-delete queues that were created explicitly."),
    _Spec("auto-delete-queues-delay", "duration", 0,
          "Milliseconds a queue must stay without consumers before auto-deletion.", minimum=0),
    _Spec("auto-delete-queues-message-count", "int", 0,
          "Auto-delete a queue only when it holds at most this many messages; -1 ignores the "
          "count.", minimum=-1),
    # --- defaults for auto-created addresses and queues
    _Spec("default-address-routing-type", "choice", "MULTICAST",
          "Routing type of auto-created addresses: ANYCAST or MULTICAST.",
          choices=ROUTING_TYPES),
    _Spec("default-queue-routing-type", "choice", "MULTICAST",
          "Routing type of auto-created queues: ANYCAST or MULTICAST.", choices=ROUTING_TYPES),
    _Spec("default-max-consumers", "int", -1,
          "Consumers an auto-created queue accepts at once; -1 is unlimited.", minimum=-1),
    _Spec("default-purge-on-no-consumers", "bool", False,
          "Purge an auto-created queue when its last consumer leaves."),
    _Spec("default-exclusive-queue", "bool", False,
          "New queues deliver every message to one consumer (the first attached) at a time."),
    _Spec("default-non-destructive", "bool", False,
          "New queues are non-destructive: consumers see messages without taking them."),
    _Spec("default-last-value-queue", "bool", False,
          "New queues keep only the last message per last-value key (needs the "
          "'last-value-queues' plugin)."),
    _Spec("default-last-value-key", "str", None,
          "Message property that makes new queues last-value queues keyed by it; with "
          "default-last-value-queue and no key, the key is _AMQ_LVQ_NAME.",
          nullable=True),
    # --- duplicate detection
    _Spec("id-cache-size", "int", None,
          "_AMQ_DUPL_ID values the address remembers for duplicate detection: at least its "
          "last id-cache-size, at most twice as many (the oldest are forgotten id-cache-size "
          "at a time); unset takes [broker] id-cache-size; 0 turns detection off.",
          minimum=0, nullable=True),
)  # fmt: skip

_SPEC_BY_NAME: dict[str, _Spec] = {s.name: s for s in _SPECS}

#: One line of documentation per address setting, keyed by its kebab-case name.
ADDRESS_SETTING_DOCS: dict[str, str] = {s.name: s.doc for s in _SPECS}


def _suggest(word: str, candidates: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def _normalize(spec: _Spec, value: object) -> object:
    """The validated, normalized form of `value`; SettingError (without context) if bad."""
    name, kind = spec.name, spec.kind
    if kind == "size":
        result: Any = parse_size(value, name)
    elif kind == "duration":
        result = parse_duration_ms(value, name)
    elif kind == "int":
        if value is None and spec.nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingError(
                f"{name} = {value!r}: expected an integer", setting=name, value=value
            )
        result = value
    elif kind == "bool":
        if not isinstance(value, bool):
            raise SettingError(
                f"{name} = {value!r}: expected a boolean (true or false)",
                setting=name,
                value=value,
            )
        return value
    elif kind == "str":
        if value is None and spec.nullable:
            return None
        if not isinstance(value, str) or not value:
            raise SettingError(
                f"{name} = {value!r}: expected a non-empty string (an address name)",
                setting=name,
                value=value,
            )
        return value
    elif kind == "choice":
        if value is None and spec.nullable:
            return None
        if isinstance(value, str) and value.upper() in spec.choices:
            return value.upper()
        accepted = ", ".join(spec.choices)
        hint = _suggest(value.upper(), spec.choices) if isinstance(value, str) else None
        raise SettingError(
            f"{name} = {value!r}: expected one of {accepted}"
            + (f"; did you mean {hint!r}?" if hint else ""),
            setting=name,
            value=value,
        )
    elif kind == "policy":  # a plugin may add policies: startup checks the enabled ones
        if not isinstance(value, str) or not value.strip():
            raise SettingError(
                f"{name} = {value!r}: expected a policy name such as {', '.join(spec.choices)}",
                setting=name,
                value=value,
            )
        return value.strip().upper()
    else:  # pragma: no cover - a bug in _SPECS
        raise AssertionError(kind)
    if spec.minimum is not None and result < spec.minimum:
        floor = (
            "-1 (disabled) or a non-negative value"
            if spec.minimum == -1
            else (f"a value >= {spec.minimum}")
        )
        raise SettingError(f"{name} = {value!r}: expected {floor}", setting=name, value=value)
    return result


def validate_settings(mapping: Mapping[str, object], context: str = "address-settings") -> dict:
    """Check names and values of one layer; returns the normalized layer (kebab-case keys).

    `context` starts every error message, e.g. "address-settings 'orders.#'".
    """
    if not isinstance(mapping, Mapping):
        raise SettingError(
            f"{context}: expected a table of settings, got {mapping!r}", value=mapping
        )
    out: dict[str, object] = {}
    for key, value in mapping.items():
        spec = _SPEC_BY_NAME.get(key)
        if spec is None:
            hint = _suggest(str(key), list(_SPEC_BY_NAME))
            tail = (
                f"; did you mean {hint!r}?"
                if hint
                else f"; known settings: {', '.join(sorted(_SPEC_BY_NAME))}"
            )
            raise SettingError(f"{context}: unknown setting {key!r}{tail}", setting=str(key))
        try:
            out[key] = _normalize(spec, value)
        except SettingError as e:
            raise SettingError(f"{context}: {e}", setting=key, value=value) from None
    return out


# --------------------------------------------------------------------------- the settings


@dataclass(frozen=True, slots=True)
class AddressSettings:
    """The effective settings of one address. Field names are the snake_case settings."""

    max_size_bytes: int = -1
    max_size_messages: int = -1
    page_size_bytes: int = DEFAULT_PAGE_SIZE_BYTES
    page_max_cache_size: int = 5
    address_full_policy: AddressFullPolicy = "PAGE"
    max_read_page_messages: int = -1
    max_read_page_bytes: int = 2 * DEFAULT_PAGE_SIZE_BYTES
    prefetch_page_messages: int = -1
    prefetch_page_bytes: int = 2 * DEFAULT_PAGE_SIZE_BYTES
    page_limit_bytes: int = -1
    page_limit_messages: int = -1
    page_full_policy: Literal["DROP", "FAIL"] | None = None
    max_delivery_attempts: int = 10
    redelivery_delay: int = 0
    dead_letter_address: str | None = None
    send_to_dla_on_no_route: bool = False
    expiry_address: str | None = None
    expiry_delay: int = -1
    min_expiry_delay: int = -1
    max_expiry_delay: int = -1
    auto_create_addresses: bool = True
    auto_create_queues: bool = True
    auto_delete_addresses: bool = True
    auto_delete_addresses_delay: int = 0
    auto_delete_queues: bool = True
    auto_delete_created_queues: bool = False
    auto_delete_queues_delay: int = 0
    auto_delete_queues_message_count: int = 0
    default_address_routing_type: RoutingType = "MULTICAST"
    default_queue_routing_type: RoutingType = "MULTICAST"
    default_max_consumers: int = -1
    default_purge_on_no_consumers: bool = False
    default_exclusive_queue: bool = False
    default_non_destructive: bool = False
    default_last_value_queue: bool = False
    default_last_value_key: str | None = None
    id_cache_size: int | None = None

    @classmethod
    def merge(cls, layers: Sequence[Mapping[str, object]]) -> AddressSettings:
        """Settings from layers given most specific first (kebab-case keys).

        A key's value comes from the first layer that sets it, else the default. When no
        layer sets max-read-page-bytes it is twice the effective page-size-bytes, and the
        prefetch-page-* settings default to the max-read-page-* ones (Artemis).
        """
        values: dict[str, object] = {}
        for layer in reversed(layers):
            values.update(validate_settings(layer))
        if "max-read-page-bytes" not in values and "page-size-bytes" in values:
            values["max-read-page-bytes"] = 2 * int(values["page-size-bytes"])  # type: ignore[call-overload]
        for read, prefetch in (
            ("max-read-page-bytes", "prefetch-page-bytes"),
            ("max-read-page-messages", "prefetch-page-messages"),
        ):
            if prefetch not in values and read in values:
                values[prefetch] = values[read]
        return cls(**{k.replace("-", "_"): v for k, v in values.items()})  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        """Every setting by its kebab-case name."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}


class AddressSettingsRepository:
    """Address settings per pattern; `get(address)` merges every matching pattern."""

    def __init__(self, matcher: WildcardMatcher | None = None, cache_size: int = 10_000) -> None:
        self._layers: HierarchicalRepository[dict[str, object]] = HierarchicalRepository(
            matcher, cache_size
        )
        self._cache: dict[str, AddressSettings] = {}
        self._cache_size = cache_size

    def add(self, pattern: str, mapping: Mapping[str, object]) -> None:
        """Validate `mapping` and store it under `pattern` (replacing what was there).

        Raises SettingError (a ValueError) naming the pattern, the setting, the value and
        what would be accepted.
        """
        if not isinstance(pattern, str):
            raise SettingError(f"address-settings: pattern {pattern!r} must be a string")
        layer = validate_settings(mapping, f"address-settings {pattern!r}")
        self._layers.add(pattern, layer)
        self._cache.clear()

    def remove(self, pattern: str) -> bool:
        """Forget `pattern`; False when it was not there."""
        removed = self._layers.remove(pattern)
        if removed:
            self._cache.clear()
        return removed

    def get(self, address: str) -> AddressSettings:
        """The merged settings for `address` (cached until the next add or remove)."""
        hit = self._cache.get(address)
        if hit is not None:
            return hit
        settings = AddressSettings.merge(self._layers.match(address))
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[address] = settings
        return settings

    def explicit(self, pattern: str) -> dict[str, object] | None:
        """The normalized settings stored under exactly `pattern`, or None."""
        layer = self._layers.get(pattern)
        return dict(layer) if layer is not None else None

    def patterns(self) -> list[str]:
        return self._layers.patterns()

    def items(self) -> list[tuple[str, dict[str, object]]]:
        """(pattern, normalized explicit settings) in insertion order."""
        return [(p, dict(v)) for p, v in self._layers.items()]

    def __len__(self) -> int:
        return len(self._layers)
