"""Throughput and latency of a broker, measured with `scow perf client`.

By default this starts Scow (`scow run` on a free loopback port, a temporary config and
data dir), runs the client --runs times (1 pair, 100 B bodies, at-least-once, 200k
messages each), prints each run and the median receive rate, then runs once more paced at
80 % of that median and prints the latency percentiles (p99 is the figure to quote).

    .venv/bin/python benchmarks/run_perf.py                       # Scow, started here
    .venv/bin/python benchmarks/run_perf.py --url amqp://127.0.0.1:5673/perf  # any broker
    .venv/bin/python benchmarks/run_perf.py --sink                # the client alone
    .venv/bin/python benchmarks/run_perf.py --compare-proton-c    # Scow, then the baseline
    .venv/bin/python benchmarks/run_perf.py --compare-duplicate-ids --runs 15

--compare-duplicate-ids measures duplicate detection's cost: one broker, runs without
and with --duplicate-ids in pairs (alternating which goes first), and the median of the
pairs' ratios. The two runs of a pair are seconds apart, so what a shared machine's
other work does to one it mostly does to the other too.

Each run sends to an address of its own (`<address>.<n>`) so that a failed run cannot
leave messages behind for the next. `--compare-proton-c` builds and starts proton-C's
example broker with benchmarks/baseline_proton_c_broker.sh, measures it the same way and
prints the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
BASELINE_SCRIPT = HERE / "baseline_proton_c_broker.sh"

CONFIG = """\
[plugins]
enable = [{plugins}]

[broker]
data-dir = "{data_dir}"
log-level = "warning"

[amqp]
listen = ["127.0.0.1:{port}"]

[address-settings."#"]
default-address-routing-type = "ANYCAST"
default-queue-routing-type = "ANYCAST"
"""


def scow_command() -> list[str]:
    """The `scow` of the running interpreter's environment."""
    script = Path(sys.executable).parent / "scow"
    return [str(script)] if script.exists() else [sys.executable, "-m", "scow.core.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes] | None, what: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}:\n{log.read_text()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"{what} is not listening on 127.0.0.1:{port} after 60 s; see {log}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def scow_broker(
    workdir: Path, config: Path | None, plugins: list[str]
) -> Iterator[tuple[str, int]]:
    """`scow run` on a free port; yields its URL (without an address) and its pid."""
    port = free_port()
    if config is None:
        config = workdir / "scow.toml"
        config.write_text(
            CONFIG.format(
                plugins=", ".join(f'"{p}"' for p in plugins),
                data_dir=workdir / "data",
                port=port,
            )
        )
    log = workdir / "broker.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*scow_command(), "run", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_listening(port, proc, "scow run", log)
        yield f"amqp://127.0.0.1:{port}", proc.pid
    finally:
        stop(proc)


@contextlib.contextmanager
def perf_sink(workdir: Path) -> Iterator[str]:
    """`scow perf sink` on a free port; yields its URL."""
    port = free_port()
    log = workdir / "sink.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*scow_command(), "perf", "sink", "--listen", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_listening(port, proc, "scow perf sink", log)
        yield f"amqp://127.0.0.1:{port}"
    finally:
        stop(proc)


@contextlib.contextmanager
def proton_c_broker(window: int | None) -> Iterator[str]:
    """proton-C's example broker via the baseline script; yields its URL."""
    port = free_port()
    env = dict(os.environ)
    if window:
        env["WINDOW"] = str(window)
    started = subprocess.run(
        ["bash", str(BASELINE_SCRIPT), "start", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        check=False,
    )
    if started.returncode:
        raise SystemExit(f"{BASELINE_SCRIPT.name} start failed ({started.returncode})")
    try:
        yield f"amqp://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(BASELINE_SCRIPT), "stop", str(port)], env=env, check=False)


def run_client(
    url: str, address: str, args: argparse.Namespace, rate: float | None
) -> dict[str, Any]:
    command = [
        *scow_command(),
        "perf",
        "client",
        "--url",
        f"{url}/{address}",
        "--count",
        str(args.count),
        "--size",
        str(args.size),
        "--pairs",
        str(args.pairs),
        "--warmup",
        str(args.warmup),
        "--timeout",
        str(args.timeout),
        "--json",
    ]
    if args.durable:
        command.append("--durable")
    if args.duplicate_ids:
        command.append("--duplicate-ids")
    for prop in args.property:
        command += ["--property", prop]
    if args.presettled:
        command.append("--presettled")
    if rate:
        command += ["--rate", f"{rate:.0f}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"perf client failed ({done.returncode}):\n{done.stderr}{done.stdout}")
    return dict(json.loads(lines[-1]))


def line(label: str, result: dict[str, Any]) -> str:
    lat = result["latency_ms"]
    cpu = result.get("broker_cpu_us_per_message")
    return (
        f"{label:<14} send {result['send_rate']:>9,.0f} msg/s   "
        f"receive {result['receive_rate']:>9,.0f} msg/s   "
        f"latency ms p50 {lat['p50']:.2f}  p99 {lat['p99']:.2f}  p99.9 {lat['p99.9']:.2f}  "
        f"max {lat['max']:.2f}" + (f"   broker CPU {cpu:.2f} us/msg" if cpu else "")
    )


def conditions(args: argparse.Namespace) -> str:
    """What the runs are: pairs, size, settlement, ..., and the load when they start."""
    mode = "pre-settled" if args.presettled else "at-least-once"
    return (
        f"{args.pairs} pair(s), {args.size} B, {mode}"
        f"{', durable' if args.durable else ''}"
        f"{', duplicate ids' if args.duplicate_ids else ''}, {args.count} messages/run, "
        f"{args.warmup} warm-up; load average {os.getloadavg()[0]:.2f}"
    )


def measure(
    name: str, url: str, address: str, args: argparse.Namespace, pid: int | None = None
) -> dict[str, Any]:
    """--runs unpaced runs, their median, then one run paced at --latency-at of it.

    With the broker's `pid`, each run also reports the broker's CPU time per message
    (sent and received), which a busy machine disturbs far less than throughput."""
    print(f"== {name}: {url}  ({conditions(args)})", flush=True)
    runs = []
    for n in range(1, args.runs + 1):
        result = timed_run(url, f"{address}.{n}", args, pid)
        runs.append(result)
        print(line(f"run {n}", result), flush=True)
    median_receive = statistics.median(r["receive_rate"] for r in runs)
    median_send = statistics.median(r["send_rate"] for r in runs)
    median_cpu = statistics.median(r.get("broker_cpu_us_per_message", 0.0) for r in runs)
    print(
        f"median         send {median_send:>9,.0f} msg/s   receive {median_receive:>9,.0f} msg/s"
        + (f"   broker CPU {median_cpu:.2f} us/msg" if pid else "")
    )
    paced = []
    rate = median_receive * args.latency_at
    for n in range(1, args.latency_runs + 1):
        result = run_client(url, f"{address}.paced.{n}", args, rate)
        paced.append(result)
        print(line(f"at {args.latency_at:.0%} #{n}", result), flush=True)
    p99 = statistics.median(r["latency_ms"]["p99"] for r in paced) if paced else None
    if p99 is not None:
        print(f"p99 at {args.latency_at:.0%} of the median ({rate:,.0f} msg/s): {p99:.2f} ms")
    print(flush=True)
    return {
        "name": name,
        "url": url,
        "runs": runs,
        "median_send_rate": median_send,
        "median_receive_rate": median_receive,
        "median_broker_cpu_us_per_message": median_cpu if pid else None,
        "paced_rate": rate,
        "paced": paced,
        "p99_at_paced_ms": p99,
    }


def timed_run(url: str, address: str, args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    """An unpaced run; with the broker's `pid`, also the broker's CPU time per message."""
    before = cpu_seconds(pid) if pid else 0.0
    result = run_client(url, address, args, None)
    if pid:
        used = cpu_seconds(pid) - before
        messages = (args.count + args.warmup) * args.pairs
        result["broker_cpu_us_per_message"] = used / messages * 1e6
    return result


def compare_duplicate_ids(
    url: str, address: str, args: argparse.Namespace, pid: int
) -> dict[str, Any]:
    """--runs pairs of runs, without and with an id per message, on one broker."""
    print(
        f"== duplicate ids: {url}  ({args.runs} x without and with; {conditions(args)})",
        flush=True,
    )
    pairs = []
    for n in range(1, args.runs + 1):
        order = (False, True) if n % 2 else (True, False)
        runs = {
            ids: timed_run(
                url,
                f"{address}.{'ids' if ids else 'none'}.{n}",
                argparse.Namespace(**{**vars(args), "duplicate_ids": ids}),
                pid,
            )
            for ids in order
        }
        without, with_ids = runs[False], runs[True]
        cpu = with_ids["broker_cpu_us_per_message"] / without["broker_cpu_us_per_message"]
        rate = with_ids["receive_rate"] / without["receive_rate"]
        pairs.append({"without": without, "with": with_ids, "cpu": cpu, "receive": rate})
        print(
            f"pair {n:<3} broker CPU {without['broker_cpu_us_per_message']:.2f} -> "
            f"{with_ids['broker_cpu_us_per_message']:.2f} us/msg ({cpu:.3f}x)   "
            f"receive {without['receive_rate']:,.0f} -> {with_ids['receive_rate']:,.0f} "
            f"msg/s ({rate:.3f}x)",
            flush=True,
        )
    cpu_ratios = sorted(p["cpu"] for p in pairs)
    median_cpu = statistics.median(cpu_ratios)
    median_rate = statistics.median(p["receive"] for p in pairs)
    print(
        f"median of {len(pairs)} pairs: broker CPU {median_cpu:.3f}x "
        f"(pairs {cpu_ratios[0]:.3f}-{cpu_ratios[-1]:.3f}), receive rate {median_rate:.3f}x\n",
        flush=True,
    )
    return {
        "name": "duplicate ids",
        "url": url,
        "pairs": pairs,
        "median_broker_cpu_ratio": median_cpu,
        "median_receive_rate_ratio": median_rate,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--url", help="measure this broker instead of starting Scow")
    target.add_argument("--sink", action="store_true", help="measure against `scow perf sink`")
    parser.add_argument(
        "--compare-proton-c",
        action="store_true",
        help="then measure proton-C's example broker (baseline script) and print ratios",
    )
    parser.add_argument(
        "--compare-duplicate-ids",
        action="store_true",
        help="instead: --runs pairs of runs without and with --duplicate-ids (Scow only)",
    )
    parser.add_argument(
        "--proton-c-window",
        type=int,
        help="build the baseline with this credit WINDOW instead of the example's 5",
    )
    parser.add_argument("--config", type=Path, help="broker config for `scow run` (port is set)")
    parser.add_argument(
        "--plugins",
        default="amqp,memory-journal,standard-queues,full-policies",
        help="plugins of the generated config (comma-separated)",
    )
    parser.add_argument("--address", default="perf", help="address prefix (default: perf)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--count", type=int, default=200_000, help="messages per run")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--durable", action="store_true")
    parser.add_argument(
        "--duplicate-ids", action="store_true", help="an _AMQ_DUPL_ID of its own per message"
    )
    parser.add_argument("--presettled", action="store_true")
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an application property on every message (repeatable); e.g. one the size of "
        "--duplicate-ids' id under another name, to tell the id's cost from its bytes'",
    )
    parser.add_argument("--latency-at", type=float, default=0.8, help="fraction of the median")
    parser.add_argument("--latency-runs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="per client run (s)")
    parser.add_argument("--json-out", type=Path, help="write every figure here as JSON")
    args = parser.parse_args()
    if args.compare_duplicate_ids and (args.url or args.sink or args.compare_proton_c):
        parser.error("--compare-duplicate-ids measures the Scow it starts, alone")

    print(f"machine: {os.cpu_count()} cores, {platform_line()}\n", flush=True)
    results = []
    workdir = Path(tempfile.mkdtemp(prefix="scow-perf-"))
    try:
        if args.url:
            parts = urlsplit(args.url)
            base = f"{parts.scheme}://{parts.netloc}"
            address = parts.path.strip("/") or args.address
            results.append(measure("broker", base, address, args))
        elif args.sink:
            with perf_sink(workdir) as url:
                results.append(measure("scow perf sink", url, args.address, args))
        else:
            plugins = [p.strip() for p in args.plugins.split(",") if p.strip()]
            with scow_broker(workdir, args.config, plugins) as (url, pid):
                if args.compare_duplicate_ids:
                    results.append(compare_duplicate_ids(url, args.address, args, pid))
                else:
                    results.append(measure("scow", url, args.address, args, pid))
        if args.compare_proton_c:
            window = args.proton_c_window
            name = "proton-C broker.c" + (f" (WINDOW={window})" if window else "")
            with proton_c_broker(window) as url:
                results.append(measure(name, url, args.address, args))
            ours, theirs = results[0], results[-1]
            print("== ratios (first / proton-C)")
            print(
                f"throughput  {ours['median_receive_rate'] / theirs['median_receive_rate']:.2f}x"
                f"   ({ours['median_receive_rate']:,.0f} vs {theirs['median_receive_rate']:,.0f})"
            )
            p99_ours, p99_theirs = ours["p99_at_paced_ms"], theirs["p99_at_paced_ms"]
            if p99_ours and p99_theirs:
                print(
                    f"p99 at {args.latency_at:.0%}   {p99_ours / p99_theirs:.2f}x"
                    f"   ({p99_ours:.2f} ms vs {p99_theirs:.2f} ms)"
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))
    return 0


def platform_line() -> str:
    import platform

    return f"{platform.system()} {platform.release()}, Python {platform.python_version()}"


if __name__ == "__main__":
    sys.exit(main())
