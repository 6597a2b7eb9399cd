"""Finding, loading and validating plugins.

Plugins are installed through the `scow.plugins` entry-point group (ours too) and
enabled by name in the config's `[plugins] enable`. Installed is not enabled.
"""

from __future__ import annotations

import difflib
import inspect
import operator
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any

import pluggy

from scow.core import hookspecs

ENTRY_POINT_GROUP = "scow.plugins"

#: The module attribute in which a plugin declares the hook API versions it supports.
API_ATTRIBUTE = "SCOW_HOOK_API"

_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)?)\s*$")
_COMPARE: dict[str, Callable[[tuple[int, int], tuple[int, int]], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}


class PluginError(Exception):
    """A plugin could not be found, loaded or validated."""


def installed_plugins() -> dict[str, EntryPoint]:
    """Every plugin installed in this environment, by name."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def api_supported(declared: str, version: str = hookspecs.HOOK_API_VERSION) -> bool:
    """Whether hook API `version` lies in `declared`, comma-separated clauses such as
    ">=1.0,<2" (operators >=, <=, ==, !=, >, <; versions major or major.minor).

    Raises ValueError naming the clause it cannot read and what is accepted.
    """
    current = _version(version)
    for clause in declared.split(","):
        match = _CLAUSE.match(clause)
        if match is None:
            raise ValueError(
                f"cannot read {clause.strip()!r} in {declared!r}; expected clauses like "
                "'>=1.0' or '<2' (operators >= <= == != > <), separated by commas"
            )
        if not _COMPARE[match[1]](current, _version(match[2])):
            return False
    return True


def check_api_version(plugin: object, name: str) -> None:
    """Refuse `plugin` when the hook API range it declares excludes this broker's."""
    declared = getattr(plugin, API_ATTRIBUTE, None)
    if declared is None:
        return
    try:
        supported = api_supported(str(declared))
    except ValueError as exc:
        raise PluginError(f"plugin '{name}': {API_ATTRIBUTE} {exc}") from None
    if not supported:
        raise PluginError(
            f"plugin '{name}' supports Scow hook API {declared} but this broker provides "
            f"hook API {hookspecs.HOOK_API_VERSION}; install a version of the plugin made "
            "for it"
        )


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


@dataclass(frozen=True)
class PluginInfo:
    name: str
    module: str
    enabled: bool
    hooks: tuple[str, ...]


class PluginManager:
    """pluggy's manager with Scow's safety nets switched on."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("scow")
        self.pm.add_hookspecs(hookspecs)
        self.hook: Any = self.pm.hook
        if os.environ.get("SCOW_TRACE_PLUGINS") == "1":
            self.pm.trace.root.setwriter(lambda msg: sys.stderr.write(f"[pluggy] {msg}"))
            self.pm.enable_tracing()

    def register(self, plugin: ModuleType | object, name: str) -> None:
        """Register one plugin object, rejecting async hook implementations and hook API
        versions it does not declare support for."""
        if self.pm.has_plugin(name):
            raise PluginError(f"plugin '{name}' is registered twice")
        check_api_version(plugin, name)
        for attr in dir(plugin):
            if attr.startswith("scow_"):
                fn = getattr(plugin, attr)
                if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
                    raise PluginError(
                        f"plugin '{name}': hook {attr} is async; hooks must be plain "
                        "functions (put async work in a Service from scow_services)"
                    )
        self.pm.register(plugin, name=name)

    def load(self, enable: Sequence[str]) -> None:
        """Load and register the enabled plugins by entry-point name, then validate."""
        available = installed_plugins()
        for name in enable:
            ep = available.get(name)
            if ep is None:
                raise PluginError(
                    f"[plugins] enable: unknown plugin '{name}'{_suggest(name, available)} "
                    f"(installed: {', '.join(sorted(available)) or 'none'})"
                )
            try:
                module = ep.load()
            except Exception as exc:  # a broken plugin must name itself
                raise PluginError(f"plugin '{name}' ({ep.value}) failed to import: {exc}") from exc
            self.register(module, name)
        self.validate()

    def validate(self) -> None:
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin '{exc.plugin}': {exc}") from exc

    def names(self) -> list[str]:
        return [name for name, _ in self.pm.list_name_plugin()]

    def collect(self, hook_name: str, **kwargs: Any) -> list[Any]:
        """Call a list-returning hook and flatten its results."""
        results = getattr(self.hook, hook_name)(**kwargs)
        return [item for result in results if result for item in result]

    def unique(self, hook_name: str, what: str) -> dict[str, Any]:
        """Call a registration hook; return descriptors by name, rejecting duplicates."""
        found: dict[str, Any] = {}
        for descriptor in self.collect(hook_name):
            if descriptor.name in found:
                raise PluginError(f"two plugins register a {what} named '{descriptor.name}'")
            found[descriptor.name] = descriptor
        return found


def hooks_of(plugin: object) -> tuple[str, ...]:
    return tuple(sorted(a for a in dir(plugin) if a.startswith("scow_")))


def describe_plugins(enabled: Sequence[str]) -> list[PluginInfo]:
    """Installed plugins with whether each is enabled and the hooks it implements."""
    infos = []
    for name, ep in sorted(installed_plugins().items()):
        try:
            hooks = hooks_of(ep.load())
        except Exception as exc:
            hooks = (f"<failed to import: {exc}>",)
        infos.append(PluginInfo(name, ep.value, name in enabled, hooks))
    return infos
