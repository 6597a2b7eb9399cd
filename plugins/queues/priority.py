"""Priority queues (Qpid's `qpid.priorities`): higher priorities go out first.

Strict by default; `qpid.fairshare = N` lets each level hand out at most N messages in
a row while a lower level has some waiting, as Qpid's fairshare option does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scow.core import hookimpl
from scow.core.descriptors import QueueType
from scow.plugins.queues.standard import StandardQueue
from scow.plugins.queues.waiting import ByPriority

ARGUMENTS = {
    "qpid.priorities": "Distinct priority levels, 1-10 (10: every AMQP priority 0-9 its own).",
    "x-qpid-priorities": "Alias of qpid.priorities.",
    "qpid.fairshare": "Messages a level hands out in a row while lower ones wait; 0 is strict.",
}


def _int(arguments: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = arguments[name]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} = {value!r}: expected an integer from {low} to {high}")
    return value


def check(arguments: Mapping[str, Any]) -> dict[str, Any]:
    checked = dict(arguments)
    levels = checked.pop("x-qpid-priorities", None)
    if levels is not None:
        checked.setdefault("qpid.priorities", levels)
    checked["qpid.priorities"] = _int(checked, "qpid.priorities", 1, 10)
    if "qpid.fairshare" in checked:
        checked["qpid.fairshare"] = _int(checked, "qpid.fairshare", 0, 2**31 - 1)
    return checked


def _queue(spec: Any, broker: Any) -> StandardQueue:
    arguments = dict(spec.arguments)
    waiting = ByPriority(arguments["qpid.priorities"], arguments.get("qpid.fairshare", 0))
    return StandardQueue(spec, broker, waiting=waiting)


@hookimpl
def scow_register_queue_types() -> list[QueueType]:
    return [
        QueueType(
            "priority",
            _queue,
            "Highest message priority first (strict, or fairshare per level)",
            selected_by=("qpid.priorities", "x-qpid-priorities"),
            arguments=ARGUMENTS,
            check=check,
        )
    ]
