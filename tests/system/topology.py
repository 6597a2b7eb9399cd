"""The broker configuration with every feature on, and the traffic lanes that exercise it.

A lane is one address with the queue(s) behind it, the messages its producer sends and the
rule that says, after a schedule, which accepted messages each queue must have handed out.
Messages carry their identity in properties (lane, producer, seq) and a message id
`producer:seq`, so every event a client records can be traced back to one send.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proton import Message

from scow.core.config import DEFAULT_PLUGINS
from scow.core.testing import broker_config, free_port, write_config
from tests.system.broker import SystemBroker

#: Every plugin the packaged config enables: the built-in default set and management.
PLUGINS = (*DEFAULT_PLUGINS, "management")

#: A small frame size so the large lane's messages span many frames.
MAX_FRAME_SIZE = 16384


@dataclass(frozen=True)
class Lane:
    """One address under test and how its traffic looks and must come out."""

    name: str
    address: str
    #: The queues that must each hand out every accepted message (a topic: each subscription).
    queues: tuple[str, ...]
    #: Per consumer, first deliveries arrive in send order (per producer).
    fifo: bool = True
    #: A [queues."address"] table, when the queue is declared in the config.
    queue_config: dict[str, Any] | None = None
    address_settings: dict[str, Any] = field(default_factory=dict)
    size: tuple[int, int] = (64, 512)
    durable_ratio: float = 0.9
    #: Messages per second the lane's producer aims at (0: as fast as the window allows).
    rate: float = 20.0

    def message(
        self, producer: str, seq: int, rng: random.Random
    ) -> tuple[Message, dict[str, Any]]:
        """The `seq`th message of `producer` on this lane and what the checker must know."""
        ident = f"{producer}:{seq}"
        durable = rng.random() < self.durable_ratio
        properties: dict[str, Any] = {"lane": self.name, "producer": producer, "seq": seq}
        meta: dict[str, Any] = {"durable": durable}
        message = Message(id=ident, durable=durable)
        size = rng.randint(*self.size)
        body = (ident + "|") * (size // (len(ident) + 1) + 1)
        message.body = body[:size]
        if self.name == "prio":
            message.priority = meta["priority"] = rng.randint(0, 9)
        elif self.name == "lvq":
            properties["k"] = meta["k"] = f"k{rng.randint(0, 4)}"
        elif self.name == "select":
            properties["color"] = meta["color"] = rng.choice(("red", "blue"))
        elif self.name == "ttl":
            message.ttl = meta["ttl"] = rng.uniform(0.2, 2.0)
        elif self.name == "poison":
            properties["poison"] = meta["poison"] = rng.random() < 0.25
        elif self.name == "large":
            properties["sha"] = body_digest(message.body)
        elif self.name == "c":
            message.body = ident  # proton's C receive prints it: the record of what it took
        message.properties = properties
        return message, meta


def body_digest(body: Any) -> str:
    data = body if isinstance(body, bytes) else str(body).encode()
    return hashlib.sha1(data).hexdigest()


#: Paging addresses page from a backlog of a few messages on.
PAGING = {"max-size-bytes": "8KiB", "page-size-bytes": "16KiB"}

LANES: dict[str, Lane] = {
    lane.name: lane
    for lane in (
        Lane("paged", "sys.paged", ("sys.paged",), address_settings=PAGING, size=(256, 2048)),
        Lane(
            "topic",
            "sys.topic",
            ("sub-a.audit", "sub-b.audit"),
            address_settings={**PAGING, "default-address-routing-type": "MULTICAST"},
        ),
        Lane(
            "stream",
            "sys.stream",
            ("sys.stream",),
            queue_config={"arguments": {"x-queue-type": "stream"}},
            durable_ratio=1.0,
        ),
        Lane("tx", "sys.tx", ("sys.tx",), queue_config={}, durable_ratio=1.0),
        Lane("select", "sys.select", ("sys.select",), queue_config={}),
        Lane(
            "prio",
            "sys.prio",
            ("sys.prio",),
            fifo=False,
            queue_config={"arguments": {"qpid.priorities": 10}},
        ),
        Lane(
            "lvq",
            "sys.lvq",
            ("sys.lvq",),
            fifo=False,
            queue_config={"arguments": {"last-value-key": "k"}},
        ),
        Lane(
            "qpaged",
            "sys.qpaged",
            ("sys.qpaged",),
            queue_config={"arguments": {"qpid.paging": True, "qpid.max_pages_loaded": 2}},
            size=(64, 1024),
        ),
        Lane("ttl", "sys.ttl", ("sys.ttl",), queue_config={}),
        Lane(
            "poison",
            "sys.poison",
            ("sys.poison",),
            queue_config={},
            address_settings={"max-delivery-attempts": 2},
        ),
        Lane(
            "large",
            "sys.large",
            ("sys.large",),
            queue_config={},
            size=(60_000, 300_000),
            rate=3.0,
        ),
        Lane("c", "sys.c", ("sys.c",), queue_config={}, rate=30.0),
    )
}

#: Where proton's C send example puts its messages (checked by count: it reports only a total).
C_SEND_ADDRESS = "sys.csend"

#: Durable topic subscriptions: (container id, link name) -> queue name `container.link`.
SUBSCRIPTIONS = (("sub-a", "audit"), ("sub-b", "audit"))


@dataclass
class BrokerSpec:
    """What a system test's broker runs with; `broker()` writes the config and ports."""

    plugins: tuple[str, ...] = PLUGINS
    lanes: tuple[str, ...] = ()
    idle_timeout_ms: int = 3000
    #: Small, so that backlogs page the whole broker (every address, streams included).
    global_max_size: str = "2MiB"
    broker: dict[str, Any] = field(default_factory=dict)
    amqp: dict[str, Any] = field(default_factory=dict)
    journal: dict[str, Any] = field(
        default_factory=lambda: {"journal-file-size": "1MiB", "journal-min-files": 2}
    )
    address_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: (cert-file, key-file): adds a TLS listener.
    tls: tuple[Path, Path] | None = None
    data_dir: Path | None = None
    #: More config sections (e.g. [database]), each merged over what the fields above give.
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tables(self, data_dir: Path, port: int, http_port: int, tls_port: int) -> dict:
        queues = dict(self.queues)
        settings: dict[str, dict[str, Any]] = {}
        for name in self.lanes:
            lane = LANES[name]
            if lane.queue_config is not None:
                queues[lane.address] = {"routing-type": "ANYCAST", **lane.queue_config}
            if lane.address_settings:
                settings.setdefault(lane.address, {}).update(lane.address_settings)
        for pattern, given in self.address_settings.items():  # the test's own win
            settings.setdefault(pattern, {}).update(given)
        amqp: dict[str, Any] = {
            "idle-timeout": self.idle_timeout_ms,
            "max-frame-size": MAX_FRAME_SIZE,
            **self.amqp,
        }
        sections: dict[str, dict[str, Any]] = {
            "broker": {
                "global-max-size": self.global_max_size,
                "message-expiry-scan-period": 200,
                "log-level": "info",
                **self.broker,
            },
            "amqp": amqp,
            "journal": dict(self.journal),
        }
        if "management" in self.plugins:
            sections["management"] = {"listen": f"127.0.0.1:{http_port}"}
        if self.tls is not None:
            amqp["listen-tls"] = [f"127.0.0.1:{tls_port}"]
            sections["tls"] = {"cert-file": str(self.tls[0]), "key-file": str(self.tls[1])}
        if queues:
            sections["queues"] = queues
        for name, table in self.sections.items():
            sections.setdefault(name, {}).update(table)
        return broker_config(
            data_dir,
            plugins=self.plugins,
            address_settings=settings,
            sections=sections,
            port=port,
        )

    def create(self, directory: Path, command: str | None = None) -> SystemBroker:
        """Write `directory`/scow.toml on free ports; the broker, not started yet.

        It runs `command`, else $SCOW_SYSTEM_COMMAND (another build of `scow` to try the
        suite on), else the `scow` installed beside this interpreter.
        """
        directory.mkdir(parents=True, exist_ok=True)
        port, http_port, tls_port = free_port(), free_port(), free_port()
        data_dir = self.data_dir or directory / "data"
        config = write_config(
            directory / "scow.toml", self.tables(data_dir, port, http_port, tls_port)
        )
        broker = SystemBroker(
            config,
            port,
            directory / "broker.log",
            http_port=http_port if "management" in self.plugins else None,
            command=command or os.environ.get("SCOW_SYSTEM_COMMAND") or None,
        )
        broker.tls_port = tls_port if self.tls is not None else None
        broker.data_dir = data_dir
        return broker
