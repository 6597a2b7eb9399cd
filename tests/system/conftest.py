"""Fixtures of the system tests: the installed `scow run` in a subprocess, the C examples,
a throwaway PKI and a small tmpfs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.helpers import Pki, make_pki
from tests.system import native
from tests.system.broker import SystemBroker
from tests.system.topology import BrokerSpec
from tests.tmpfs import Tmpfs, mount_tmpfs


@pytest.fixture(scope="session")
def c_build(tmp_path_factory: pytest.TempPathFactory) -> native.CExamples | str:
    """proton's C send/receive examples, compiled once per session, or why they are not."""
    return native.build(tmp_path_factory.mktemp("c-examples"))


@pytest.fixture
def c_examples(c_build: native.CExamples | str) -> native.CExamples:
    """proton's C examples (skips the test when they cannot be built)."""
    if isinstance(c_build, str):
        pytest.skip(f"proton's C examples are not available: {c_build}")
    return c_build


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def system_broker(tmp_path: Path) -> Iterator[Callable[..., SystemBroker]]:
    """Factory: `system_broker(BrokerSpec(...))` -> a running `scow run`, checked at the end.

    A broker that exited on its own fails the test with its status and log tail, even when
    the test body passed.
    """
    started: list[SystemBroker] = []

    def start(spec: BrokerSpec | None = None, **kwargs: Any) -> SystemBroker:
        broker = (spec or BrokerSpec()).create(tmp_path / f"broker-{len(started)}", **kwargs)
        started.append(broker.start())
        return broker

    yield start
    deaths = [b.death_report() for b in started if b.died() is not None]
    for broker in started:
        broker.kill()
    assert not deaths, "\n".join(deaths)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Tmpfs]]:
    """Factory: `tmpfs("32m")` -> a tmpfs mounted under tmp_path, unmounted at the end
    (skips the test when mounting is not permitted)."""
    with contextlib.ExitStack() as stack:
        count = iter(range(1000))

        def mount(size: str) -> Tmpfs:
            mounted = mount_tmpfs(tmp_path / f"tmpfs-{next(count)}", size)
            if isinstance(mounted, str):
                pytest.skip(mounted)
            stack.callback(mounted.unmount)
            return mounted

        yield mount
