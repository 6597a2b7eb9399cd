"""The `paging` plugin: Artemis's address paging, the PAGE full policy and the file page store.

Enable it with `[plugins] enable = [..., "paging"]`; addresses whose
`address-full-policy` is PAGE then write new messages to page files once they (or the
broker as a whole) are full, and read them back per queue as consumers make room.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scow.core import hookimpl
from scow.core.config import ConfigSection, Setting
from scow.core.descriptors import FullPolicyType, PageStoreBackend
from scow.plugins.paging import store
from scow.plugins.paging.manager import PagingManager

if TYPE_CHECKING:
    from scow.core.broker import Broker
    from scow.core.interfaces import Service
    from scow.core.model import AddressInfo

PAGING_SECTION = ConfigSection(
    "paging",
    (
        Setting("store", str, "file", "Page store backend by name (file, or a plugin's)."),
        Setting(
            "paging-directory",
            str,
            "paging",
            "Where page files go (one folder per address), relative to [broker] data-dir.",
        ),
        Setting(
            "page-sync-timeout",
            int,
            3_333_333,
            "Nanoseconds the page writer waits so that one sync covers more durable paged "
            "messages (group commit); 0 syncs at once.",
            minimum=0,
        ),
    ),
    "Address paging (the paging plugin): where pages are stored and how they are synced.",
)


def _page_policy(address: AddressInfo, broker: Broker) -> Any:
    return PagingManager.of(broker).pager(address)


class PagingService:
    """Recovers the pages at startup and stops the paging threads at shutdown."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def start(self) -> None:
        await PagingManager.of(self.broker).recover()

    async def stop(self) -> None:
        manager = self.broker.page_manager
        if manager is not None:
            manager.stop()


@hookimpl
def scow_config_sections() -> list[ConfigSection]:
    return [PAGING_SECTION]


@hookimpl
def scow_register_full_policies() -> list[FullPolicyType]:
    return [
        FullPolicyType(
            "PAGE", _page_policy, "write new messages to page files while the address is full"
        )
    ]


@hookimpl
def scow_register_page_stores() -> list[PageStoreBackend]:
    return [
        PageStoreBackend(
            "file",
            store.open_store,
            store.discover,
            "page files, one folder per address, under [paging] paging-directory",
        )
    ]


@hookimpl
def scow_services(broker: Broker) -> list[Service]:
    return [PagingService(broker)]
