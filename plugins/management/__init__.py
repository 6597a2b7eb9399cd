"""The `management` plugin: an HTTP API and Prometheus metrics, on the broker's loop.

`[management] listen` (default localhost:8161, like Artemis's console) serves the JSON
API under /api (OpenAPI document at /api/openapi.json) and /metrics. Its libraries
(aiohttp, prometheus-client) are dependencies of Scow itself: the packaged config enables
this plugin, and a plain `pip install scow` must run the packaged config.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from scow.core import hookimpl
from scow.core.config import ConfigSection, Setting, parse_host_port

if TYPE_CHECKING:
    from aiohttp import web

    from scow.core.broker import Broker
    from scow.core.interfaces import Service

log = structlog.get_logger("scow.management")

SECTION = ConfigSection(
    "management",
    (
        Setting(
            "listen",
            str,
            "localhost:8161",
            "host:port of the HTTP API and /metrics (Artemis's console port).",
        ),
    ),
    "The management HTTP API and Prometheus metrics (the management plugin).",
)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ManagementService:
    #: Started once the broker has recovered and listens (see `Service`).
    serves_clients = True

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.runner: web.AppRunner | None = None
        self.sampler: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> None:
        from aiohttp import web

        from scow.plugins.management.api import ManagementApi

        config = self.broker.config
        host, port = parse_host_port(str(config.section("management")["listen"]))
        security = config.section("security")
        anonymous = bool(security["allow-anonymous"]) and _loopback(host)
        api = ManagementApi(self.broker, anonymous, time.monotonic())
        self.sampler = asyncio.get_running_loop().create_task(_every_second(api.rates.sample))
        self.runner = web.AppRunner(api.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host or None, port)
        await site.start()
        bound = self.runner.addresses[0]
        self.url = f"http://{host or '0.0.0.0'}:{bound[1]}"
        self.broker.stats_sections["management"] = lambda: {"url": self.url}
        log.info("management listening", url=self.url, anonymous=anonymous)

    async def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.cancel()
        if self.runner is not None:
            await self.runner.cleanup()


async def _every_second(sample: Callable[[], None]) -> None:
    while True:
        sample()
        await asyncio.sleep(1.0)


@hookimpl
def scow_config_sections() -> list[ConfigSection]:
    return [SECTION]


@hookimpl
def scow_services(broker: Broker) -> list[Service]:
    return [ManagementService(broker)]
