"""One pair of proton's own C examples through a broker: issue 21's end-to-end figure.

Builds `send` and `receive` from Debian's libqpid-proton11-dev-examples (as
tests/system does), starts `scow run` (the same generated config as run_perf.py: memory
journal, standard queues) on a free port, then per run starts `receive HOST PORT ADDRESS
N` and `send HOST PORT ADDRESS N` at once, each in its own process, on an address of its
own. `send` sends unsettled and waits for every outcome; `receive` grants N credits and
accepts each message (at-least-once). The rate is N over the time from the two starts
until both have exited; the broker's CPU per message is read from /proc. `receive`'s
printing of each message goes to /dev/null.

    .venv/bin/python benchmarks/c_examples_pair.py                    # Scow, 5 runs
    .venv/bin/python benchmarks/c_examples_pair.py --compare-proton-c # then broker.c
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_perf import cpu_seconds, platform_line, proton_c_broker, scow_broker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "system"))
from native import CExamples, build

PLUGINS = ["amqp", "memory-journal", "standard-queues", "full-policies"]


def one_run(examples: CExamples, port: int, address: str, count: int, timeout: float) -> float:
    """Seconds for `count` messages from one `send` to one `receive` through the broker."""
    start = time.monotonic()
    receiver = subprocess.Popen(
        examples.receive_command(port, address, count), stdout=subprocess.DEVNULL
    )
    sender = subprocess.Popen(
        examples.send_command(port, address, count), stdout=subprocess.DEVNULL
    )
    for name, proc in (("send", sender), ("receive", receiver)):
        try:
            code = proc.wait(max(timeout - (time.monotonic() - start), 1))
        except subprocess.TimeoutExpired:
            sender.kill()
            receiver.kill()
            raise SystemExit(f"{name} did not finish {count} messages in {timeout:.0f} s") from None
        if code:
            raise SystemExit(f"{name} exited with {code}")
    return time.monotonic() - start


def measure(
    label: str, examples: CExamples, url: str, pid: int | None, args: argparse.Namespace
) -> float:
    port = int(url.rsplit(":", 1)[1])
    print(f"== {label}: {url}  (send + receive, {args.count:,} messages/run)", flush=True)
    one_run(examples, port, f"{args.address}.warmup", args.warmup, args.timeout)
    rates = []
    for n in range(1, args.runs + 1):
        cpu = cpu_seconds(pid) if pid else 0.0
        seconds = one_run(examples, port, f"{args.address}.{n}", args.count, args.timeout)
        rates.append(args.count / seconds)
        used = (cpu_seconds(pid) - cpu) / args.count * 1e6 if pid else 0.0
        shown = f"   broker CPU {used:.2f} us/msg" if pid else ""
        print(f"run {n}   {rates[-1]:>10,.0f} msg/s  ({seconds:.2f} s){shown}", flush=True)
    median = statistics.median(rates)
    print(f"median  {median:>10,.0f} msg/s\n", flush=True)
    return median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--count", type=int, default=200_000, help="messages per run")
    parser.add_argument("--warmup", type=int, default=20_000)
    parser.add_argument("--address", default="cpair")
    parser.add_argument("--timeout", type=float, default=300.0, help="per run (s)")
    parser.add_argument(
        "--compare-proton-c",
        action="store_true",
        help="then proton-C's example broker (benchmarks/baseline_proton_c_broker.sh)",
    )
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "scow-c-examples"
    )
    args = parser.parse_args()

    examples = build(args.cache)
    if isinstance(examples, str):
        raise SystemExit(examples)
    print(f"# {platform_line()}", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="scow-cpair-") as workdir,
        scow_broker(Path(workdir), None, PLUGINS) as (url, pid),
    ):
        ours = measure("scow", examples, url, pid, args)
    if args.compare_proton_c:
        with proton_c_broker(None) as url:
            theirs = measure("proton-C broker.c", examples, url, None, args)
        print(f"scow / proton-C broker.c: {ours / theirs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
