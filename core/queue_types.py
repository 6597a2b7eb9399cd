"""Which queue type a declared queue gets, and the defaults a new queue takes.

A queue is declared with arguments (config, attach, management); each `QueueType`
names the arguments that select it (`selected_by`) and those it accepts. These pure
functions turn a declared `QueueSpec` into the one the broker builds, or refuse it with
an `InvalidField` that names the argument, the value and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from scow.core.model import InvalidField, QueueSpec

if TYPE_CHECKING:
    from scow.core.address_settings import AddressSettings
    from scow.core.descriptors import QueueType

#: The last-value key of queues made last-value by default-last-value-queue (Artemis's).
DEFAULT_LAST_VALUE_KEY = "_AMQ_LVQ_NAME"


def with_defaults(
    spec: QueueSpec, settings: AddressSettings, queue_types: Mapping[str, QueueType]
) -> QueueSpec:
    """A new queue with its address's default-* queue attributes where it set none."""
    arguments = dict(spec.arguments)
    key = settings.default_last_value_key or (
        DEFAULT_LAST_VALUE_KEY if settings.default_last_value_queue else None
    )
    if (
        key
        and spec.queue_type == "standard"
        and "x-queue-type" not in arguments
        and not any(a in arguments for t in queue_types.values() for a in t.selected_by)
    ):
        arguments["last-value-key"] = key
    exclusive, non_destructive = spec.exclusive, spec.non_destructive
    return dataclasses.replace(
        spec,
        exclusive=settings.default_exclusive_queue if exclusive is None else exclusive,
        non_destructive=(
            settings.default_non_destructive if non_destructive is None else non_destructive
        ),
        arguments=tuple(arguments.items()),
    )


def typed(spec: QueueSpec, queue_types: Mapping[str, QueueType]) -> tuple[QueueSpec, QueueType]:
    """The queue type `spec`'s arguments select, and `spec` with them normalized."""
    arguments = dict(spec.arguments)
    type_name = arguments.pop("x-queue-type", None) or spec.queue_type
    if type_name == "standard":
        selecting = [
            (t.name, next(a for a in t.selected_by if a in arguments))
            for t in queue_types.values()
            if any(a in arguments for a in t.selected_by)
        ]
        if len(selecting) > 1:
            given = " and ".join(argument for _, argument in selecting)
            raise InvalidField(f"queue '{spec.name}': cannot specify {given} for the same queue")
        if selecting:
            type_name = selecting[0][0]
    queue_type = queue_types.get(str(type_name))
    if queue_type is None:
        raise InvalidField(
            f"queue '{spec.name}': unknown queue type '{type_name}' "
            f"(available: {', '.join(sorted(queue_types))})"
        )
    unknown = sorted(set(arguments) - set(queue_type.arguments))
    if unknown:
        known = {a for t in queue_types.values() for a in t.arguments}
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        accepted = ", ".join(["x-queue-type", *sorted(queue_type.arguments)])
        raise InvalidField(
            f"queue '{spec.name}': unknown argument '{unknown[0]}'{hint} "
            f"(a {queue_type.name} queue accepts: {accepted})"
        )
    if queue_type.check is not None:
        try:
            arguments = queue_type.check(arguments)
        except ValueError as exc:
            raise InvalidField(f"queue '{spec.name}': {exc}") from None
    checked = dataclasses.replace(
        spec, queue_type=queue_type.name, arguments=tuple(sorted(arguments.items()))
    )
    return checked, queue_type
