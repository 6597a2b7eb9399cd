"""High availability over a shared store: a primary and a backup (Artemis's shared-store HA).

`[ha] policy = "primary" | "backup"` makes a broker a member of a pair sharing one store:
the data dir of the file journal (on a local disk or NFSv4), or the database of the
database store. Whoever holds the store's lock (`StoreLock`) serves; the other waits,
trying the lock every `lock-poll-period`, and never opens the store for writing meanwhile.

What the members tell each other lives in the store too, next to the lock:

- the store's *state*: ``LIVE`` while a member serves; at a clean stop ``STOPPED`` (the
  backup stays waiting: `failover-on-shutdown = false`) or ``FAILOVER`` (it takes over);
  ``FAILBACK`` while a primary that came back asks the serving backup to hand over
  (`allow-failback`);
- each member's *announcement* (role, state, AMQP URL, pid, host), for `scow ha status`,
  the management API, and the `failover-server-list` clients get in the Open frame.

A member checks the state only once it holds the lock (and lets go at once when the state
says the lock is not its to take), so a state written while the lock changes hands is never
missed. A serving member steps down when the state asks for the store back or the lock can
no longer be relied on (a database lease not renewed in time): it stops serving and starts
again in a fresh process (`os.execv`), waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from scow.core.data_lock import DataDirLock, DataDirLocked

log = structlog.get_logger("scow.ha")

#: The store's state (see the module's doc).
LIVE = "LIVE"
STOPPED = "STOPPED"
FAILOVER = "FAILOVER"
FAILBACK = "FAILBACK"

PRIMARY = "primary"
BACKUP = "backup"

#: A member's own state.
WAITING = "waiting"
SERVING = "serving"

#: Announcements older than this many heartbeats are shown as stale.
STALE_AFTER = 5


class StoreUnreachable(Exception):
    """The store cannot be reached now (a database that is down); trying later may work."""


@dataclass
class Member:
    """One member of an HA pair as it announced itself in the store."""

    name: str
    role: str
    state: str
    url: str
    pid: int
    host: str
    #: When it last announced itself (seconds since the epoch).
    updated: float

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Member:
        return cls(**{k: values[k] for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StoreLock(Protocol):
    """Who may open a shared store, and what HA members note next to it.

    Every method may block on I/O: the broker calls them off its event loop.
    """

    #: The store, for messages ("data dir /srv/scow", "database postgresql://...").
    where: str

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False while another member holds it."""

    def holder(self) -> str:
        """Who holds the lock, as it says (pid and host), for messages."""

    def release(self) -> None:
        """Give the lock back (a no-op when not held)."""

    def trouble(self) -> str | None:
        """Why the lock, held, can no longer be relied on (a lease that was not renewed in
        time), or None."""

    def read_state(self) -> str | None: ...

    def write_state(self, state: str) -> None: ...

    def announce(self, member: Member) -> None:
        """Record (or refresh) this member's announcement."""

    def members(self) -> list[Member]: ...


class FileStoreLock:
    """The data-dir lock (`flock`) with the state and announcements as files beside it:
    `<data-dir>/ha/state` and `<data-dir>/ha/<member>.json`, each replaced whole."""

    def __init__(self, data_dir: Path, lock: DataDirLock | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.lock = lock or DataDirLock(self.data_dir)
        self.where = f"data dir {self.data_dir.resolve()}"
        self._holder = ""

    @property
    def _ha_dir(self) -> Path:
        return self.data_dir / "ha"

    def try_acquire(self) -> bool:
        try:
            self.lock.acquire()
        except DataDirLocked as exc:
            self._holder = str(exc)
            return False
        return True

    def holder(self) -> str:
        return self._holder

    def release(self) -> None:
        self.lock.release()

    def trouble(self) -> str | None:
        return None  # a kernel lock cannot lapse while its process lives

    def read_state(self) -> str | None:
        with contextlib.suppress(FileNotFoundError):
            return (self._ha_dir / "state").read_text().strip() or None
        return None

    def write_state(self, state: str) -> None:
        _write_whole(self._ha_dir / "state", state + "\n")

    def announce(self, member: Member) -> None:
        _write_whole(self._ha_dir / f"{_file_name(member.name)}.json", json.dumps(member.to_dict()))

    def members(self) -> list[Member]:
        found = []
        for path in sorted(self._ha_dir.glob("*.json")):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found.append(Member.from_dict(json.loads(path.read_text())))
        return found


def _write_whole(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step (a reader sees the old or the new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "broker"


def member(name: str, role: str, state: str, url: str) -> Member:
    return Member(name, role, state, url, os.getpid(), socket.gethostname(), time.time())


def may_take(role: str, state: str | None, primary_alive: bool) -> str | None:
    """Why a member of `role` that just took the lock must let it go again (the store's
    `state` says it is not its to take), or None: it may serve.

    A primary takes the store whatever its state. A backup does not take it from a live
    primary asking for it back (FAILBACK), nor after a clean stop that did not ask for a
    failover (STOPPED).
    """
    if role == PRIMARY:
        return None
    if state == FAILBACK and primary_alive:
        return "the primary is taking the store back"
    if state == STOPPED:
        return "the broker that served stopped cleanly (its failover-on-shutdown is false)"
    return None


def failover_server_list(own_url: str, members: list[Member]) -> list[dict[str, Any]]:
    """The other members' AMQP addresses, as Qpid JMS reads `failover-server-list`."""
    servers = []
    for m in members:
        if m.url and m.url != own_url:
            scheme, _, rest = m.url.partition("://")
            host, _, port = rest.rpartition(":")
            if host and port.isdigit():
                servers.append({"hostname": host, "port": int(port), "scheme": scheme or "amqp"})
    return servers


#: Seconds between a member's announcements (a primary silent for STALE_AFTER of them is
#: not waiting any more: its FAILBACK request lapses).
HEARTBEAT = 1.0


class HaMember:
    """This broker's part in a pair: waits for the store, watches it while serving, and
    leaves it in the state its stop calls for. `Server` drives it (see core/app.py)."""

    def __init__(self, settings: Mapping[str, Any], lock: StoreLock, name: str, url: str) -> None:
        self.role = str(settings["policy"])
        self.allow_failback = bool(settings["allow-failback"])
        self.failover_on_shutdown = bool(settings["failover-on-shutdown"])
        self.poll = int(settings["lock-poll-period"]) / 1000
        self.lock = lock
        self.name = name
        self.url = url
        self.state = WAITING
        #: Why this member stopped serving to wait again (set: the process starts afresh).
        self.step_down: str | None = None
        self.stepped_down = asyncio.Event()
        self.peers: list[Member] = []
        self._announced = 0.0
        self._watcher: asyncio.Task[None] | None = None

    async def _run(self, call: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, call, *args)

    async def _announce(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._announced >= HEARTBEAT:
            self._announced = now
            await self._run(self.lock.announce, member(self.name, self.role, self.state, self.url))
            self.peers = [m for m in await self._run(self.lock.members) if m.name != self.name]

    def _primary_alive(self) -> bool:
        fresh = time.time() - STALE_AFTER * HEARTBEAT
        return any(m.role == PRIMARY and m.updated >= fresh for m in self.peers)

    async def wait_for_store(
        self, stop: asyncio.Event, waiting: Callable[[], None] | None = None
    ) -> bool:
        """Hold the store's lock, as a member that may serve; False if `stop` came first.
        `waiting` is called once if the store is not taken at the first try.

        A store that cannot be reached now (the database is down) is tried again at the
        next poll; only a lock that cannot ever be taken (a bad configuration) raises."""
        lock = self.lock
        log.info("ha: waiting for the store", role=self.role, store=lock.where)
        asked = told = False
        unreachable: str | None = None
        while not stop.is_set():
            try:
                await self._announce()
                if await self._run(lock.try_acquire):
                    state = await self._run(lock.read_state)
                    refused = may_take(self.role, state, self._primary_alive())
                    if refused is None:
                        return True
                    await self._run(lock.release)
                    if not told:
                        log.info("ha: the store is free but not ours to take", reason=refused)
                        told = True
                elif self.role == PRIMARY and self.allow_failback and not asked:
                    await self._run(lock.write_state, FAILBACK)
                    asked = True
                    log.info(
                        "ha: asking the serving broker for the store back", holder=lock.holder()
                    )
            except (StoreUnreachable, OSError) as exc:  # unreachable now: try again
                await self._run(lock.release)
                if str(exc) != unreachable:
                    unreachable = str(exc)
                    log.warning("ha: the store cannot be reached; trying again", reason=unreachable)
            if waiting is not None:
                waiting()
                waiting = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll)
        return False

    async def serving(self) -> None:
        """The store is ours and the broker serves: say so, and watch for a reason to hand
        over (a primary asking for the store back, a lock that cannot be relied on)."""
        self.state = SERVING
        await self._run(self.lock.write_state, LIVE)
        await self._announce(force=True)
        log.info("ha: serving", role=self.role, store=self.lock.where)
        self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        checking: asyncio.Future[str | None] | None = None
        while True:
            await asyncio.sleep(self.poll)
            trouble = self.lock.trouble()  # in memory: on time even while the store hangs
            if trouble is not None:
                self._hand_over(trouble)
                return
            if checking is None:
                checking = asyncio.ensure_future(self._check_store())
            elif checking.done():
                state, checking = checking.result(), None
                if self.role != PRIMARY and state == FAILBACK and self._primary_alive():
                    self._hand_over("the primary came back and asks for the store")
                    return

    async def _check_store(self) -> str | None:
        """The store's state (None if it cannot be read now: `trouble()` watches the lock
        meanwhile), and this member's heartbeat (both may wait on the store)."""
        try:
            state = await self._run(self.lock.read_state)
        except Exception as exc:
            log.warning("ha: the store's state cannot be read", reason=str(exc))
            return None
        with contextlib.suppress(Exception):  # announcements are for people and peers
            await self._announce()
        return state

    def _hand_over(self, reason: str) -> None:
        log.warning("ha: stepping down, to wait for the store again", reason=reason)
        self.step_down = reason
        self.stepped_down.set()

    async def leave(self) -> None:
        """The broker stopped serving (the store is still locked): leave the state the next
        member must find. A clean stop says STOPPED or FAILOVER (failover-on-shutdown); a
        hand-over leaves FAILBACK as the primary wrote it, or nothing (the store is lost)."""
        if self._watcher is not None:
            self._watcher.cancel()
        self.state = WAITING
        if self.step_down is None:
            await self._run(
                self.lock.write_state, FAILOVER if self.failover_on_shutdown else STOPPED
            )
        with contextlib.suppress(Exception):
            await self._run(self.lock.announce, member(self.name, self.role, "stopped", self.url))

    def status(self) -> dict[str, Any]:
        """For the management API."""
        return {
            "policy": self.role,
            "state": self.state,
            "store": self.lock.where,
            "url": self.url,
            "peers": [m.to_dict() for m in self.peers],
        }
