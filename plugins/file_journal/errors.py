"""Exceptions of the file journal."""

from __future__ import annotations


class JournalError(Exception):
    """The journal cannot go on: a write or sync failed, or its files are inconsistent."""
