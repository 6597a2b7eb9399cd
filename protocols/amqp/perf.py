"""`scow perf client`: being written (owned by the perf helper)."""

from __future__ import annotations

import argparse


def add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    pass
