"""Every built-in queue type passes the queue type conformance suite."""

from __future__ import annotations

import pytest

from scow.core.conformance.queue_type import QueueTypeConformance
from scow.core.testing import DEFAULT_PLUGINS


class TestStandardQueue(QueueTypeConformance):
    queue_type = "standard"


class TestPriorityQueue(QueueTypeConformance):
    queue_type = "priority"

    @pytest.fixture
    def queue_arguments(self):
        return {"qpid.priorities": 10}


class TestLastValueQueue(QueueTypeConformance):
    queue_type = "last-value"

    @pytest.fixture
    def queue_arguments(self):
        return {"last-value-key": "key"}

    @pytest.fixture
    def message_properties(self):
        return lambda i: {"key": f"k{i}"}  # distinct keys: nothing superseded


class TestQpidPagedQueue(QueueTypeConformance):
    queue_type = "qpid-paged"

    @pytest.fixture
    def queue_arguments(self):
        return {"qpid.paging": True}

    @pytest.fixture
    def scow_plugins(self):
        return [*DEFAULT_PLUGINS, "qpid-paged-queues"]
