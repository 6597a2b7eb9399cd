"""How a cursor applies consumers' selectors to paged records without making messages.

First the page summary (`summary.PageSummary`): a page none of the selectors can match
is passed over unread. Then, record by record, the selectors run on the properties read
from the record's bytes (the message format's `properties`); only a record that matches
becomes a `Message`. A filter that is not a selector, or a selector reading headers
(`JMSPriority`, `properties.subject`...), falls back to a `Message` per record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scow.core.selector import Requirements, Selector
from scow.plugins.paging.summary import PageSummary


class RecordFilter:
    """The selectors of some consumers (all with a filter), as a reader of pages uses them."""

    __slots__ = ("_last", "_properties", "_requires", "_selectors")

    def __init__(
        self,
        filters: Sequence[Callable[[Any], bool] | None],
        properties: Callable[[bytes], Mapping[str, object]],
    ) -> None:
        selectors: list[Selector | None] = [getattr(f, "selector", None) for f in filters]
        self._properties = properties
        #: (properties, verdict) of the last record: a format may hand the same mapping
        #: for records whose properties are the same, and the verdict is then the same.
        self._last: tuple[object, bool] = (None, False)
        #: Selectors that read property names only, when every filter is one; else None.
        self._selectors: list[Selector] | None = None
        #: What each selector requires of a match, when every one requires something.
        self._requires: list[Requirements] | None = None
        known = [s for s in selectors if s is not None]
        if len(known) < len(selectors) or not known:
            return
        if all(s.properties_only for s in known):
            self._selectors = known
        if all(s.requires for s in known):
            self._requires = [s.requires for s in known]

    def skips(self, summary: PageSummary | None) -> bool:
        """True when the page `summary` describes can hold no record any selector matches."""
        requires = self._requires
        if summary is None or requires is None:
            return False
        return not any(summary.may_match(required) for required in requires)

    def accepts(self, data: bytes) -> bool | None:
        """Whether some selector matches the record's message, read from its bytes; None
        when that takes a `Message` (the caller then asks the filters themselves)."""
        selectors = self._selectors
        if selectors is None:
            return None
        try:
            properties = self._properties(data)
        except ValueError:
            return None  # unreadable here: the filters decide as they would in memory
        last, verdict = self._last
        if properties is not last:
            get = properties.get
            verdict = any(selector.matches(get) for selector in selectors)
            self._last = (properties, verdict)
        return verdict
