"""Test helpers for Scow and its plugins: start a real broker with a given config.

`BrokerThread` runs a broker in-process on its own event loop thread, listening on an
ephemeral port; `BrokerProcess` runs `scow run` as a subprocess (for crash tests that
SIGKILL it). Both are also pytest fixtures when this module is loaded as a plugin
(`pytest_plugins = ["scow.core.testing"]`): `scow_broker` and `scow_broker_process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from scow.core import app
from scow.core import logging as scow_logging
from scow.core.broker import Broker
from scow.core.config import Config, load_config, read_plugin_list, to_toml
from scow.core.conformance.journal import JournalConformance
from scow.core.conformance.page_store import PageStoreConformance
from scow.core.conformance.stream_store import StreamStoreConformance
from scow.core.plugins import PluginManager

__all__ = [
    "BrokerProcess",
    "BrokerThread",
    "JournalConformance",
    "PageStoreConformance",
    "StreamStoreConformance",
    "amqp_client",
    "broker_config",
    "wait_for",
    "wait_for_async",
]

T = TypeVar("T")

DEFAULT_PLUGINS = (
    "amqp",
    "memory-journal",
    "standard-queues",
    "priority-queues",
    "last-value-queues",
    "full-policies",
    "paging",
)


def _checked(condition: Callable[[], Any], deadline: float, timeout: float, what: str) -> Any:
    """`condition()`; AssertionError when it is falsy past `deadline`."""
    value = condition()
    if not value and time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
    return value


def wait_for(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := _checked(condition, deadline, timeout, what)):
        time.sleep(interval)
    return value


async def wait_for_async(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> Any:
    """`wait_for` inside a running event loop: polls without blocking it."""
    deadline = time.monotonic() + timeout
    while not (value := _checked(condition, deadline, timeout, what)):
        await asyncio.sleep(interval)
    return value


def broker_config(
    data_dir: Path,
    *,
    plugins: Sequence[str] = DEFAULT_PLUGINS,
    address_settings: Mapping[str, Mapping[str, Any]] | None = None,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
    port: int = 0,
) -> dict[str, dict[str, Any]]:
    """A config for tests: loopback ephemeral port, queue semantics for plain addresses."""
    tables: dict[str, dict[str, Any]] = {
        "plugins": {"enable": list(plugins)},
        "broker": {"data-dir": str(data_dir), "message-expiry-scan-period": 100},
        "amqp": {"listen": [f"127.0.0.1:{port}"]},
        "address-settings": {
            "#": {
                "default-address-routing-type": "ANYCAST",
                "dead-letter-address": "DLA",
                "expiry-address": "ExpiryQueue",
            }
        },
    }
    for name, table in (sections or {}).items():
        tables.setdefault(name, {}).update(table)
    for pattern, settings in (address_settings or {}).items():
        tables["address-settings"].setdefault(pattern, {}).update(settings)
    return tables


class BrokerThread:
    """A broker on its own event-loop thread in this process.

    `plugin_objects` (name -> module or object with hook implementations) are registered
    as plugins besides those the config enables, without being installed: a plugin under
    test needs no entry point.
    """

    def __init__(
        self, config_path: Path, plugin_objects: Mapping[str, object] | None = None
    ) -> None:
        self.config_path = config_path
        self.plugin_objects = dict(plugin_objects or {})
        self.loop = asyncio.new_event_loop()
        self.server: app.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> BrokerThread:
        plugins, config = self._load()
        scow_logging.configure("console", config.section("broker")["log-level"])
        self.server = app.Server(plugins, config)
        self._thread.start()
        self.call_async(self.server.start())
        return self

    def _load(self) -> tuple[PluginManager, Config]:
        """`app.load`, with `plugin_objects` registered before the enabled plugins."""
        if not self.plugin_objects:
            return app.load(self.config_path)
        plugins = PluginManager()
        for name, plugin in self.plugin_objects.items():
            plugins.register(plugin, name)
        plugins.load(read_plugin_list(self.config_path))
        sections = plugins.collect("scow_config_sections")
        return plugins, load_config(self.config_path, sections)

    @property
    def broker(self) -> Broker:
        assert self.server is not None and self.server.broker is not None
        return self.server.broker

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.protocols["amqp"].bound[0][1]

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    def port_of(self, protocol: str) -> int:
        """The port the listener of `protocol` (a `ProtocolType` name) bound first."""
        assert self.server is not None
        return self.server.protocols[protocol].bound[0][1]

    def call(self, fn: Callable[[], T], timeout: float = 10) -> T:
        """Run `fn` on the broker's loop thread (broker state is not thread-safe)."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def call_async(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def queue_stats(self, name: str) -> dict[str, Any] | None:
        def stats() -> dict[str, Any] | None:
            queue = self.broker.queues.get(name)
            return queue.stats() if queue is not None else None

        return self.call(stats)

    def stop(self) -> None:
        """Stop the broker and its loop; idempotent (a test may stop it to restart)."""
        if self.loop.is_closed():
            return
        if self.server is not None and self._thread.is_alive():
            self.call_async(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


@contextlib.contextmanager
def amqp_client(broker: BrokerThread | BrokerProcess, timeout: float = 10.0) -> Iterator[Any]:
    """A proton `BlockingConnection` to `broker`, closed however the block ends."""
    from proton.utils import BlockingConnection

    conn = BlockingConnection(broker.url, timeout=timeout)
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scow_command() -> str:
    """The installed `scow` program beside this interpreter (what a user runs)."""
    path = Path(sys.executable).parent / "scow"
    if not path.exists():
        raise RuntimeError(f"{path}: the scow command is not installed (pip install scow)")
    return str(path)


class BrokerProcess:
    """The installed `scow run` in a subprocess on a fixed free port; kill() sends SIGKILL.

    It runs as users run it: its own signals, file descriptors and interpreter.
    """

    def __init__(
        self, config_path: Path, port: int, log_path: Path, command: str | None = None
    ) -> None:
        self.config_path = config_path
        self.port = port
        self.log_path = log_path
        #: The `scow` program to run (default: the one installed beside this interpreter).
        self.command = command
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> BrokerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [self.command or scow_command(), "run", "--config", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()

        def listening() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"broker exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, timeout, 0.05, "the broker to listen")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)


def write_config(path: Path, tables: Mapping[str, Mapping[str, Any]]) -> Path:
    path.write_text(to_toml(tables) + "\n")
    return path


@pytest.fixture
def scow_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerThread]]:
    """Factory: `scow_broker(address_settings=..., sections=..., plugins=...,
    plugin_objects=...)` -> a running broker, stopped at the end of the test."""
    started: list[BrokerThread] = []

    def start(plugin_objects: Mapping[str, object] | None = None, **kwargs: Any) -> BrokerThread:
        n = len(started)
        config = write_config(
            tmp_path / f"scow-{n}.toml", broker_config(tmp_path / f"data-{n}", **kwargs)
        )
        broker = BrokerThread(config, plugin_objects).start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def scow_broker_process(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Factory for subprocess brokers sharing one data dir per test."""
    with broker_processes(tmp_path) as start:
        yield start


@contextlib.contextmanager
def broker_processes(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start subprocess brokers on one data dir under `tmp_path`; all killed at exit."""
    started: list[BrokerProcess] = []

    def start(**kwargs: Any) -> BrokerProcess:
        port = kwargs.pop("port", None) or free_port()
        config = write_config(
            tmp_path / "scow.toml", broker_config(tmp_path / "data", port=port, **kwargs)
        )
        broker = BrokerProcess(config, port, tmp_path / "broker.log").start()
        started.append(broker)
        return broker

    try:
        yield start
    finally:
        for broker in started:
            broker.kill()
