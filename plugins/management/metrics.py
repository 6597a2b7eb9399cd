"""Prometheus metrics with Artemis's names, built from the broker's statistics per scrape.

Nothing is counted on the per-message path: a scrape reads `Broker.stats()` (and the
connections the plugin tracks) on the event loop, each queue's and address's figures a
slice at a time (`api._stats`), and the metric families and their text are made from that
copy (`MetricsSnapshot`) on a worker thread (`exposition`): with 10,000 queues the text
took 0.7 s, every connection stalled meanwhile.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

if TYPE_CHECKING:
    from scow.core.broker import Broker

#: (metric, help, queue statistic): per queue, labelled address and queue.
QUEUE_METRICS = (
    ("artemis_message_count", "Messages in the queue (memory and pages)", "message-count"),
    ("artemis_messages_added", "Messages added to the queue since start", "messages-added"),
    (
        "artemis_messages_acknowledged",
        "Messages acknowledged from the queue since start",
        "messages-acknowledged",
    ),
    ("artemis_messages_expired", "Messages expired from the queue", "messages-expired"),
    ("artemis_messages_killed", "Messages dead-lettered from the queue", "messages-killed"),
    ("artemis_consumer_count", "Consumers of the queue", "consumer-count"),
    (
        "artemis_delivering_message_count",
        "Messages delivered and not yet settled",
        "delivering-count",
    ),
    ("artemis_paged_message_count", "Messages of the queue waiting in pages", "messages-paged"),
    ("scow_queue_memory_bytes", "Bytes of the queue's messages in memory", "memory-bytes"),
)

#: (metric, help, address statistic): per address, labelled address.
ADDRESS_METRICS = (
    ("artemis_address_size", "Bytes the address holds in memory", "memory-bytes"),
    ("artemis_number_of_pages", "Page files of the address", "page-count"),
    ("artemis_address_paged_bytes", "Bytes in the address's page files", "paged-bytes"),
    ("scow_address_paging", "1 while the address writes new messages to pages", "paging"),
    ("scow_address_blocked", "1 while the address withholds producer credit", "blocked"),
)


class MetricsSnapshot:
    """What one scrape reports, read on the event loop: the broker's statistics
    (`Broker.stats`), its connection count and its data dir (for the disk's usage)."""

    __slots__ = ("connections", "data_dir", "stats")

    def __init__(self, stats: dict[str, Any], broker: Broker, data_dir: Path) -> None:
        self.stats = stats
        # the one live object in it: copied, as a thread reads the rest
        self.stats["storage-blocked-by"] = list(self.stats["storage-blocked-by"])
        self.connections = len(broker.connections)
        self.data_dir = data_dir


class BrokerCollector:
    """A prometheus_client collector over one snapshot of a broker."""

    def __init__(self, snapshot: MetricsSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        stats = self.snapshot.stats
        yield from self._broker(stats)
        families = {
            m: GaugeMetricFamily(m, h, labels=["address", "queue"]) for m, h, _ in QUEUE_METRICS
        }
        for name, queue in stats["queues"].items():
            for metric, _, key in QUEUE_METRICS:
                families[metric].add_metric([queue["address"], name], float(queue.get(key, 0)))
        yield from families.values()
        address_families = {
            m: GaugeMetricFamily(m, h, labels=["address"]) for m, h, _ in ADDRESS_METRICS
        }
        for name, address in stats["address-stats"].items():
            for metric, _, key in ADDRESS_METRICS:
                address_families[metric].add_metric([name], float(address.get(key, 0)))
        yield from address_families.values()

    def _broker(self, stats: dict[str, Any]) -> Iterator[Metric]:
        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        yield gauge(
            "artemis_address_memory_usage", "Bytes of messages in memory", stats["memory-used"]
        )
        yield gauge(
            "artemis_address_memory_usage_percentage",
            "Memory used by messages, percent of global-max-size",
            100 * stats["memory-used"] / stats["global-max-size"]
            if stats["global-max-size"] > 0
            else 0,
        )
        yield gauge(
            "artemis_connection_count", "Client connections open", self.snapshot.connections
        )
        try:
            disk = shutil.disk_usage(self.snapshot.data_dir)
            usage = disk.used / disk.total
        except OSError:
            usage = 0.0
        yield gauge("artemis_disk_store_usage", "Fraction of the data dir's disk in use", usage)
        yield gauge("artemis_total_message_count", "Messages in all queues",
                    sum(q["message-count"] for q in stats["queues"].values()))  # fmt: skip
        yield gauge(
            "scow_client_sockets",
            "Client sockets open (every listener's, the management API's included)",
            stats["client-sockets"],
        )
        yield gauge(
            "scow_client_sockets_max",
            "Client sockets the open-file limit allows (its reserve kept for storage)",
            stats["max-client-sockets"],
        )
        yield CounterMetricFamily(
            "scow_client_sockets_refused",
            "Client sockets closed at their accept: the open-file limit allowed no more",
            value=stats["client-sockets-refused"],
        )
        blocked = GaugeMetricFamily(
            "scow_producers_blocked",
            "1 for each reason producers get no credit now (disk, paging, journal messages, "
            "database, ...)",
            labels=["reason"],
        )
        for reason in stats["storage-blocked-by"]:
            blocked.add_metric([reason], 1)
        yield blocked


def exposition(snapshot: MetricsSnapshot) -> bytes:
    """The text of a scrape (Prometheus's format 0.0.4): safe on any thread, as it reads
    only `snapshot` and the process's own /proc figures."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(snapshot))
    registry.register(ProcessCollector(registry=None))
    return generate_latest(registry)
