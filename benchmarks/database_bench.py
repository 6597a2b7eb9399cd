"""Database store figures: durable throughput per journal, and paging through the database.

Starts `scow run` as a subprocess per scenario on a free loopback port (see
paging_bench.py) and drives it with `scow perf client`. PostgreSQL is a private server
started from its binaries (initdb/pg_ctl, as the tests do) unless --postgres-url names
one; without binaries and URL its rows are skipped. Prints:

1. durable 1 KiB messages, 4 producers + 4 consumers (`--pairs 4 --durable`; a producer
   counts a message once the broker accepted it, i.e. after the journal committed it):
   the file journal, SQLite and PostgreSQL in the same run, the median of --runs runs
   each, and the ratio to the file journal;
2. a paged backlog of --count x 1 KiB non-durable messages, no consumer, then consumed:
   the file page store against the database page store (SQLite, and PostgreSQL): send and
   consume rates and the broker's peak RSS.

    .venv/bin/python benchmarks/database_bench.py                 # 1M paged (~15 min)
    .venv/bin/python benchmarks/database_bench.py --count 100000  # a quick run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from paging_bench import Broker, backlog_client, client, mib, sampling
from run_perf import platform_line

PLUGINS = '"amqp", "file-journal", "standard-queues", "full-policies", "paging", "database-store"'


def _database(url: str) -> str:
    # the lock row of a killed run must not hold the next one up
    return (
        f'[database]\nurl = "{url}"\njdbc-lock-expiration = 5000\njdbc-lock-renew-period = 1000\n'
    )


def _broker(
    root: Path, name: str, journal: str, store: str, url: str, settings: str = ""
) -> Broker:
    return Broker(
        root / name,
        broker=f'journal = "{journal}"\nglobal-max-size = "1GiB"',
        settings=settings,
        plugins=PLUGINS,
        extra=f'[paging]\nstore = "{store}"\n' + _database(url),
    )


def durable_rates(args: argparse.Namespace, root: Path, backends: dict[str, str]) -> dict[str, Any]:
    """Median send and receive rates of `--pairs 4 --durable` per journal backend."""
    out: dict[str, Any] = {}
    for name, url in backends.items():
        journal = "file" if name == "file" else "database"
        sends, receives = [], []
        for run in range(args.runs):
            broker = _broker(root, f"durable-{name}-{run}", journal, "file", url)
            broker.start()
            try:
                result = client(
                    f"{broker.url}/durable", "--pairs", "4", "--durable", "--count",
                    str(args.durable_count), "--size", "1024", "--warmup", "1000",
                )  # fmt: skip
            finally:
                broker.stop()
            sends.append(result["send_rate"])
            receives.append(result["receive_rate"])
        out[name] = {
            "send": statistics.median(sends),
            "receive": statistics.median(receives),
            "runs": [round(s) for s in sends],
        }
    return out


def paged_backlog(args: argparse.Namespace, root: Path, stores: dict[str, str]) -> dict[str, Any]:
    """Send --count to an address that pages everything, then consume them all."""
    out: dict[str, Any] = {}
    for name, url in stores.items():
        store = "file" if name == "file" else "database"
        broker = _broker(root, f"paged-{name}", "file", store, url, "max-size-bytes = 0")
        broker.start()
        try:
            samples: list[int] = []
            with sampling(broker, samples):
                sent = backlog_client(f"{broker.url}/backlog", "send", args)
                received = backlog_client(f"{broker.url}/backlog", "receive", args)
        finally:
            broker.stop()
        out[name] = {
            "send": sent["send_rate"],
            "receive": received["receive_rate"],
            "peak_rss": max(samples),
        }
    return out


def _postgres(args: argparse.Namespace, root: Path) -> tuple[str | None, Any]:
    """A PostgreSQL URL (and the private server to stop, if one was started)."""
    if args.postgres_url:
        return args.postgres_url, None
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.database.postgres import PostgresServer, binaries

    bin_dir = binaries()
    if bin_dir is None:
        return None, None
    directory = Path(tempfile.mkdtemp(prefix="scow-pg-bench-"))
    server = PostgresServer(directory, bin_dir)
    server.init()
    server.start()
    return server.url(server.create_database()), server


def _databases(root: Path, run: str, postgres: Any, pg_url: str | None) -> dict[str, str]:
    """file, sqlite and (when available) postgresql: a fresh database for each use."""
    out = {"file": "", "sqlite": f"sqlite:///{root / f'{run}.db'}"}
    if pg_url is not None:
        out["postgresql"] = postgres.url(postgres.create_database()) if postgres else pg_url
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="paged backlog")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--durable-count", type=int, default=50_000, help="per pair")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--postgres-url", help="use this server instead of a private one")
    parser.add_argument("--only", choices=("durable", "paging"))
    args = parser.parse_args()
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    root = Path(tempfile.mkdtemp(prefix="scow-db-bench-"))
    pg_url, postgres = _postgres(args, root)
    try:
        if pg_url is None:
            print("# PostgreSQL: no binaries and no --postgres-url; its rows are skipped")
        if args.only in (None, "durable"):
            dbs = _databases(root, "durable", postgres, pg_url)
            rates = durable_rates(args, root, dbs)
            base = rates["file"]["send"]
            print(f"durable 1 KiB, 4 producers + 4 consumers, {args.durable_count:,} per "
                  f"producer, accepted after commit (median of {args.runs}):")  # fmt: skip
            for name, r in rates.items():
                print(f"  {name:<11} send {r['send']:>9,.0f} msg/s  receive "
                      f"{r['receive']:>9,.0f} msg/s  x{r['send'] / base:.2f} of file  "
                      f"runs {r['runs']}")  # fmt: skip
        if args.only in (None, "paging"):
            dbs = _databases(root, "paging", postgres, pg_url)
            paged = paged_backlog(args, root, dbs)
            base = paged["file"]
            print(f"paged backlog of {args.count:,} x {args.size} B non-durable, no consumer, "
                  "then consumed (1 producer, 1 consumer):")  # fmt: skip
            for name, p in paged.items():
                store = "file store" if name == "file" else f"database ({name})"
                send, receive = p["send"] / base["send"], p["receive"] / base["receive"]
                print(f"  {store:<22} send {p['send']:>9,.0f} msg/s (x{send:.2f})  consume "
                      f"{p['receive']:>9,.0f} msg/s (x{receive:.2f})  "
                      f"peak RSS {mib(p['peak_rss'])}")  # fmt: skip
    finally:
        if postgres is not None:
            postgres.stop("immediate")
            shutil.rmtree(postgres.directory, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
