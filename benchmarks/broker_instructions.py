"""Instructions `scow run` executes per message, counted by valgrind's callgrind: a figure
the machine's other work does not move, to compare variants of the hot path on a shared,
noisy machine (duplicate detection's cost, issue 18, by default).

For each variant the broker (run_perf.py's generated config: make bench's) runs under
callgrind twice at once, for --count messages and for three times as many (one `scow
perf client` pair, 100 B bodies, at-least-once, no warm-up). The difference of the two
totals over the difference of the counts is the per-message figure: start-up, recovery
and shutdown cancel out.
Under valgrind the broker is some 50x slower, so its socket reads bring more messages
at a time than in make bench, and how messages fall into reads moves a figure by 1-2 %
from round to round: --rounds repeats, and medians are printed.

    .venv/bin/python benchmarks/broker_instructions.py                # none, ids, control
    .venv/bin/python benchmarks/broker_instructions.py --rounds 3 --count 20000

With --cache-sim callgrind also simulates the CPU's caches (its first level, and a last
level of --ll-size: by default 1 MiB, a core's L2 here, as the L3 is shared with the
machine's other work) and each figure is an estimate of cycles, callgrind's own: an
instruction 1, a first-level miss 10, a last-level miss 100. Where the cost of a
variant is memory traffic more than instructions, this is the figure that shows it.

--keep DIR leaves each run's profile, DIR/<round>-<variant>/<messages>/callgrind.out, for
callgrind_annotate: a function's cost per message is its figure in the longer run less
that in the shorter, over 2 x --count.

Needs valgrind (Debian: `valgrind`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_perf import CONFIG, free_port, platform_line, scow_command, stop, wait_listening

#: Variants: the perf client's options. The control carries a property the size of the
#: id under another name: an id's bytes without its detection.
VARIANTS = {
    "none": [],
    "ids": ["--duplicate-ids"],
    "control": ["--property", "_AMQ_DUPL_XX=abcdefghijklmnop"],
}
PLUGINS = ["amqp", "memory-journal", "standard-queues", "full-policies"]


#: callgrind's cycle estimate: the weight of each event of --cache-sim's totals line
#: (Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw)
CYCLE_WEIGHTS = (1, 0, 0, 10, 10, 10, 100, 100, 100)


def instructions(
    workdir: Path, count: int, client_options: list[str], cache_sim: str | None
) -> int:
    """Instructions (with `cache_sim`, the --LL option: estimated cycles) of one `scow
    run` under callgrind that took `count` messages; its profile is left in `workdir`."""
    workdir.mkdir(parents=True)
    port = free_port()
    config = workdir / "scow.toml"
    config.write_text(
        CONFIG.format(
            plugins=", ".join(f'"{p}"' for p in PLUGINS), data_dir=workdir / "data", port=port
        )
    )
    out, log = workdir / "callgrind.out", workdir / "broker.log"
    with open(log, "ab") as log_file:
        broker = subprocess.Popen(
            [
                *("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"),
                *(("--cache-sim=yes", f"--LL={cache_sim}") if cache_sim else ()),
                *(sys.executable, "-m", "scow.core.cli", "run", "--config", str(config)),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_listening(port, broker, "scow run under valgrind", log)
        subprocess.run(
            [
                *scow_command(),
                *("perf", "client", "--url", f"amqp://127.0.0.1:{port}/perf"),
                *("--count", str(count), "--size", "100", "--warmup", "0", "--timeout", "900"),
                *client_options,
            ],
            check=True,
            capture_output=True,
        )
    finally:
        stop(broker)
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            events = [int(n) for n in line.split()[1:]]
            if not cache_sim:
                return events[0]
            return sum(w * n for w, n in zip(CYCLE_WEIGHTS, events, strict=True))
    raise SystemExit(f"no totals in {out}; the broker's log: {log.read_text()}")


def per_message(
    workdir: Path, count: int, client_options: list[str], cache_sim: str | None
) -> float:
    """(the figure for 3 x count) - (for count), over 2 x count: the runs at once."""
    totals: dict[int, int] = {}

    def run(n: int) -> None:
        totals[n] = instructions(workdir / str(n), n, client_options, cache_sim)

    threads = [threading.Thread(target=run, args=(n,)) for n in (count, 3 * count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(totals) != 2:
        raise SystemExit("a run failed (see above)")
    return (totals[3 * count] - totals[count]) / (2 * count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="messages of the shorter run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument(
        "--cache-sim", action="store_true", help="estimate cycles from simulated caches"
    )
    parser.add_argument(
        "--ll-size", type=int, default=1 << 20, help="simulated last level, bytes (1 MiB)"
    )
    parser.add_argument("--keep", type=Path, help="a new directory to leave the profiles in")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    print(platform_line())
    cache_sim = f"{args.ll_size},16,64" if args.cache_sim else None
    unit = "estimated cycles" if cache_sim else "instructions"
    figures: dict[str, list[float]] = {v: [] for v in chosen}
    with tempfile.TemporaryDirectory(prefix="scow-instructions-") as tmp:
        root = args.keep or Path(tmp)
        for r in range(args.rounds):
            for variant in chosen:
                n = per_message(
                    root / f"{r + 1}-{variant}", args.count, VARIANTS[variant], cache_sim
                )
                figures[variant].append(n)
                print(f"round {r + 1} {variant:8} {n:9,.0f} {unit} per message", flush=True)
    base = statistics.median(figures[chosen[0]])
    for variant in chosen:
        median = statistics.median(figures[variant])
        print(f"median   {variant:8} {median:9,.0f}  {median / base:.3f}x {chosen[0]}")


if __name__ == "__main__":
    main()
