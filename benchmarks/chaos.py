"""Fault schedules and a soak against `scow run`, with the system tests' harness.

    .venv/bin/python benchmarks/chaos.py --schedules 100          # seeds 1..100, 30 s each
    .venv/bin/python benchmarks/chaos.py --schedules 20 --seconds 15 --first-seed 500
    .venv/bin/python benchmarks/chaos.py --soak 1800               # 30 min, client kills
    .venv/bin/python benchmarks/chaos.py --soak 3600 --laps 6      # 6 laps of 10 min

A schedule (tests/system/harness.py) runs the installed `scow run` with every feature on
(paging addresses, durable subscriptions, a stream, transactions, selectors, priority,
last-value, a qpid-paged queue, expiry and dead letters), clients in their own processes,
and one random fault every 0.3-1.2 s: client SIGKILL and SIGSTOP, TCP resets, TLS clients
that vanish, kills mid-frame and mid-transaction, broker SIGKILL and restart, a full
tmpfs (as root), slow consumers, proton's C receive killed 0.1-0.5 s in. Then it drains
every queue and checks the invariants. The run prints, per schedule and in total:
schedules run, faults injected by kind, broker deaths, acknowledged messages lost and
first deliveries duplicated (goal: 0 each), every other violation by kind, and the seeds
that failed (`SCOW_CHAOS_SEED=N pytest tests/system/test_chaos.py -k replay` replays one).

The soak keeps the same traffic for `--soak` seconds with a client killed (or a TCP/TLS
peer crashing) every `--kill-every` seconds, and prints the broker's RSS and open file
descriptors at the start (no clients), sampled along the way, and at the end (drained,
no clients). RSS at the start and at the end is read at rest: the lowest reading over a
little more than the broker's trim period, so that both come after a trim has given freed
heap back. With `--laps N` the soak is N laps, each ended the same way (its queues drained,
RSS read at rest, the broker left running): whether RSS at rest keeps growing lap after
lap or levels off once the broker has served its working set.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository, for the system tests' harness

from scow.core.memory_trim import PERIOD as TRIM_PERIOD  # noqa: E402
from tests.security.helpers import make_pki  # noqa: E402
from tests.system import native  # noqa: E402
from tests.system.faults import FAULT_KINDS  # noqa: E402
from tests.system.harness import ChaosRun, Report, Settings  # noqa: E402

SOAK_WEIGHTS = {
    "client-kill": 6,
    "tcp-reset": 1,
    "tls-vanish": 1,
    "c-receive-kill": 1,
    "slow-consumer": 1,
    "stream-read": 1,
}


def _environment(workdir: Path) -> tuple[native.CExamples | None, tuple[Path, Path, Path]]:
    built = native.build(workdir / "c-examples")
    if isinstance(built, str):
        print(f"proton's C examples left out: {built}")
        built = None
    pki = make_pki(workdir / "pki")
    return built, (pki.ca, pki.server_cert, pki.server_key)


def run_schedules(args: argparse.Namespace, workdir: Path) -> int:
    c_examples, tls = _environment(workdir)
    faults: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    failing: dict[int, str] = {}
    totals = Counter()
    started = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.schedules):
        settings = Settings(seed=seed, duration=args.seconds, rate_factor=args.rate_factor)
        run_dir = workdir / f"chaos-{seed}"
        try:
            report = ChaosRun(settings, run_dir, c_examples=c_examples, tls=tls).run()
        except Exception as exc:  # the harness itself failed: report it, go on
            failing[seed] = f"harness error: {exc!r}"
            totals["harness errors"] += 1
            print(f"seed {seed}: harness error {exc!r}", flush=True)
            continue
        totals["schedules"] += 1
        totals["accepted"] += report.findings.accepted
        totals["lost"] += report.findings.lost
        totals["duplicated"] += report.findings.duplicated
        totals["deaths"] += report.broker_deaths
        faults.update(report.faults)
        kinds.update(v.kind for v in report.violations)
        print(_line(report), flush=True)
        if report.failed:
            failing[seed] = str(report.violations[0])
            (run_dir / "report.txt").write_text(report.describe() + "\n")
        elif not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    minutes = (time.monotonic() - started) / 60
    print()
    each = f"{args.seconds:g} s of faults each"
    print(f"schedules run: {totals['schedules']} ({minutes:.1f} min, {each})")
    print(f"harness errors: {totals['harness errors']}")
    print("faults injected by kind:")
    for kind in FAULT_KINDS:
        print(f"  {kind:<16} {faults[kind]}")
    print(f"messages accepted: {totals['accepted']}")
    print(f"broker deaths: {totals['deaths']} (goal 0)")
    print(f"acknowledged messages lost: {totals['lost']} (goal 0)")
    print(f"first deliveries duplicated: {totals['duplicated']} (goal 0)")
    print(
        "violations by kind: " + (", ".join(f"{k} {n}" for k, n in kinds.most_common()) or "none")
    )
    print(f"failing seeds ({len(failing)}):")
    for seed, first in failing.items():
        print(f"  {seed}: {first[:300]}")
    print(f"reports of failing seeds: {workdir}/chaos-<seed>/report.txt")
    return 1 if failing else 0


def _line(report: Report) -> str:
    faults = sum(report.faults.values())
    status = "FAIL" if report.failed else "ok"
    kinds = Counter(v.kind for v in report.violations)
    return (
        f"seed {report.seed}: {status} {report.seconds:.0f}s, {faults} faults, accepted "
        f"{report.findings.accepted}, lost {report.findings.lost}, duplicated "
        f"{report.findings.duplicated}, deaths {report.broker_deaths}"
        + (" | " + ", ".join(f"{k} {n}" for k, n in kinds.items()) if kinds else "")
    )


def run_soak(args: argparse.Namespace, workdir: Path) -> int:
    c_examples, tls = _environment(workdir)
    settings = Settings(
        seed=args.first_seed,
        duration=args.soak / args.laps,
        laps=args.laps,
        faults=tuple(SOAK_WEIGHTS),
        weights=SOAK_WEIGHTS,
        step=(args.kill_every * 0.5, args.kill_every * 1.5),
        rate_factor=args.rate_factor,
        sample_every=args.sample_every,
        rest_window=TRIM_PERIOD + 5,
    )
    run = ChaosRun(settings, workdir / "soak", c_examples=c_examples, tls=tls)
    began = time.time()

    def show(sample: dict[str, Any]) -> None:
        if "error" in sample:
            print(f"  {sample['t'] - began:7.0f}s  {sample['error']}", flush=True)
            return
        print(
            f"  {sample['t'] - began:7.0f}s  rss {sample['rss_kib'] / 1024:7.1f} MiB  fds "
            f"{sample['fds']:4d}  connections {sample['connections']:3d}  paged "
            f"{sample['paged_messages']:6d}  journal records {sample['journal_records']}",
            flush=True,
        )

    run.on_sample = show
    print(f"soak: {args.soak:g} s, a fault every ~{args.kill_every:g} s (seed {args.first_seed})")
    report = run.run()
    base = report.resources.get("baseline", {})
    after = report.resources.get("after", {})
    samples = [s for s in report.resources.get("samples", []) if "rss_kib" in s]
    print()
    print("faults: " + ", ".join(f"{k} {n}" for k, n in sorted(report.faults.items())))
    if base:
        print(f"start (no clients, rest):  rss {base['rss_kib'] / 1024:.1f} MiB, fds {base['fds']}")
    if samples:
        rss = [s["rss_kib"] / 1024 for s in samples]
        fds = [s["fds"] for s in samples]
        print(
            f"during ({len(samples)} samples): rss {min(rss):.1f}-{max(rss):.1f} MiB "
            f"(first {rss[0]:.1f}, last {rss[-1]:.1f}), fds {min(fds)}-{max(fds)} "
            f"(first {fds[0]}, last {fds[-1]})"
        )
    laps = report.resources.get("laps", [])
    for lap, rest in enumerate(laps[:-1], 1):
        print(
            f"lap {lap} (drained, at rest):  rss {rest['rss_kib'] / 1024:.1f} MiB, "
            f"fds {rest['fds']}"
        )
    if after:
        print(
            f"end (drained, at rest):    rss {after['rss_kib'] / 1024:.1f} MiB, fds {after['fds']}"
        )
    if len(laps) > 1:
        # the first lap takes the heap to its working set; what a leak would show is
        # growth from there on
        rss = [rest["rss_kib"] / 1024 for rest in laps]
        print(
            f"after the first lap: rss {min(rss[1:]):.1f}-{max(rss[1:]):.1f} MiB at rest, "
            f"{rss[-1] - rss[0]:+.1f} MiB from lap 1 to the end"
        )
    print(
        f"accepted {report.findings.accepted}, lost {report.findings.lost}, first deliveries "
        f"duplicated {report.findings.duplicated}, broker deaths {report.broker_deaths}"
    )
    for violation in report.violations[:20]:
        print(f"  {violation}")
    return 1 if report.failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=0, help="fault schedules to run")
    parser.add_argument("--seconds", type=float, default=30, help="seconds of faults each")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--rate-factor", type=float, default=1.0, help="scales send rates")
    parser.add_argument("--soak", type=float, default=0, help="soak for this many seconds")
    parser.add_argument("--kill-every", type=float, default=3, help="soak: seconds per fault")
    parser.add_argument(
        "--laps", type=int, default=1, help="soak: in this many laps, each drained and measured"
    )
    parser.add_argument("--sample-every", type=float, default=30, help="soak: seconds")
    parser.add_argument("--workdir", type=Path, help="default: a temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep passing schedules' files")
    args = parser.parse_args()
    if not args.schedules and not args.soak:
        parser.error("give --schedules N or --soak SECONDS")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scow-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir: {workdir}")
    status = 0
    if args.schedules:
        status |= run_schedules(args, workdir)
    if args.soak:
        status |= run_soak(args, workdir)
    return status


if __name__ == "__main__":
    sys.exit(main())
