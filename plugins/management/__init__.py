"""The `management` plugin: an HTTP API and Prometheus metrics, on the broker's loop.

`[management] listen` (default localhost:8161, like Artemis's console) serves the JSON
API under /api (OpenAPI document at /api/openapi.json) and /metrics. Its libraries
(aiohttp, prometheus-client) are dependencies of Scow itself: the packaged config enables
this plugin, and a plain `pip install scow` must run the packaged config.

Its sockets are client sockets like any protocol's: counted against the open-file limit
from their accept (`Security.take_socket`), and closed after `idle-timeout` without a
request, so that neither a storm nor sockets that never speak take the files storage needs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from scow.core import hookimpl, host_port, remote_of
from scow.core.config import ConfigSection, Setting, parse_host_port

if TYPE_CHECKING:
    from aiohttp import web

    from scow.core.broker import Broker
    from scow.core.interfaces import Service
    from scow.core.security import Security

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
        Setting(
            "idle-timeout",
            int,
            30000,
            "Close an HTTP connection that sends no request for this long (ms), before its "
            "first one or between keep-alive requests, or stops halfway through one "
            "(Jetty's idle timeout, which Artemis's console has).",
            kind="duration-ms",
            minimum=1,
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
        self.server: asyncio.Server | None = None
        self.sampler: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> None:
        from aiohttp import web

        from scow.plugins.management.api import ManagementApi

        section = self.broker.config.section("management")
        host, port = parse_host_port(str(section["listen"]))
        security = self.broker.config.section("security")
        anonymous = bool(security["allow-anonymous"]) and _loopback(host)
        api = ManagementApi(self.broker, anonymous, time.monotonic())
        loop = asyncio.get_running_loop()
        self.sampler = loop.create_task(_every_second(api.rates.sample))
        self.runner = web.AppRunner(
            api.app(), access_log=None, keepalive_timeout=int(section["idle-timeout"]) / 1000
        )
        await self.runner.setup()
        _quiet_bad_requests()
        handler, counter = self.runner.server, self.broker.security
        self.server = await loop.create_server(
            lambda: _Counted(handler(), counter), host or None, port, reuse_address=True
        )
        bound = self.server.sockets[0].getsockname()
        self.url = f"http://{host_port(host or '0.0.0.0', bound[1])}"
        self.broker.stats_sections["management"] = lambda: {"url": self.url}
        log.info("management listening", url=self.url, anonymous=anonymous)

    async def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.cancel()
        if self.server is not None:
            self.server.close()
        if self.runner is not None:
            await self.runner.cleanup()  # closes the connections still open


class _Counted(asyncio.Protocol):
    """An HTTP connection (aiohttp's `handler`) whose socket `security` counts from its
    accept to its close; one beyond the open-file limit's share is closed at once."""

    def __init__(self, handler: asyncio.Protocol, security: Security) -> None:
        self.handler = handler
        self.security = security
        self.counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.security.take_socket(remote_of(transport)):
            transport.abort()
            return
        self.counted = True
        self.handler.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted:
            self.counted = False
            self.security.socket_closed()
            self.handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


class _BadRequest(logging.Filter):
    """aiohttp logs a request it cannot parse as an error, with the parser's traceback:
    a client's mistake (a scanner, a broken health check), not the broker's. One line at
    info instead, naming the peer and what was wrong (the client got a 400 saying so)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            lines = str(exc.message).splitlines()  # the last points at the fault with ^
            record.msg = "bad HTTP request from %s: %s"
            record.args = (peer, " ".join(line.strip() for line in lines if line.strip(" ^")))
            record.levelno, record.levelname, record.exc_info = logging.INFO, "INFO", None
        return True


def _quiet_bad_requests() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _BadRequest) for f in server_log.filters):
        server_log.addFilter(_BadRequest())


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
