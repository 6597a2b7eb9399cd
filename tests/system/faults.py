"""The faults a chaos schedule injects, by kind, and how often each is drawn.

Each fault is a function `(run, choice) -> bool`: it acts on the running schedule (`run`,
a `ChaosRun`), takes its victim by `choice` (a number in [0, 1) the schedule drew from its
seed) and says whether it could inject anything. Faults whose effect takes time to judge
(a frozen consumer's messages coming back, sends resuming after a full disk) leave a
`Check` for the schedule to evaluate in the background.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.system.processes import Proc, local_ports
from tests.system.records import Tail, read_events
from tests.system.topology import C_SEND_ADDRESS, LANES

if TYPE_CHECKING:
    from tests.system.harness import ChaosRun

#: Fault kinds and how often each is drawn.
WEIGHTS = {
    "client-kill": 4,
    "client-stop": 1,
    "tcp-reset": 2,
    "tls-vanish": 2,
    "mid-frame-kill": 1,
    "mid-tx-kill": 1,
    "broker-restart": 1,
    "disk-full": 1,
    "slow-consumer": 1,
    "consumer-pause": 2,  # a consumer group away for seconds: backlogs page
    "c-receive-kill": 2,
    "c-send": 1,
    "stream-read": 1,  # not a fault: a reader from `first` that comes and goes
}
FAULT_KINDS = tuple(WEIGHTS)
#: What the default test run uses: every kind but the slowest to recover from.
QUICK_FAULTS = tuple(k for k in FAULT_KINDS if k not in ("broker-restart", "disk-full"))

#: Lanes a raw (crashing) receiver may attach to: plain queues.
RAW_LANES = ("paged", "select", "prio", "lvq", "qpaged", "ttl", "poison", "large", "c")


@dataclass
class Check:
    """A condition the schedule waits for in the background (a stopped client's messages
    redelivered, durable sends resuming after a full disk)."""

    kind: str
    description: str
    deadline: float
    test: Callable[[], bool]
    on_done: Callable[[bool], None] | None = None


def _pick(procs: list[Proc], choice: float) -> Proc | None:
    procs = sorted(procs, key=lambda p: p.name)
    return procs[int(choice * len(procs))] if procs else None


def client_kill(run: ChaosRun, choice: float) -> bool:
    victim = _pick(
        run.live("producer", "consumer", "tx-producer", "tx-consumer", "c-receive"), choice
    )
    if victim is None:
        return False
    run.log("fault", fault="client-kill", victim=victim.name)
    run.kill(victim)
    return True


def client_stop(run: ChaosRun, choice: float) -> bool:
    """SIGSTOP a consumer (one holding unsettled messages when there is one): the
    broker's idle timeout must drop its connection and redeliver what it held, with a
    raised delivery count, to the consumer that replaces it."""
    assert run.broker is not None
    if any(c.kind == "client-stop" for c in run.checks):
        return False
    candidates = run.live("consumer", "tx-consumer")
    holding = [p for p in candidates if held_by(read_events(run.events / f"{p.name}.jsonl"))]
    victim = _pick(holding or candidates, choice)
    if victim is None:
        return False
    ports = local_ports(victim.popen.pid)
    os.kill(victim.popen.pid, signal.SIGSTOP)
    victim.stopped_at = stopped_at = time.time()
    run.crashed.add(victim.name)
    held = held_by(read_events(run.events / f"{victim.name}.jsonl"))
    run.log("fault", fault="client-stop", victim=victim.name, held=sorted(held), ports=ports)
    timeout = 2 * run.s.idle_timeout_ms / 1000 + 10
    restarts = len(run.restarts)
    state: dict[str, Any] = {}
    tail = Tail(run.events)
    again: set[str] = set()

    def freed() -> bool:
        if len(run.restarts) != restarts:
            return True  # the restart ended the stopped connection anyway: no verdict
        if "dropped" not in state:
            remotes = {c["remote"] for c in run.broker.api("/api/connections")}
            if any(f"127.0.0.1:{port}" in remotes for port in ports):
                return False
            state["dropped"] = time.time() - stopped_at
        again.update(
            e["id"]
            for e in tail.poll()
            if e["kind"] == "delivered"
            and e["client"] != victim.name
            and e["t"] > stopped_at
            and (e.get("count") or 0) >= 1
        )
        state["missing"] = held - again
        return not state["missing"]

    def done(ok: bool) -> None:
        run.kill(victim)
        run.log("stopped-client", victim=victim.name, **state)
        if ok:
            return
        if "dropped" not in state:
            run.violation(
                "stopped-client",
                f"{victim.name} was SIGSTOPped; {timeout:.0f}s later the broker still held "
                f"its connection (idle-timeout {run.s.idle_timeout_ms} ms) and the "
                f"{len(held)} messages it had not settled",
            )
        else:
            run.violation(
                "stopped-client",
                f"{victim.name} was SIGSTOPped holding {len(held)} unsettled messages; "
                f"the broker dropped its connection after {state['dropped']:.1f}s but "
                f"{len(state['missing'])} of them ({sorted(state['missing'])[:5]}) were "
                "not redelivered with a raised delivery count to another consumer",
            )

    run.checks.append(Check("client-stop", victim.name, time.monotonic() + timeout, freed, done))
    return True


def _raw(run: ChaosRun, mode: str, end: str, lane: str, *, tls: bool, until: float = 10) -> Proc:
    assert run.broker is not None
    port = run.broker.tls_port if tls else run.broker.port
    name = f"raw{len(run.procs)}"
    args = ["--port", str(port), "--lane", lane, "--mode", mode, "--end", end]
    args += ["--count", str(run.rng.randint(1, 30)), "--seconds", "1.5"]
    if tls:
        assert run.tls is not None
        args += ["--tls-ca", str(run.tls[0])]
    proc = run.spawn("raw", name, args, until=time.monotonic() + until)
    run.crashed.add(name)
    return proc


def _raw_lane(run: ChaosRun, choice: float) -> str | None:
    lanes = [n for n in RAW_LANES if n in run.s.lanes]
    return lanes[int(choice * len(lanes))] if lanes else None


def tcp_reset(run: ChaosRun, choice: float) -> bool:
    lane = _raw_lane(run, choice)
    if lane is None:
        return False
    mode = run.rng.choice(("receive", "receive", "attach"))
    proc = _raw(run, mode, "reset", lane, tls=False)
    run.log("fault", fault="tcp-reset", victim=proc.name, lane=lane, mode=mode)
    return True


def tls_vanish(run: ChaosRun, choice: float) -> bool:
    lane = _raw_lane(run, choice)
    if lane is None:
        return False
    mode = run.rng.choice(("receive", "attach"))
    end = run.rng.choice(("reset", "fin", "close-no-wait"))
    proc = _raw(run, mode, end, lane, tls=True)
    run.log("fault", fault="tls-vanish", victim=proc.name, lane=lane, mode=mode, end=end)
    return True


def mid_frame_kill(run: ChaosRun, choice: float) -> bool:
    if choice < 0.3:  # the large consumer, while large messages stream to it
        victim = _pick([p for p in run.live("consumer") if p.group == "cB"], 0)
        if victim is None:
            return False
        run.log("fault", fault="mid-frame-kill", victim=victim.name, side="consumer")
        run.kill(victim)
        return True
    end = "hold" if choice < 0.8 else "reset"
    proc = _raw(run, "partial-send", end, "large", tls=False)
    log = run.events / f"{proc.name}.jsonl"

    def partial() -> bool:
        return any(e["kind"] == "partial" for e in read_events(log)) or not proc.live

    deadline = time.monotonic() + 10
    while not partial() and time.monotonic() < deadline:
        run.pause(0.02)
    run.log("fault", fault="mid-frame-kill", victim=proc.name, side="sender", end=end)
    if end == "hold":
        run.kill(proc)
    return True


def mid_tx_kill(run: ChaosRun, choice: float) -> bool:
    victims = run.live("tx-producer", "tx-consumer")
    victim = _pick(victims, choice)
    if victim is None:
        return False
    log = run.events / f"{victim.name}.jsonl"

    def open_transaction() -> bool:
        events = [
            e for e in read_events(log) if e["kind"].startswith("tx-") or e["kind"] == "delivered"
        ]
        if not events:
            return False
        last = events[-1]
        return (victim.role == "tx-producer" and last["kind"] in ("tx-begin", "tx-sent")) or (
            victim.role == "tx-consumer" and last["kind"] == "delivered"
        )

    deadline = time.monotonic() + 3
    while not open_transaction() and time.monotonic() < deadline and victim.live:
        run.pause(0.01)
    run.log("fault", fault="mid-tx-kill", victim=victim.name, mid=open_transaction())
    run.kill(victim)
    return True


def broker_restart(run: ChaosRun, choice: float) -> bool:
    assert run.broker is not None
    if len(run.restarts) >= run.s.max_broker_restarts:
        return False
    run.log("fault", fault="broker-restart", pid=run.broker.pid)
    killed = time.time()
    run.broker.kill()
    time.sleep(choice)  # down for up to a second
    run.restart_broker()
    run.restarts.append((killed, time.time()))
    run.log("broker-started", pid=run.broker.pid)
    run.report.resources.setdefault("restarted", []).append(
        {"fds": run.broker.fds(), "rss_kib": run.broker.rss_kib()}
    )
    return True


def disk_full(run: ChaosRun, choice: float) -> bool:
    if run.filler is None or any(c.kind == "disk-full" for c in run.checks):
        return False
    written = run.filler.fill()
    run.log("fault", fault="disk-full", filled=written)
    run.pause(1 + 2 * choice)
    run.filler.release()
    freed = time.time()
    run.log("disk-freed")

    tail = Tail(run.events, "p*.jsonl")

    def resumed() -> bool:
        return any(
            e["kind"] == "sent" and e.get("durable") and e["t"] > freed + 0.5 for e in tail.poll()
        )

    def done(ok: bool) -> None:
        if not ok:
            lines = (
                run.broker.log_lines("journal", "No space", "ENOSPC", "disk") if run.broker else []
            )
            run.violation(
                "disk-full",
                "durable sends did not resume within 20s of the disk being freed; "
                "broker log: " + " | ".join(lines[-5:]),
            )

    run.checks.append(
        Check("disk-full", "durable sends resume", time.monotonic() + 20, resumed, done)
    )
    return True


def slow_consumer(run: ChaosRun, choice: float) -> bool:
    lanes = [n for n in ("paged", "qpaged", "prio", "select", "ttl") if n in run.s.lanes]
    if not lanes or run.broker is None:
        return False
    lane = lanes[int(choice * len(lanes))]
    spec = f"{lane}:delay=0.2" + (":color=red" if lane == "select" else "")
    name = f"slow{len(run.procs)}"
    args = ["--url", run.broker.url, "--receive", spec, "--credit", "3"]
    run.spawn("consumer", name, args, until=time.monotonic() + run.rng.uniform(2, 5))
    run.log("fault", fault="slow-consumer", victim=name, lane=lane)
    return True


def consumer_pause(run: ChaosRun, choice: float) -> bool:
    """Stop a consumer group cleanly and keep it away for 2-6 s: its queues back up,
    their addresses page (and with them the broker as a whole past global-max-size)."""
    groups = sorted(g for g, (role, _) in run.groups.items() if role == "consumer")
    group = groups[int(choice * len(groups))] if groups else None
    victim = next((p for p in run.live() if p.group == group), None)
    if victim is None:
        return False
    away = 2 + 4 * run.rng.random()
    run.log("fault", fault="consumer-pause", victim=victim.name, seconds=away)
    victim.popen.send_signal(signal.SIGTERM)
    victim.terminated = True
    run.next_start[group] = time.monotonic() + away
    return True


def c_receive_kill(run: ChaosRun, choice: float) -> bool:
    assert run.c_examples is not None and run.broker is not None
    name = f"c-receive{len(run.procs)}"
    command = run.c_examples.receive_command(run.broker.port, LANES["c"].address, 0)
    proc = run.spawn("c-receive", name, command)
    run.c_receive_outputs[name] = proc.out  # type: ignore[assignment]
    run.pause(0.1 + 0.4 * choice)  # the crash point
    run.log("fault", fault="c-receive-kill", victim=name)
    run.kill(proc)
    return True


def c_send(run: ChaosRun, choice: float) -> bool:
    assert run.c_examples is not None and run.broker is not None
    count = 100 + int(900 * choice)
    name = f"c-send{len(run.procs)}"
    proc = run.spawn(
        "c-send", name, run.c_examples.send_command(run.broker.port, C_SEND_ADDRESS, count)
    )
    proc.until = time.monotonic() + 15
    run.log("fault", fault="c-send", victim=name, count=count)
    run.c_send_counts[name] = count
    return True


def stream_read(run: ChaosRun, choice: float) -> bool:
    assert run.broker is not None
    name = f"reader{len(run.procs)}"
    args = ["--url", run.broker.url, "--receive", "stream:offset=first", "--credit", "50"]
    run.spawn("consumer", name, args, until=time.monotonic() + 1 + 2 * choice)
    run.log("action", action="stream-read", victim=name)
    return True


def held_by(events: list[dict[str, Any]]) -> set[str]:
    """The messages a consumer had received and not yet settled (but those that may expire,
    be replaced by a last value or reach the dead-letter address before anyone sees them
    again)."""
    held: set[str] = set()
    for e in events:
        if e["kind"] == "delivered" and e.get("lane") not in ("ttl", "lvq", "poison"):
            held.add(e["id"])
        elif e["kind"] in ("acked", "tx-discharge"):
            held.difference_update(e["ids"])
        elif e["kind"] == "poisoned":
            held.discard(e["id"])
    return held


#: The fault functions by kind.
FAULTS: dict[str, Callable[[ChaosRun, float], bool]] = {
    "client-kill": client_kill,
    "client-stop": client_stop,
    "tcp-reset": tcp_reset,
    "tls-vanish": tls_vanish,
    "mid-frame-kill": mid_frame_kill,
    "mid-tx-kill": mid_tx_kill,
    "broker-restart": broker_restart,
    "disk-full": disk_full,
    "slow-consumer": slow_consumer,
    "consumer-pause": consumer_pause,
    "c-receive-kill": c_receive_kill,
    "c-send": c_send,
    "stream-read": stream_read,
}
