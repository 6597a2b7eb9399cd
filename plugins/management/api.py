"""The management HTTP API: JSON over aiohttp, on the broker's own event loop.

Every handler calls `scow.core.management` (the operations `$management` serves over
AMQP) and answers JSON; refusals are `{"error": "..."}` with the operation's status.
Requests are authenticated with HTTP Basic against the broker's users file; anonymous
ones are served only when `allow-anonymous` is on and the listener is on loopback. Where
security settings apply, every request needs the `manage` permission on `$management`
(403 otherwise), and each operation checks its own permissions as over AMQP.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from scow.core import version
from scow.core.management import MANAGEMENT_ADDRESS, Management, status_of
from scow.core.model import BrokerError
from scow.plugins.management.metrics import MetricsSnapshot, exposition
from scow.plugins.management.rates import Rates

if TYPE_CHECKING:
    from scow.core.broker import Broker

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")
#: The operations on behalf of the request's authenticated user.
_MANAGEMENT = web.RequestKey("management", Management)

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Scow management API", "version": "1"},
    "paths": {
        "/api/broker": {"get": {"summary": "Broker figures: memory, disk, paging, connections"}},
        "/api/addresses": {
            "get": {"summary": "Every address with its settings and paging"},
            "post": {"summary": 'Create an address: {"name": ..., "routing-types": [...]}'},
        },
        "/api/addresses/{name}": {
            "get": {"summary": "One address"},
            "delete": {"summary": "Delete an address (?force=true with its queues)"},
        },
        "/api/queues": {
            "get": {"summary": "Every queue with its type, arguments and figures"},
            "post": {
                "summary": "Create a queue: JSON {name, address, routing-type, durable, "
                "filter, arguments, max-consumers, exclusive, non-destructive}"
            },
        },
        "/api/queues/{name}": {
            "get": {"summary": "One queue"},
            "delete": {"summary": "Delete a queue and its messages (?force=true with consumers)"},
        },
        "/api/queues/{name}/purge": {"post": {"summary": "Drop the queue's waiting messages"}},
        "/api/queues/{name}/move": {
            "post": {"summary": 'Send waiting messages elsewhere: {"to": address, "filter": ...}'}
        },
        "/api/queues/{name}/retry": {
            "post": {"summary": "Send dead-lettered messages back to their original address"}
        },
        "/api/queues/{name}/messages": {
            "get": {"summary": "The first ?limit=N messages waiting (headers, body preview)"}
        },
        "/api/connections": {"get": {"summary": "Open client connections"}},
        "/api/connections/{id}": {"delete": {"summary": "Close a client connection"}},
        "/api/address-settings/{pattern}": {
            "patch": {"summary": "Change settings of a pattern now (?persist=true keeps them)"}
        },
        "/metrics": {"get": {"summary": "Prometheus metrics (Artemis's names)"}},
        "/console": {"get": {"summary": "The web console (one page, updates every second)"}},
    },
}


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=_dumps)


def _dumps(data: Any) -> str:
    return json.dumps(data, default=str)


#: Queues or addresses a listing describes between two turns of the event loop.
LISTING_SLICE = 256


async def _listing(
    names: list[str], describe: Callable[[str], dict[str, Any] | None]
) -> web.Response:
    """A JSON listing of every queue or address (`describe` of each of `names`, those
    gone since left out), described and encoded a slice at a time with the connections
    served between: with 10,000 queues a listing held the event loop 0.1-0.3 s whole
    (the console asks for two every second), and encoding it on a thread would not help,
    as the json module's encoder keeps the interpreter lock throughout."""
    parts = []
    for start in range(0, len(names), LISTING_SLICE):
        if start:
            await asyncio.sleep(0)
        for name in names[start : start + LISTING_SLICE]:
            described = describe(name)
            if described is not None:
                parts.append(_dumps(described))
    return web.Response(text=f"[{','.join(parts)}]", content_type="application/json")


async def _stats(broker: Broker) -> dict[str, Any]:
    """`broker.stats()`, each queue's and address's figures read a slice at a time with
    the connections served between: with 10,000 queues, reading them whole held the
    event loop 0.09 s for every scrape and every /api/broker (the console's, each
    second). Each queue and address is as it was when read, not all at one instant."""
    stats = broker.stats(each=False)
    stats["queues"] = await _each(broker.queues, lambda queue: queue.stats())
    stats["address-stats"] = await _each(broker.addresses, broker.address_stats)
    return stats


async def _each(table: Mapping[str, T], read: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    """`read` of each of `table`'s values that is still there when its slice comes."""
    names = list(table)
    out = {}
    for start in range(0, len(names), LISTING_SLICE):
        if start:
            await asyncio.sleep(0)
        for name in names[start : start + LISTING_SLICE]:
            item = table.get(name)
            if item is not None:
                out[name] = read(item)
    return out


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


class ManagementApi:
    """The routes, bound to one broker."""

    def __init__(self, broker: Any, anonymous: bool, started: float) -> None:
        self.broker = broker
        self.security = broker.security
        self.anonymous = anonymous
        self.started = started
        self.rates = Rates(broker)
        broker_config = broker.config.section("broker")
        self.data_dir = Path(str(broker_config["data-dir"]))
        self.max_disk_usage = broker_config["max-disk-usage"]

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._authenticate])
        app.router.add_get("/api/broker", self.get_broker)
        app.router.add_get("/api/addresses", self.get_addresses)
        app.router.add_post("/api/addresses", self.create_address)
        app.router.add_get("/api/addresses/{name}", self.get_address)
        app.router.add_delete("/api/addresses/{name}", self.delete_address)
        app.router.add_get("/api/queues", self.get_queues)
        app.router.add_post("/api/queues", self.create_queue)
        app.router.add_get("/api/queues/{name}", self.get_queue)
        app.router.add_delete("/api/queues/{name}", self.delete_queue)
        app.router.add_post("/api/queues/{name}/purge", self.purge_queue)
        app.router.add_post("/api/queues/{name}/move", self.move_messages)
        app.router.add_post("/api/queues/{name}/retry", self.retry_messages)
        app.router.add_get("/api/queues/{name}/messages", self.browse_queue)
        app.router.add_get("/api/connections", self.get_connections)
        app.router.add_delete("/api/connections/{id}", self.close_connection)
        app.router.add_patch("/api/address-settings/{pattern}", self.set_address_settings)
        app.router.add_get("/api/openapi.json", self.get_openapi)
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_get("/console", self.get_console)
        return app

    # ------------------------------------------------------------------ middleware

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BrokerError as exc:
            return _error(status_of(exc), exc.description)
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _error(exc.status, f"{request.method} {request.path}: {exc.reason}")
            raise

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        peer = f"{request.remote}" if request.remote else "?"
        if header.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            principal = self.security.authenticate(user, password, peer, "HTTP-BASIC")
            if principal is not None:
                return await self._authorized(request, handler, principal)
        elif self.anonymous:
            return await self._authorized(request, handler, None)
        response = _error(401, "authentication required: HTTP Basic with a broker user")
        response.headers["WWW-Authenticate"] = 'Basic realm="scow"'
        return response

    async def _authorized(
        self, request: web.Request, handler: Handler, principal: Any
    ) -> web.StreamResponse:
        self.security.check(principal, "manage", MANAGEMENT_ADDRESS)  # 403 when refused
        request[_MANAGEMENT] = Management(self.broker, principal)
        return await handler(request)

    # ------------------------------------------------------------------ reading

    async def get_broker(self, request: web.Request) -> web.Response:
        stats = await _stats(self.broker)
        addresses = list(stats["address-stats"].values())
        return _json(
            {
                "version": version(),
                "uptime-seconds": round(time.monotonic() - self.started, 3),
                "connections": stats["connections"],
                "client-sockets": stats["client-sockets"],
                "max-client-sockets": stats["max-client-sockets"],
                "client-sockets-refused": stats["client-sockets-refused"],
                "memory-used": stats["memory-used"],
                "global-max-size": stats["global-max-size"],
                "messages-in-memory": stats["messages-in-memory"],
                "disk-full": stats["disk-full"],
                # what holds producers' credit back: "disk", "journal", "paging", ...
                "producers-blocked-by": stats["storage-blocked-by"],
                "disk-usage-percent": _disk_usage(self.data_dir),
                "max-disk-usage": self.max_disk_usage,
                "addresses": stats["addresses"],
                "queues": len(stats["queues"]),
                "messages-routed": stats["messages-routed"],
                "paging-addresses": sorted(
                    name for name, a in stats["address-stats"].items() if a.get("paging")
                ),
                "paging": {
                    "page-files": sum(a.get("page-count", 0) for a in addresses),
                    "paged-bytes": sum(a.get("paged-bytes", 0) for a in addresses),
                    "paged-messages": sum(a.get("messages-paged", 0) for a in addresses),
                },
                "journal": self.broker.storage.stats(),
                **{k: v for k, v in stats.items() if k in ("flow-to-disk", "ha")},
            }
        )

    async def get_addresses(self, request: web.Request) -> web.Response:
        management = _management(request)
        return await _listing(management.address_names(), management.address_if_any)

    async def get_address(self, request: web.Request) -> web.Response:
        return _json(_management(request).read_address(request.match_info["name"]))

    async def create_address(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body.get("name"), str) or not isinstance(
            body.get("routing-types", []), list
        ):
            return _error(400, 'expected {"name": ..., "routing-types": ["ANYCAST"]}')
        created = _management(request).create_address(body["name"], body.get("routing-types", []))
        return _json(created, 201)

    async def delete_address(self, request: web.Request) -> web.Response:
        force = _flag(request, "force")
        _management(request).delete_address(request.match_info["name"], force=force)
        return web.Response(status=204)

    async def get_queues(self, request: web.Request) -> web.Response:
        management = _management(request)

        def describe(name: str) -> dict[str, Any] | None:
            queue = management.queue_if_any(name)
            return None if queue is None else {**queue, **self.rates.of(name)}

        return await _listing(management.queue_names(), describe)

    async def get_queue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return _json({**_management(request).read_queue(name), **self.rates.of(name)})

    async def get_connections(self, request: web.Request) -> web.Response:
        return _json(_management(request).list_connections())

    async def get_openapi(self, request: web.Request) -> web.Response:
        return _json(OPENAPI)

    async def get_console(self, request: web.Request) -> web.Response:
        page = resources.files("scow.plugins.management").joinpath("console.html")
        return web.Response(text=page.read_text(), content_type="text/html")

    async def get_metrics(self, request: web.Request) -> web.Response:
        snapshot = MetricsSnapshot(await _stats(self.broker), self.broker, self.data_dir)
        return web.Response(
            body=await asyncio.to_thread(exposition, snapshot),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    # ------------------------------------------------------------------ acting

    async def create_queue(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body.get("name"), str):
            return _error(400, 'expected a JSON object with a "name", e.g. {"name": "orders"}')
        attributes = {k: v for k, v in body.items() if k != "name"}
        return _json(_management(request).create_queue(body["name"], attributes), 201)

    async def delete_queue(self, request: web.Request) -> web.Response:
        force = _flag(request, "force")
        _management(request).delete_queue(request.match_info["name"], force=force)
        return web.Response(status=204)

    async def purge_queue(self, request: web.Request) -> web.Response:
        return _json({"purged": _management(request).purge_queue(request.match_info["name"])})

    async def move_messages(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body.get("to"), str):
            return _error(400, 'expected {"to": "<address>"} and optionally "filter"')
        name = request.match_info["name"]
        return _json(
            await _management(request).move_messages(name, body["to"], selector=body.get("filter"))
        )

    async def retry_messages(self, request: web.Request) -> web.Response:
        return _json(await _management(request).retry_messages(request.match_info["name"]))

    async def browse_queue(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "10"))
        except ValueError:
            return _error(400, f"limit={request.query['limit']!r}: expected an integer")
        return _json(await _management(request).browse_queue(request.match_info["name"], limit))

    async def close_connection(self, request: web.Request) -> web.Response:
        try:
            connection = int(request.match_info["id"])
        except ValueError:
            return _error(400, f"connection id {request.match_info['id']!r} is not a number")
        _management(request).close_connection(connection)
        return web.Response(status=204)

    async def set_address_settings(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        pattern = request.match_info["pattern"]
        persist = _flag(request, "persist")
        return _json(_management(request).set_address_settings(pattern, body, persist=persist))


def _management(request: web.Request) -> Management:
    """The operations on behalf of the request's user."""
    return request[_MANAGEMENT]


def _flag(request: web.Request, name: str) -> bool:
    """A yes/no query parameter (`?force=true`)."""
    return request.query.get(name, "false").lower() in ("1", "true", "yes")


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; 400 (through the error middleware) when it is not one."""
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        raise web.HTTPBadRequest(reason=f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(reason="expected a JSON object")
    return body


def _disk_usage(path: Path) -> float:
    """Percent of the data dir's file system in use (its parent until it exists)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    usage = shutil.disk_usage(path)
    return round(100 * usage.used / usage.total, 1)
