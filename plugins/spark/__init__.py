"""The spark plugin: stream queues with offsets and cursors, and a PySpark data source.

Broker side (this module's hooks): the `stream` queue type (`x-queue-type = "stream"`),
the `stream-staging` type behind exactly-once writes, and the `$management` operations
on streams (READ, SEEK, CURSOR-READ/MOVE/DELETE) and sinks (STAGE, COMMIT, ABORT, READ).

Spark side: `scow.plugins.spark.source` (imports pyspark and pyarrow, so it is imported
only by Spark users) holds the `scow` data source, which Spark finds by itself through the
top-level `pyspark_scow` package, or which `spark.dataSource.register(ScowDataSource)`
registers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scow.core import hookimpl
from scow.core.config import ConfigSection
from scow.core.descriptors import QueueType, StreamStoreBackend
from scow.plugins.spark import segments, staging, stream
from scow.plugins.spark.plugin import SECTION, Streams

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.config import Config
    from scow.core.interfaces import Service
    from scow.core.management import ManagementOperation


@hookimpl
def scow_config_sections() -> list[ConfigSection]:
    return [SECTION]


@hookimpl
def scow_configure(config: Config) -> None:
    staging.configure(config.address_settings)


@hookimpl
def scow_register_queue_types() -> list[QueueType]:
    return [
        QueueType(
            "stream",
            lambda spec, broker: Streams.of(broker).new_queue(spec),
            "Every message kept with a sequence number; consumers read from a position",
            arguments=stream.ARGUMENTS,
            check=stream.check,
        ),
        QueueType(
            staging.STAGING_TYPE,
            staging.StagingQueue,
            "Staging area of exactly-once writes: no consumers; emptied by a sink's COMMIT",
            arguments=staging.STAGING_ARGUMENTS,
        ),
    ]


@hookimpl
def scow_register_stream_stores() -> list[StreamStoreBackend]:
    return [segments.BACKEND]


@hookimpl
def scow_management_operations(broker: Broker) -> dict[str, dict[str, ManagementOperation]]:
    return Streams.of(broker).operations()


@hookimpl
def scow_services(broker: Broker) -> list[Service]:
    return [Streams.of(broker)]


@hookimpl
def scow_broker_started(broker: Broker) -> None:
    # after every service's start: the paging plugin's may hand streams what pages held
    Streams.of(broker).broker_started()
