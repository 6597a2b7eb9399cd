"""The C builds of the hot path's parts: `scow.core._speedups` (the duplicate-id check)
and `scow.protocols.amqp._speedups` (AMQP `inspect`), pyproject.toml's ext-modules.

Each stands in for a Python build of the same thing, which runs where the C one is not
installed (no compiler at install time: the build is optional) or, for tests and
comparisons, when the environment sets `SCOW_PURE_PYTHON=1`.
"""

from __future__ import annotations

import os

#: Whether the Python builds run even where the C ones are installed.
PURE_PYTHON = os.environ.get("SCOW_PURE_PYTHON", "") not in ("", "0")
