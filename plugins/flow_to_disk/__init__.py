"""The `flow-to-disk` plugin: Qpid Broker-J's flow to disk.

When the bytes of message bodies held in memory pass `flow-to-disk-threshold`, each new
message's body goes to a spill file at once and only the message's small header object
stays in memory; a housekeeping cycle (`housekeeping-check-period`) divides the
threshold between queues in proportion to their size (Broker-J 6's per-queue targets)
and, walking each queue from its head, moves to disk the bodies past its target. A body
comes back when its message is delivered, browsed, or read by a selector. It composes
with paging: an address in page mode keeps paging; flow to disk acts on what is still
in memory. Statistics keep Broker-J's names.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from scow.core import hookimpl
from scow.core.config import ConfigSection, Setting
from scow.core.message import MEMORY_OVERHEAD, Message
from scow.plugins.flow_to_disk.spill import SpillStore

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.interfaces import Service

log = structlog.get_logger("scow.flow-to-disk")

SECTION = ConfigSection(
    "flow-to-disk",
    (
        Setting(
            "flow-to-disk-threshold",
            int,
            -1,
            "Bytes of message bodies in memory past which bodies flow to disk; -1 is 75 % "
            "of the memory budget for messages ([broker] global-max-size, as derived), "
            "like Broker-J's 75 % of its direct memory.",
            kind="size",
            minimum=-1,
        ),
        Setting(
            "housekeeping-check-period",
            int,
            30_000,
            "How often (ms) the threshold is divided between queues by their size and "
            "bodies past each queue's share move to disk.",
            kind="duration-ms",
            minimum=1,
        ),
        Setting(
            "flow-directory",
            str,
            "flow",
            "Where bodies wait while on disk, relative to [broker] data-dir (emptied at "
            "start: not persistence).",
        ),
    ),
    "Broker-J's flow to disk (the flow-to-disk plugin).",
)


class FlowToDisk:
    """Moves bodies to disk and keeps the figures (Broker-J's statistics)."""

    def __init__(self, broker: Broker, settings: Any) -> None:
        self.broker = broker
        threshold = int(settings["flow-to-disk-threshold"])
        budget = broker.limits.max_size
        self.threshold = threshold if threshold >= 0 else budget * 3 // 4
        self.period = int(settings["housekeeping-check-period"]) / 1000
        data_dir = Path(str(broker.config.section("broker")["data-dir"]))
        self.store = SpillStore(data_dir / str(settings["flow-directory"]))
        self.targets: dict[str, int] = {}
        self.active = False
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ figures

    def in_memory(self) -> int:
        """Bytes of message bodies in memory: those held, less those on disk."""
        limits = self.broker.limits
        return limits.size - limits.messages * MEMORY_OVERHEAD - self.store.on_disk

    def stats(self) -> dict[str, Any]:
        in_memory = self.in_memory()
        return {
            "usedDirectMemorySize": in_memory,
            "directMemoryTotalCapacity": self.broker.limits.max_size,
            "inMemoryMessageSize": in_memory,
            "inMemoryMessageThreshold": self.threshold,
            "bytesEvacuatedFromMemory": self.store.evacuated,
            "bytesRestoredToMemory": self.store.restored,
            "bytesOnDisk": self.store.on_disk,
            "flowToDiskActive": self.active,
            "queueTargets": dict(self.targets),
        }

    # ------------------------------------------------------------------ flowing

    def arm(self) -> None:
        """Have the broker offer new messages once held bytes could pass the threshold."""
        limits = self.broker.limits
        limits.flow_above = self.threshold + limits.messages * MEMORY_OVERHEAD

    def on_new_message(self, message: Message) -> None:
        """A message being routed while memory is near the threshold."""
        over = self.in_memory() > self.threshold
        self._note(over)
        if over and message.data.__class__ is bytes:
            (message.data,) = self.store.write([message.data])
        self.arm()  # the overhead part moves with the count of messages

    def _note(self, over: bool) -> None:
        if over != self.active:
            self.active = over
            log.debug(
                "flow to disk " + ("enforced" if over else "stopped"),
                threshold=self.threshold,
                in_memory=self.in_memory(),
            )
            if over:  # the messages already in memory flow too, not only new ones
                asyncio.get_running_loop().call_soon(self.housekeeping)

    def housekeeping(self) -> int:
        """Divide the threshold between queues by size; move what is past each share.

        Returns the number of bodies moved.
        """
        queues = [q for q in self.broker.queues.values() if q.memory_bytes > 0]
        total = sum(q.memory_bytes for q in queues)
        self.targets = {q.name: self.threshold * q.memory_bytes // total for q in queues if total}
        moved = 0
        for queue in queues:
            target = self.targets[queue.name]
            held = queue.delivering_bytes
            going: list[Message] = []
            for entry in queue.waiting():
                message = entry.message
                held += len(message.data)
                if held > target and message.data.__class__ is bytes:
                    going.append(message)
            if going:
                places = self.store.write([m.data for m in going])
                for message, place in zip(going, places, strict=True):
                    message.data = place
                moved += len(going)
        self._note(self.in_memory() > self.threshold)
        self.arm()
        return moved

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            moved = self.housekeeping()
            if moved:
                log.debug("bodies flowed to disk by housekeeping", messages=moved)


class FlowToDiskService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.flow: FlowToDisk | None = None

    async def start(self) -> None:
        broker = self.broker
        flow = self.flow = FlowToDisk(broker, broker.config.section("flow-to-disk"))
        broker.flow_to_disk = flow.on_new_message
        broker.stats_sections["flow-to-disk"] = flow.stats
        flow.arm()
        flow._task = asyncio.get_running_loop().create_task(flow.run())

    async def stop(self) -> None:
        flow = self.flow
        if flow is None:
            return
        if flow._task is not None:
            flow._task.cancel()
        self.broker.limits.flow_above = 1 << 62
        self.broker.flow_to_disk = None
        flow.store.close()


@hookimpl
def scow_config_sections() -> list[ConfigSection]:
    return [SECTION]


@hookimpl
def scow_services(broker: Broker) -> list[Service]:
    return [FlowToDiskService(broker)]
