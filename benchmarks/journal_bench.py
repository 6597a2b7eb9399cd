"""File journal figures: append rate, sync rate, recovery time. Prints, asserts nothing.

    .venv/bin/python benchmarks/journal_bench.py [--records 1000000] [--dir /path]

Measured on the caller's side, as the broker's event loop would see it: the time spent in
`append_add` (100-byte records), then the time until the last completion ran (the rate
at which records become durable, group commit included). `measure_sync_rate` is the
raw device figure (4 KiB write + fdatasync in a loop), as `scow perf journal` prints it.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import threading
import time

import structlog

from scow.plugins.file_journal import FileJournal, JournalSettings, measure_sync_rate


def append_rate(directory: str, journal_type: str, n: int, sync: bool) -> None:
    journal = FileJournal(JournalSettings(directory=directory, journal_type=journal_type))
    journal.load()
    data = b"x" * 100
    left = [n]
    all_done = threading.Event()

    def done() -> None:
        left[0] -= 1
        if left[0] == 0:
            all_done.set()

    add = journal.append_add
    started = time.perf_counter()
    for i in range(1, n + 1):
        add(i, 1, data, sync=sync, on_done=done)
    appended = time.perf_counter()
    all_done.wait()
    durable = time.perf_counter()
    journal.flush()
    c = journal.counters
    print(
        f"  {journal.effective_type:3} sync={sync!s:5}  append {n / (appended - started):>10,.0f}/s"
        f"   completed {n / (durable - started):>10,.0f}/s"
        f"   syncs {c.syncs:>5} ({c.syncs / (durable - started):,.0f}/s,"
        f" {n / max(c.syncs, 1):,.0f} records per sync)"
    )
    journal.stop()


def closed_loop(
    directory: str,
    journal_type: str,
    outstanding: int,
    seconds: float,
    timeout_ns: int | None = None,
) -> None:
    """Producers that wait for durability: `outstanding` sync appends in flight at most."""
    settings = JournalSettings(
        directory=directory, journal_type=journal_type, journal_buffer_timeout=timeout_ns
    )
    journal = FileJournal(settings)
    journal.load()
    slots = threading.Semaphore(outstanding)
    data = b"x" * 100
    n = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        slots.acquire()
        n += 1
        journal.append_add(n, 1, data, sync=True, on_done=slots.release)
    journal.flush()
    elapsed = time.perf_counter() - started
    c = journal.counters
    print(
        f"  {journal.effective_type:3} {outstanding:>4} in flight, buffer-timeout "
        f"{settings.journal_buffer_timeout:>9,} ns: {n / elapsed:>9,.0f} durable records/s,"
        f" {c.syncs / elapsed:>6,.0f} syncs/s"
    )
    journal.stop()


def load_time(directory: str, n: int) -> None:
    settings = JournalSettings(directory=directory)
    journal = FileJournal(settings)
    journal.load()
    data = b"y" * 100
    for i in range(1, n + 1):
        journal.append_add(i, 1, data, sync=False)
    journal.stop()
    journal = FileJournal(settings)
    started = time.perf_counter()
    result = journal.load()
    elapsed = time.perf_counter() - started
    journal.stop()
    assert len(result.records) == n
    print(f"  load of {n:,} add records of 100 B: {elapsed:.2f} s ({n / elapsed:,.0f} records/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--appends", type=int, default=300_000)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    base = tempfile.mkdtemp(prefix="scow-journal-bench-", dir=args.dir)
    try:
        rate, timeout = measure_sync_rate(f"{base}/sync", 2.0)
        print(
            f"device: {rate:,.0f} syncs/s (4 KiB write + fdatasync); "
            f"suggested journal-buffer-timeout {timeout:,} ns"
        )
        print(f"appends of 100 B records ({args.appends:,} each run):")
        for journal_type in ("NIO", "AIO"):
            for sync in (True, False):
                d = f"{base}/{journal_type}-{sync}"
                append_rate(d, journal_type, args.appends, sync)
                shutil.rmtree(d)
        print("producers waiting for their completions (2 s each):")
        for journal_type in ("NIO", "AIO"):
            for outstanding in (1, 100):
                for timeout_ns in (None, timeout):
                    d = f"{base}/loop-{journal_type}-{outstanding}-{timeout_ns}"
                    closed_loop(d, journal_type, outstanding, 2.0, timeout_ns)
                    shutil.rmtree(d)
        print("recovery:")
        load_time(f"{base}/load", args.records)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
