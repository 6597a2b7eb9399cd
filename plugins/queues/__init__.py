"""Built-in queue types."""

from __future__ import annotations

from scow.core import hookimpl
from scow.core.descriptors import QueueType
from scow.plugins.queues.standard import StandardQueue


@hookimpl
def scow_register_queue_types() -> list[QueueType]:
    return [
        QueueType(
            "standard",
            lambda spec, broker: StandardQueue(spec, broker),
            "FIFO queue; round-robin across consumers; selectors per consumer",
        )
    ]
