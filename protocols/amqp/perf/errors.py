"""The error of a `scow perf` run that cannot start or cannot finish."""

from __future__ import annotations


class PerfError(Exception):
    """A run that cannot start or cannot finish; the message says why."""
