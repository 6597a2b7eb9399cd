"""Paging figures: a large backlog in bounded memory, reading it back, produce rates, restart.

Starts `scow run` (file journal, paging) as a subprocess per scenario on a free loopback
port, drives it with `scow perf client --mode send|receive|pairs`, and prints:

1. backlog: --count non-durable --size messages to one queue with no consumer; the
   broker's RSS sampled every 0.5 s (peak and final), the send rate, and the page files'
   bytes per message;
2. that backlog consumed (1 consumer, at-least-once): the rate from pages, against the
   in-memory rate of 1 producer + 1 consumer on a broker that never pages (same run);
3. produce rates into a paging address (max-size-bytes 0) and into memory, durable and
   non-durable (--produce-count each);
4. memory per message held in memory: RSS growth over --held-count 100 B messages;
5. --crash-count durable messages paged, SIGKILL, restart: seconds until it serves;
6. drain (`--only drain`): --drain-count messages sent with no consumer, then received,
   from a broker that pages all of them (`max-size-bytes = 0`) and from one that keeps
   them in memory, alternating --runs times: the medians and their ratio, and the
   broker's CPU per message on its event loop and on its other threads (the page reader).

    .venv/bin/python benchmarks/paging_bench.py            # the full figures (~15 min)
    .venv/bin/python benchmarks/paging_bench.py --quick    # every count / 100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from run_perf import free_port, platform_line, scow_command, stop, wait_listening

PLUGINS = '"amqp", "file-journal", "standard-queues", "full-policies", "paging"'
CONFIG = """\
[plugins]
enable = [{plugins}]

[broker]
data-dir = "{data_dir}"
log-level = "warning"
{broker}

[amqp]
listen = ["127.0.0.1:{port}"]

[address-settings."#"]
default-address-routing-type = "ANYCAST"
default-queue-routing-type = "ANYCAST"
auto-delete-queues = false
{settings}
{extra}
"""


class Broker:
    """`scow run` with a generated config; `rss()` reads its resident memory."""

    def __init__(
        self,
        workdir: Path,
        broker: str = "",
        settings: str = "",
        *,
        plugins: str = PLUGINS,
        extra: str = "",
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(exist_ok=True)
        self.port = free_port()
        self.config = workdir / "scow.toml"
        self.config.write_text(
            CONFIG.format(
                plugins=plugins,
                data_dir=workdir / "data",
                port=self.port,
                broker=broker,
                settings=settings,
                extra=extra,
            )
        )
        self.log = workdir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"amqp://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start it; seconds until it accepts connections."""
        begin = time.monotonic()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*scow_command(), "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_listening(self.port, self.proc, "scow run", self.log)
        return time.monotonic() - begin

    def rss(self) -> int:
        assert self.proc is not None
        for text in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if text.startswith("VmRSS:"):
                return int(text.split()[1]) * 1024
        return 0

    def cpu_seconds(self) -> float:
        """User + system CPU time the broker process has used (all its threads)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def loop_cpu_seconds(self) -> float:
        """User + system CPU time of the broker's main thread (its event loop); the rest
        of `cpu_seconds` is its other threads' (the page reader and writer)."""
        assert self.proc is not None
        stat = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def client(url: str, *args: str, timeout: float = 3600) -> dict[str, Any]:
    done = subprocess.run(
        [
            *scow_command(),
            "perf",
            "client",
            "--url",
            url,
            "--json",
            "--timeout",
            str(timeout),
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"scow perf client {' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def backlog_client(url: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """`scow perf client --mode send|receive` of the backlog: --count messages of --size."""
    return client(url, "--mode", mode, "--count", str(args.count), "--size", str(args.size))


@contextlib.contextmanager
def sampling(broker: Broker, samples: list[int], period: float = 0.5) -> Iterator[None]:
    """Append the broker's RSS to `samples` every `period` seconds, and once at the end."""
    stop_event = threading.Event()

    def run() -> None:
        while not stop_event.wait(period):
            with contextlib.suppress(OSError):
                samples.append(broker.rss())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop_event.set()
        thread.join()
        samples.append(broker.rss())


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def backlog(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    broker = Broker(root / "backlog")
    broker.start()
    try:
        idle = broker.rss()
        samples: list[int] = []
        with sampling(broker, samples):
            sent = backlog_client(f"{broker.url}/backlog", "send", args)
        paged = du(root / "backlog" / "data" / "paging")
        received = backlog_client(f"{broker.url}/backlog", "receive", args)
        final = broker.rss()
    finally:
        broker.stop()
    memory = Broker(root / "memory", broker='global-max-size = "8GiB"')
    memory.start()
    try:
        pairs = [
            client(
                f"{memory.url}/mem{i}", "--count", str(args.memory_count),
                "--size", str(args.size),
            )["receive_rate"]
            for i in range(3)
        ]  # fmt: skip
    finally:
        memory.stop()
    in_memory = statistics.median(pairs)
    return {
        "idle_rss": idle,
        "peak_rss": max(samples),
        "rss_after_backlog": samples[-1],
        "rss_after_consuming": final,
        "send_rate": sent["send_rate"],
        "paged_bytes_per_message": paged / args.count,
        "consume_rate_from_pages": received["receive_rate"],
        "in_memory_rates": pairs,
        "ratio": received["receive_rate"] / in_memory,
    }


def produce_rates(args: argparse.Namespace, root: Path) -> dict[str, float]:
    out = {}
    for name, broker_cfg, settings in (
        ("pages", "", "max-size-bytes = 0"),
        ("memory", 'global-max-size = "8GiB"', ""),
    ):
        for durable in (False, True):
            workdir = root / f"produce-{name}-{durable}"
            broker = Broker(workdir, broker_cfg, settings)
            broker.start()
            try:
                extra = ["--durable"] if durable else []
                result = client(
                    f"{broker.url}/p", "--mode", "send", "--count", str(args.produce_count),
                    "--size", str(args.size), *extra,
                )  # fmt: skip
            finally:
                broker.stop()
            out[f"{name}, {'durable' if durable else 'non-durable'}"] = result["send_rate"]
    return out


def crash_restart(args: argparse.Namespace, root: Path) -> dict[str, float]:
    workdir = root / "crash"
    broker = Broker(workdir, settings="max-size-bytes = 0")
    broker.start()
    sent = client(
        f"{broker.url}/crash", "--mode", "send", "--count", str(args.crash_count),
        "--size", str(args.size), "--durable",
    )  # fmt: skip
    broker.kill()
    restarted = Broker.__new__(Broker)
    restarted.__dict__.update(broker.__dict__)
    seconds = restarted.start()
    try:
        # it serves: a consumer gets the first paged message
        got = client(f"{broker.url}/crash", "--mode", "receive", "--count", "1000")
    finally:
        restarted.stop()
    return {"sent": sent["sent"], "restart_s": seconds, "first_receive_ok": got["received"]}


def memory_per_message(args: argparse.Namespace, root: Path) -> dict[str, float]:
    """RSS growth per message queued in memory (never paged), beyond its body."""
    broker = Broker(root / "per-message", broker='global-max-size = "8GiB"')
    broker.start()
    try:
        idle = broker.rss()
        client(
            f"{broker.url}/held", "--mode", "send", "--count", str(args.held_count),
            "--size", "100",
        )  # fmt: skip
        time.sleep(1)  # let the last dispositions settle before reading RSS
        grown = broker.rss() - idle
    finally:
        broker.stop()
    return {"bytes_per_message": grown / args.held_count, "body": 100}


def drain(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Receive rates of the same backlog drained from pages and from memory, alternating,
    and the broker's CPU time per message received (steadier than rates on a busy
    machine: other processes' load stretches the time, not the work)."""
    rates: dict[str, list[float]] = {"pages": [], "memory": []}
    cpu: dict[str, list[float]] = {"pages": [], "memory": []}
    loop_cpu: dict[str, list[float]] = {"pages": [], "memory": []}
    setups = {"pages": ("", "max-size-bytes = 0"), "memory": ('global-max-size = "8GiB"', "")}
    for run in range(args.runs):
        for name, (broker_cfg, settings) in setups.items():
            broker = Broker(root / f"drain-{name}-{run}", broker_cfg, settings)
            broker.start()
            try:
                url = f"{broker.url}/drain"
                count, size = str(args.drain_count), str(args.size)
                client(url, "--mode", "send", "--count", count, "--size", size)
                before, loop_before = broker.cpu_seconds(), broker.loop_cpu_seconds()
                got = client(url, "--mode", "receive", "--count", count, "--size", size)
                used = broker.cpu_seconds() - before
                loop_used = broker.loop_cpu_seconds() - loop_before
            finally:
                broker.stop()
            rates[name].append(got["receive_rate"])
            cpu[name].append(used / args.drain_count * 1e6)
            loop_cpu[name].append(loop_used / args.drain_count * 1e6)
    pages, memory = statistics.median(rates["pages"]), statistics.median(rates["memory"])
    return {
        "runs": rates,
        "cpu": cpu,
        "loop_cpu": loop_cpu,
        "pages": pages,
        "memory": memory,
        "ratio": pages / memory,
        "cpu_ratio": statistics.median(cpu["memory"]) / statistics.median(cpu["pages"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=10_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--memory-count", type=int, default=200_000)
    parser.add_argument("--produce-count", type=int, default=200_000)
    parser.add_argument("--crash-count", type=int, default=1_000_000)
    parser.add_argument("--held-count", type=int, default=1_000_000)
    parser.add_argument("--drain-count", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3, help="alternating rounds of --only drain")
    parser.add_argument("--quick", action="store_true", help="every count divided by 100")
    parser.add_argument("--only", choices=("backlog", "produce", "crash", "memory", "drain"))
    args = parser.parse_args()
    if args.quick:
        for name in (
            "count",
            "memory_count",
            "produce_count",
            "crash_count",
            "held_count",
            "drain_count",
        ):
            setattr(args, name, max(1000, getattr(args, name) // 100))
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory(prefix="scow-paging-") as tmp:
        root = Path(tmp)
        if args.only in (None, "backlog"):
            b = backlog(args, root)
            print(f"backlog of {args.count:,} x {args.size} B non-durable, no consumer:")
            print(f"  broker RSS idle {mib(b['idle_rss'])}, peak {mib(b['peak_rss'])}, "
                  f"after the backlog {mib(b['rss_after_backlog'])}, "
                  f"after consuming it {mib(b['rss_after_consuming'])}")  # fmt: skip
            print(f"  send rate {b['send_rate']:,.0f} msg/s; "
                  f"page files {b['paged_bytes_per_message']:.0f} B per message")  # fmt: skip
            print(f"  consumed from pages {b['consume_rate_from_pages']:,.0f} msg/s; in memory "
                  f"(1 pair, runs {b['in_memory_rates']}): ratio {b['ratio']:.2f}")  # fmt: skip
        if args.only in (None, "produce"):
            print(f"produce rate, {args.produce_count:,} x {args.size} B, 1 producer:")
            for name, rate in produce_rates(args, root).items():
                print(f"  {name:<24} {rate:>10,.0f} msg/s")
        if args.only in (None, "memory"):
            m = memory_per_message(args, root)
            print(f"{args.held_count:,} x 100 B queued in memory: RSS grows "
                  f"{m['bytes_per_message']:.0f} B per message (body included)")  # fmt: skip
        if args.only in (None, "crash"):
            c = crash_restart(args, root)
            print(f"{c['sent']:,} durable paged messages, SIGKILL, restart: serving after "
                  f"{c['restart_s']:.2f} s (then received {c['first_receive_ok']})")  # fmt: skip
        if args.only in (None, "drain"):
            d = drain(args, root)
            print(f"drain of {args.drain_count:,} x {args.size} B non-durable, sent first, "
                  f"then received ({args.runs} alternating runs):")  # fmt: skip
            for name in ("pages", "memory"):
                runs = ", ".join(f"{rate:,.0f}" for rate in d["runs"][name])
                cpu = ", ".join(f"{us:.1f}" for us in d["cpu"][name])
                loop = statistics.median(d["loop_cpu"][name])
                others = max(
                    0.0,
                    statistics.median(
                        total - on_loop
                        for total, on_loop in zip(d["cpu"][name], d["loop_cpu"][name], strict=True)
                    ),
                )
                print(f"  from {name:<6} median {d[name]:>9,.0f} msg/s (runs {runs}); "
                      f"broker CPU per message {statistics.median(d['cpu'][name]):.1f} us "
                      f"(runs {cpu}; medians: its loop {loop:.2f}, "
                      f"its other threads {others:.2f})")  # fmt: skip
            print(f"  ratio pages / memory {d['ratio']:.2f} by rate, "
                  f"{d['cpu_ratio']:.2f} by CPU per message (memory's / pages')")  # fmt: skip
    return 0


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
