"""A seeded random schedule of faults against a broker with every feature on at once.

`ChaosRun(Settings(seed=...), workdir, ...).run()` starts the installed `scow run`, keeps
producers and consumers of every lane running in their own processes, injects one fault
every fraction of a second (chosen by a `random.Random(seed)`), then stops the clients,
drains every queue, checks that the broker's file descriptors, RSS, page files and journal
records came back near where they started, stops the broker and hands everything recorded
to the checker. The same seed replays the same sequence of faults (their exact timing
against the traffic differs from run to run).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proton import Terminus
from proton.utils import BlockingConnection

from scow.core.memory_trim import PERIOD as TRIM_PERIOD
from scow.core.testing import wait_for
from tests.system import native
from tests.system.broker import SystemBroker, describe_status
from tests.system.checker import Findings, History, Violation, check
from tests.system.drain import drain_all
from tests.system.faults import FAULT_KINDS, FAULTS, WEIGHTS, Check
from tests.system.processes import ROOT, Proc
from tests.system.records import read_all
from tests.system.topology import LANES, SUBSCRIPTIONS, BrokerSpec
from tests.tmpfs import Filler, Tmpfs, mount_tmpfs

#: Producer and consumer processes, by group: which lanes each serves.
PRODUCER_GROUPS = {
    "pA": ("paged", "topic", "stream", "select", "c", "ttl"),
    "pB": ("prio", "lvq", "qpaged", "poison", "large"),
}
CONSUMER_GROUPS = {
    "cA": ("paged", "select:color=red", "select:color=blue", "ttl:delay=0.05"),
    "cB": ("prio", "lvq", "qpaged", "poison", "large"),
    "cS": tuple(f"topic:sub={container}" for container, _ in SUBSCRIPTIONS),
}


@dataclass
class Settings:
    seed: int
    #: Seconds of faults (the wind-down, drain and checks come on top).
    duration: float = 12.0
    faults: tuple[str, ...] = FAULT_KINDS
    #: Kinds injected at least once each (at random points), besides the random draw.
    must: tuple[str, ...] = ()
    lanes: tuple[str, ...] = tuple(LANES)
    #: Scales every lane's send rate.
    rate_factor: float = 1.0
    #: Seconds between two faults.
    step: tuple[float, float] = (0.3, 1.2)
    idle_timeout_ms: int = 3000
    max_broker_restarts: int = 2
    tmpfs_size: str = "64m"
    #: How far above their baseline open fds and RSS may end, after the drain.
    fd_slack: int = 10
    rss_slack_kib: int = 32 * 1024
    #: Journal live records allowed above the baseline after the drain.
    record_slack: int = 64
    #: Overrides of `WEIGHTS` (0 leaves a kind out).
    weights: dict[str, int] = field(default_factory=dict)
    #: Seconds between samples of the broker's fds and RSS (0: none).
    sample_every: float = 0.0
    #: RSS at rest, at the start (after the warm-up) and after the drain, is the lowest
    #: of this many seconds of readings; longer than the broker's trim period, so both
    #: readings come after a trim has given freed heap back (0: the first reading within
    #: `rss_slack_kib`, which is all a short schedule needs).
    rest_window: float = 0.0
    #: Rounds of `duration` seconds of faults, each ended by a drain and a measurement at
    #: rest (the broker keeps running): a soak's RSS at rest after each lap shows whether
    #: it keeps growing or levels off. Queues are drained after every lap, streams (which
    #: reading does not empty) only after the last.
    laps: int = 1

    def replay_command(self) -> str:
        """The command that runs this schedule again (test_chaos.py::test_replay)."""
        env = [f"SCOW_CHAOS_SEED={self.seed}", f"SCOW_CHAOS_SECONDS={self.duration:g}"]
        if self.faults != FAULT_KINDS:
            env.append(f"SCOW_CHAOS_FAULTS={','.join(self.faults)}")
        if self.must:
            env.append(f"SCOW_CHAOS_MUST={','.join(self.must)}")
        if self.rate_factor != 1.0:
            env.append(f"SCOW_CHAOS_RATE={self.rate_factor:g}")
        if self.laps != 1:
            env.append(f"SCOW_CHAOS_LAPS={self.laps}")
        return " ".join(env) + " .venv/bin/python -m pytest tests/system/test_chaos.py -k replay"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Settings:
        """The settings a replay command gives (see `replay_command`)."""

        def kinds(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
            value = environ.get(name)
            return tuple(k for k in value.split(",") if k) if value else default

        return cls(
            seed=int(environ["SCOW_CHAOS_SEED"]),
            duration=float(environ.get("SCOW_CHAOS_SECONDS", "20")),
            faults=kinds("SCOW_CHAOS_FAULTS", FAULT_KINDS),
            must=kinds("SCOW_CHAOS_MUST", ()),
            rate_factor=float(environ.get("SCOW_CHAOS_RATE", "1")),
            laps=int(environ.get("SCOW_CHAOS_LAPS", "1")),
        )


class BrokerGone(Exception):
    """The broker would not start again: the schedule ends without a drain."""


@dataclass
class Report:
    seed: int
    settings: Settings
    faults: Counter[str] = field(default_factory=Counter)
    findings: Findings = field(default_factory=Findings)
    harness: list[Violation] = field(default_factory=list)
    broker_deaths: int = 0
    resources: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    workdir: Path | None = None

    @property
    def violations(self) -> list[Violation]:
        return self.harness + self.findings.violations

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def describe(self) -> str:
        lines = [
            f"chaos schedule seed {self.seed}: {len(self.violations)} violations "
            f"({self.seconds:.1f}s, workdir {self.workdir})",
            f"replay: {self.settings.replay_command()}",
            "faults: " + ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())),
            f"accepted {self.findings.accepted}, lost {self.findings.lost}, first deliveries "
            f"duplicated {self.findings.duplicated}, broker deaths {self.broker_deaths}, "
            f"in doubt {self.findings.in_doubt}",
            f"resources: {json.dumps(self.resources)}",
            *self.notes,
        ]
        lines += [str(v) for v in self.violations[:40]]
        if len(self.violations) > 40:
            lines.append(f"... and {len(self.violations) - 40} more")
        return "\n".join(lines)


class ChaosRun:
    def __init__(
        self,
        settings: Settings,
        workdir: Path,
        *,
        c_examples: native.CExamples | None = None,
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """`tls`: (CA file, server certificate, server key) for the TLS listener."""
        self.s = settings
        self.workdir = workdir
        self.events = workdir / "events"
        self.c_examples = c_examples
        self.tls = tls
        self.rng = random.Random(settings.seed)
        self.client_rng = random.Random(settings.seed + 1)
        self.report = Report(settings.seed, settings, workdir=workdir)
        self.procs: list[Proc] = []
        self.groups: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.generation: Counter[str] = Counter()
        self.next_start: dict[str, float] = {}
        self.checks: list[Check] = []
        self.restarts: list[tuple[float, float]] = []
        self.crashed: set[str] = set()
        self.c_sends: list[tuple[int, bool, float]] = []
        self.c_receive_outputs: dict[str, Path] = {}
        self.tmpfs: Tmpfs | None = None
        self.filler: Filler | None = None
        self.broker: SystemBroker | None = None
        self.dead = False
        self.winding_down = False
        self.baseline: dict[str, Any] = {}
        self.c_send_counts: dict[str, int] = {}
        workdir.mkdir(parents=True, exist_ok=True)
        self.timeline = open(workdir / "schedule.jsonl", "a", buffering=1)  # noqa: SIM115
        self.weights = {**WEIGHTS, **settings.weights}
        self.kinds = [k for k in settings.faults if self._possible(k) and self.weights[k] > 0]
        #: Called with each sample of the broker's resources (see Settings.sample_every).
        self.on_sample: Callable[[dict[str, Any]], None] | None = None
        self.next_sample = 0.0

    # ------------------------------------------------------------------ the run

    def run(self) -> Report:
        start = time.monotonic()
        try:
            self.setup()
            for lap in range(1, self.s.laps + 1):
                if lap > 1:
                    self.resume()
                self.inject_faults()
                self.wind_down()
                self.drain_and_measure(last=lap == self.s.laps)
            self.stop_broker()
            self.summarize_log()
            self.report.findings = check(
                History(
                    events=read_all(self.events),
                    restarts=self.restarts,
                    printed={
                        name: native.printed_bodies(path)
                        for name, path in self.c_receive_outputs.items()
                    },
                    crashed=self.crashed,
                    c_sends=self.c_sends,
                    lanes=self.s.lanes,
                )
            )
        except BrokerGone:
            # reported as restart-failed; nothing left to drain or check
            self.summarize_log()
        except Exception as exc:
            self.violation("harness", f"the schedule could not run to its end: {exc!r}")
            raise
        finally:
            self.cleanup()
            self.report.seconds = time.monotonic() - start
            self.timeline.close()
        return self.report

    def log(self, kind: str, **fields: Any) -> None:
        record = {"t": time.time(), "kind": kind, **fields}
        self.timeline.write(json.dumps(record, default=sorted) + "\n")

    def violation(self, kind: str, detail: str) -> None:
        self.report.harness.append(Violation(kind, detail))
        self.log("violation", violation=kind, detail=detail)

    def _possible(self, kind: str) -> bool:
        lanes = set(self.s.lanes)
        needs = {
            "tls-vanish": self.tls is not None,
            "c-receive-kill": self.c_examples is not None and "c" in lanes,
            "c-send": self.c_examples is not None,
            "mid-frame-kill": "large" in lanes,
            "mid-tx-kill": "tx" in lanes,
            "stream-read": "stream" in lanes,
        }
        return needs.get(kind, True)

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        self.events.mkdir(parents=True, exist_ok=True)
        data_dir = None
        if "disk-full" in self.kinds:
            mounted = mount_tmpfs(self.workdir / "disk", self.s.tmpfs_size)
            if isinstance(mounted, str):
                self.kinds.remove("disk-full")
                self.report.notes.append(f"disk-full left out: {mounted}")
            else:
                self.tmpfs = mounted
                data_dir = mounted.path / "data"
                self.filler = Filler(mounted.path / "filler")
        spec = BrokerSpec(
            lanes=self.s.lanes,
            idle_timeout_ms=self.s.idle_timeout_ms,
            tls=(self.tls[1], self.tls[2]) if self.tls else None,
            data_dir=data_dir,
        )
        self.broker = spec.create(self.workdir / "broker")
        self.broker.start()
        self.log("broker-started", pid=self.broker.pid)
        if "topic" in self.s.lanes:
            self.subscribe()
        self.warm_up()
        self.baseline = self.measure()
        if self.s.rest_window:
            self.baseline["rss_kib"] = self.rss_at_rest()
        self.report.resources["baseline"] = self.baseline
        self.define_groups()
        self.supervise()

    def subscribe(self) -> None:
        """Create the durable subscriptions before anything is published to the topic."""
        from tests.system.clients import Capabilities, Durable

        assert self.broker is not None
        for container, link in SUBSCRIPTIONS:
            conn = BlockingConnection(self.broker.url, timeout=10, container_id=container)
            try:
                receiver = conn.create_receiver(
                    LANES["topic"].address, name=link, options=[Capabilities("topic"), Durable()]
                )
                assert receiver.link.source.durability == Terminus.DELIVERIES
                receiver.link.detach()
            finally:
                conn.close()

    def warm_up(self) -> None:
        """One message through the broker, so the baseline is a broker that has served."""
        from proton import Message

        assert self.broker is not None
        conn = BlockingConnection(self.broker.url, timeout=10)
        try:
            conn.create_sender("sys.warmup").send(Message(body="warm", durable=True))
            receiver = conn.create_receiver("sys.warmup")
            receiver.receive(timeout=10)
            receiver.accept()
        finally:
            conn.close()
        wait_for(lambda: self.broker.api("/api/broker")["connections"] == 0, 10)

    def define_groups(self) -> None:
        lanes = set(self.s.lanes)
        for group, names in PRODUCER_GROUPS.items():
            mine = tuple(n for n in names if n in lanes)
            if mine:
                self.groups[group] = ("producer", mine)
        for group, specs in CONSUMER_GROUPS.items():
            mine = tuple(s for s in specs if s.split(":")[0] in lanes)
            if mine:
                self.groups[group] = ("consumer", mine)
        if "tx" in lanes:
            self.groups["tP"] = ("tx-producer", ())
            self.groups["tC"] = ("tx-consumer", ())

    # ------------------------------------------------------------------ processes

    def spawn(
        self,
        role: str,
        name: str,
        args: list[str],
        *,
        group: str | None = None,
        until: float | None = None,
    ) -> Proc:
        assert self.broker is not None
        out = self.events / f"{name}.out"
        if role.startswith("c-"):
            command = args
        else:
            command = [
                sys.executable,
                "-m",
                "tests.system.clients",
                role,
                "--log",
                str(self.events / f"{name}.jsonl"),
                "--name",
                name,
                "--seed",
                str(self.client_rng.randrange(1 << 30)),
                *args,
            ]
        with open(out, "wb") as stdout:
            popen = subprocess.Popen(
                command,
                cwd=ROOT,
                stdout=stdout,
                stderr=subprocess.STDOUT if not role.startswith("c-") else subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        proc = Proc(name, role, popen, group=group, until=until, out=out)
        self.procs.append(proc)
        self.log("spawn", name=name, role=role, pid=popen.pid, group=group)
        return proc

    def start_group(self, group: str) -> Proc:
        assert self.broker is not None
        role, specs = self.groups[group]
        self.generation[group] += 1
        name = f"{group}.{self.generation[group]}"
        rng = self.client_rng
        url = ["--url", self.broker.url, "--rate-factor", str(self.s.rate_factor)]
        if role == "producer":
            args = [*url, "--lanes", ",".join(specs), "--window", str(rng.randint(3, 20))]
        elif role == "consumer":
            args = [
                *url,
                "--credit",
                str(rng.randint(5, 20)),
                "--ack-every",
                str(rng.randint(1, 5)),
            ]
            for spec in specs:
                args += ["--receive", spec]
        else:
            args = [*url, "--batch", "5", "--abort-ratio", "0.25", "--hold", "0.6"]
        return self.spawn(role, name, args, group=group)

    def supervise(self) -> None:
        """Reap exited clients, end transient ones on time, restart groups that lost
        their client."""
        now = time.monotonic()
        for proc in self.procs:
            if proc.popen.poll() is not None:
                if proc.ended is None:
                    proc.ended = time.time()
                continue
            if proc.until is not None and now >= proc.until and proc.stopped_at is None:
                if not proc.terminated:
                    proc.terminated = True
                    proc.popen.send_signal(signal.SIGTERM)
                elif now >= proc.until + 5:
                    self.kill(proc, crashed=False)
        if self.winding_down or self.dead:
            return
        for group in self.groups:
            if any(p.group == group and p.live for p in self.procs):
                continue
            at = self.next_start.get(group)
            if at is None:
                self.next_start[group] = now + self.client_rng.uniform(0.1, 0.8)
            elif now >= at:
                del self.next_start[group]
                self.start_group(group)

    def kill(self, proc: Proc, *, crashed: bool = True) -> None:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGKILL)
            proc.killed = True
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(5)
        if crashed:
            self.crashed.add(proc.name)

    def live(self, *roles: str) -> list[Proc]:
        return [p for p in self.procs if p.live and (not roles or p.role in roles)]

    def pause(self, seconds: float) -> None:
        """Let the schedule run for `seconds` (clients supervised, the broker watched)."""
        end = time.monotonic() + seconds
        while True:
            self.supervise()
            self.watch_broker()
            if self.s.sample_every and time.monotonic() >= self.next_sample and not self.dead:
                self.sample()
            left = end - time.monotonic()
            if left <= 0 or self.dead:
                return
            time.sleep(min(0.05, left))

    def sample(self) -> None:
        assert self.broker is not None
        self.next_sample = time.monotonic() + self.s.sample_every
        try:
            sample = {"t": time.time(), **self.measure()}
        except Exception as exc:  # the broker may be restarting
            sample = {"t": time.time(), "error": repr(exc)}
        self.report.resources.setdefault("samples", []).append(sample)
        self.log("sample", **sample)
        if self.on_sample is not None:
            self.on_sample(sample)

    def restart_broker(self) -> None:
        """Start the broker again; one that refuses to start is a finding, and is given a
        second try (as an operator or a supervisor would) before the schedule gives up."""
        assert self.broker is not None
        for attempt in (1, 2):
            try:
                self.broker.start()
                return
            except AssertionError as exc:
                lines = [
                    line
                    for line in str(exc).splitlines()
                    if "Error" in line or "error" in line or "Traceback" in line
                ]
                self.violation(
                    "restart-failed",
                    f"the broker did not start again after a SIGKILL (try {attempt}): "
                    + " | ".join(lines[-4:]),
                )
        raise BrokerGone("the broker does not start any more; see restart-failed")

    def watch_broker(self) -> None:
        assert self.broker is not None
        if not self.dead and self.broker.died() is not None:
            self.dead = True
            self.report.broker_deaths += 1
            self.violation("broker-death", self.broker.death_report())
            for line in self.broker.log_lines("Traceback", "error", "Error", limit=10):
                self.report.notes.append(f"broker log: {line}")

    # ------------------------------------------------------------------ faults

    def inject_faults(self) -> None:
        end = time.monotonic() + self.s.duration
        weights = [self.weights[k] for k in self.kinds]
        # the kinds that must come, each at a random step of the schedule's first half (and
        # all that are left once time runs short)
        steps = max(1, int(0.5 * self.s.duration / (sum(self.s.step) / 2)))
        must = [k for k in self.s.must if k in self.kinds]
        positions = self.rng.sample(range(steps), min(len(must), steps))
        planned = dict(zip(positions, must[: len(positions)], strict=True))
        late = must[len(positions) :]
        self.pause(1.0)  # traffic first
        step = 0
        while not self.dead:
            left = end - time.monotonic()
            if left <= 0 and (not (planned or late) or left < -15):
                break
            self.pause(self.rng.uniform(*self.s.step))
            self.run_checks()
            if self.dead or not self.kinds:
                break
            kind = self.rng.choices(self.kinds, weights)[0]
            choice = self.rng.random()  # drawn for every fault: the sequence stays the seed's
            forced = True
            if step in planned:
                kind = planned.pop(step)
            elif (planned or late) and left < 4 * max(self.s.step) * (len(planned) + len(late)):
                late += [planned.pop(k) for k in sorted(planned)]
                kind = late.pop(0)
            else:
                forced = False
            step += 1
            injected = FAULTS[kind](self, choice)
            if injected:
                self.report.faults[kind] += 1
            elif forced:
                late.append(kind)  # not possible right now (no victim yet): later

    def run_checks(self) -> None:
        now = time.monotonic()
        for c in list(self.checks):
            ok = c.test()
            if ok or now > c.deadline:
                self.checks.remove(c)
                self.log("check", check=c.kind, what=c.description, ok=ok)
                if c.on_done is not None:
                    c.on_done(ok)

    # ------------------------------------------------------------------ the end

    def wind_down(self) -> None:
        """Let pending checks finish, then stop producers, then consumers."""
        while self.checks and not self.dead:
            self.pause(0.2)
            self.run_checks()
        for c in self.checks:  # the broker died: no verdict
            if c.on_done is not None and c.kind == "client-stop":
                self.kill(next(p for p in self.procs if p.name == c.description))
        self.checks = []
        self.winding_down = True
        self.log("wind-down")
        for proc in self.procs:
            if proc.stopped_at is not None:
                self.kill(proc)
        self.wait_roles(("producer", "tx-producer", "c-send"), grace=10)
        self.log("producers-stopped")
        self.pause(1.0)  # consumers take what is left in flight
        self.wait_roles(("consumer", "tx-consumer", "raw", "c-receive"), grace=10)
        self.log("consumers-stopped")
        for proc in self.procs:
            count = self.c_send_counts.pop(proc.name, None)  # each once, in its lap
            if count is not None:
                out = proc.out.read_text(errors="replace") if proc.out else ""
                done = proc.popen.returncode == 0 and f"{count} messages sent" in out
                self.c_sends.append((count, done, proc.ended or time.time()))
        if self.filler is not None:
            self.filler.release()
        assert self.broker is not None
        if self.dead:
            self.restart_broker()  # to drain what survived
            self.restarts.append((time.time(), time.time()))
            self.dead = False
        self.watch_broker()

    def resume(self) -> None:
        """Start the next lap (the clients of the last one have all ended; they stay in
        `procs`, whose length numbers the next clients' names and so their logs)."""
        self.winding_down = False
        self.log("lap")

    def wait_roles(self, roles: tuple[str, ...], grace: float) -> None:
        procs = [p for p in self.procs if p.role in roles and p.popen.poll() is None]
        for proc in procs:
            proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(proc, crashed=False)
                self.report.notes.append(f"{proc.name} did not stop on SIGTERM: killed")

    def measure(self) -> dict[str, Any]:
        assert self.broker is not None and self.broker.data_dir is not None
        stats = self.broker.api("/api/broker")
        return {
            "fds": self.broker.fds(),
            "rss_kib": self.broker.rss_kib(),
            "page_files": _page_files(self.broker.data_dir / "paging"),
            "journal_records": stats["journal"]["messages"]["records"],
            "paged_messages": stats["paging"]["paged-messages"],
            "connections": stats["connections"],
        }

    def rss_at_rest(self) -> int:
        """The broker's lowest RSS over `rest_window` seconds without clients."""
        assert self.broker is not None
        end = time.monotonic() + self.s.rest_window
        lowest = self.broker.rss_kib()
        while time.monotonic() < end:
            time.sleep(0.5)
            lowest = min(lowest, self.broker.rss_kib())
        return lowest

    def drain_and_measure(self, *, last: bool = True) -> None:
        assert self.broker is not None
        with contextlib.suppress(AssertionError):
            wait_for(lambda: self.broker.api("/api/broker")["connections"] == 0, 15)
        self.log("disconnected")
        self.log("drain")
        drained = drain_all(self.broker, self.events / "drain.jsonl", streams=last)
        self.log("drained", queues=drained.taken, stuck=drained.stuck)
        resources = self.report.resources
        resources["drained"] = resources.get("drained", 0) + sum(drained.taken.values())
        for queue, count in drained.stuck.items():
            self.violation(
                "stuck",
                f"{queue}: the broker reports {count} more messages than a consumer could "
                "receive from it in the final drain",
            )
        self.watch_broker()
        if self.dead:
            return
        base = self.baseline
        restarted = self.report.resources.get("restarted")
        fd_base = restarted[-1]["fds"] if restarted else base["fds"]
        rss_base = max(base["rss_kib"], restarted[-1]["rss_kib"] if restarted else 0)
        stream = _stream_count(self.broker) if "stream" in self.s.lanes else 0

        def settled() -> dict[str, Any] | None:
            now = self.measure()
            ok = (
                now["fds"] <= fd_base + self.s.fd_slack
                and now["page_files"] <= base["page_files"]
                and now["journal_records"] <= base["journal_records"] + stream + self.s.record_slack
            )
            return now if ok else None

        try:
            after = wait_for(settled, 20, 0.5, "resources to settle")
        except AssertionError:
            after = self.measure()
            assert self.broker.data_dir is not None
            pages = _listing(self.broker.data_dir / "paging")
            self.violation(
                "resources",
                f"after the drain: {after} (baseline {base}, fd baseline {fd_base}, stream "
                f"messages {stream}); open fds, page files and journal records must return "
                f"near their baseline; page files: {pages}; cursors: {self._paging_cursors()}",
            )
        # RSS at rest: the broker gives freed heap back at its next trim, not at once
        broker = self.broker
        limit = rss_base + self.s.rss_slack_kib
        if self.s.rest_window:
            after["rss_kib"] = self.rss_at_rest()
        else:
            with contextlib.suppress(AssertionError):
                wait_for(lambda: broker.rss_kib() <= limit, TRIM_PERIOD + 10, 0.5, "RSS to settle")
            after["rss_kib"] = broker.rss_kib()
        if after["rss_kib"] > limit:
            self.violation(
                "resources",
                f"RSS after the drain {after['rss_kib']} KiB, baseline {rss_base} KiB "
                f"(allowed +{self.s.rss_slack_kib} KiB)",
            )
        self.report.resources["after"] = after
        self.report.resources.setdefault("laps", []).append(after)
        self.log("settled", after=after)

    def _paging_cursors(self) -> dict[str, Any]:
        """The cursors of every address that still has pages (for a resources finding)."""
        assert self.broker is not None
        return {
            a["name"]: a.get("cursors")
            for a in self.broker.api("/api/addresses")
            if a.get("page-count")
        }

    def stop_broker(self) -> None:
        assert self.broker is not None
        if not self.broker.running():
            return
        status = self.broker.stop()
        self.log("broker-stopped", status=status)
        if status != 0:
            self.violation(
                "broker-stop",
                f"SIGTERM: the broker ended with {describe_status(status)}\n"
                f"{self.broker.log_tail(20)}",
            )

    def summarize_log(self) -> None:
        """The broker's errors and warnings, counted by event (notes, not violations)."""
        assert self.broker is not None
        counts: Counter[str] = Counter()
        for line in self.broker.log_lines("[error", "[warning", "[critical", limit=100_000):
            level, _, rest = line.partition("[")[2].partition("]")
            event = re.split(r"\s+[\w-]+=", rest.strip(), maxsplit=1)[0].strip()
            counts[f"{level.strip()}: {event}"] += 1
        for event, count in counts.most_common(12):
            self.report.notes.append(f"broker log: {count} x {event}")

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(5)
        if self.broker is not None:
            self.broker.kill()
        if self.filler is not None:
            self.filler.release()
        if self.tmpfs is not None:
            self.tmpfs.unmount()


def _listing(directory: Path) -> list[str]:
    """Files under `directory` with their sizes (what a violation report shows)."""
    if not directory.exists():
        return []
    return [
        f"{p.relative_to(directory)} ({p.stat().st_size} B)"
        for p in sorted(directory.glob("*/*.page"))
        if p.is_file()
    ][:20]


def _page_files(directory: Path) -> int:
    """Page files (`NNNNNNNNN.page`) of every address folder."""
    if not directory.exists():
        return 0
    return sum(1 for p in directory.glob("*/*.page") if p.is_file())


def _stream_count(broker: SystemBroker) -> int:
    with contextlib.suppress(Exception):
        return int(broker.api(f"/api/queues/{LANES['stream'].address}")["message-count"])
    return 0
