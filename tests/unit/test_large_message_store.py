"""The file store of large message bodies passes the shared conformance suite."""

from __future__ import annotations

import pytest

from scow.core.large_message_files import FileLargeMessageStore
from scow.core.large_message_store_suite import LargeMessageStoreConformance, OpenStore


class TestFileLargeMessageStore(LargeMessageStoreConformance):
    @pytest.fixture
    def open_store(self) -> OpenStore:
        return lambda data_dir: FileLargeMessageStore(data_dir / "large-messages", sync=True)
