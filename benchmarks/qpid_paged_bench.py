"""Qpid paged queue figures: a backlog through a qpid-paged queue against a standard queue.

Starts `scow run` (plugins as paging_bench's plus qpid-paged-queues) once per queue kind,
with a `global-max-size` large enough that the address never pages (the standard queue
holds its whole backlog in memory; the qpid-paged queue holds qpid.max_pages_loaded pages
of it). For each: --count non-durable --size messages sent to one queue with no consumer
(`scow perf client --mode send`), then consumed (1 consumer, at-least-once, `--mode
receive`), the broker's RSS sampled every 0.5 s during each phase. Prints the produce and
consume rates, the RSS peaks, the page file's size at the end of the backlog, and the
ratios qpid-paged / standard.

    .venv/bin/python benchmarks/qpid_paged_bench.py            # 1 M x 1 KiB, 1 MiB pages
    .venv/bin/python benchmarks/qpid_paged_bench.py --quick    # --count / 100
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from paging_bench import PLUGINS, Broker, backlog_client, du, mib, sampling
from run_perf import platform_line

PLUGIN = "qpid-paged-queues"
QUEUE = """\
[queues."bench"]
routing-type = "ANYCAST"
durable = false
{arguments}
"""


def run(root: Path, name: str, args: argparse.Namespace, arguments: str) -> dict[str, Any]:
    broker = Broker(
        root / name,
        broker='global-max-size = "64GiB"',
        plugins=f'{PLUGINS}, "{PLUGIN}"',
        extra=QUEUE.format(arguments=arguments),
    )
    broker.start()
    try:
        idle = broker.rss()
        sending: list[int] = []
        with sampling(broker, sending):
            sent = backlog_client(f"{broker.url}/bench", "send", args)
        page_file = du(root / name / "data" / "pq")
        receiving: list[int] = []
        with sampling(broker, receiving):
            received = backlog_client(f"{broker.url}/bench", "receive", args)
    finally:
        broker.stop()
    return {
        "idle": idle,
        "send_peak": max(sending),
        "receive_peak": max(receiving),
        "send": sent["send_rate"],
        "receive": received["receive_rate"],
        "received": received["received"],
        "page_file": page_file,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--max-pages-loaded", type=int, default=4)
    parser.add_argument("--page-factor", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="--count / 100")
    args = parser.parse_args()
    if args.quick:
        args.count = max(1000, args.count // 100)
    page_size = args.page_factor * os.sysconf("SC_PAGE_SIZE")
    paged_arguments = (
        f'arguments = {{ "qpid.paging" = true, "qpid.max_pages_loaded" = '
        f'{args.max_pages_loaded}, "qpid.page_factor" = {args.page_factor} }}'
    )
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory(prefix="scow-qpid-paged-") as tmp:
        root = Path(tmp)
        paged = run(root, "qpid-paged", args, paged_arguments)
        standard = run(root, "standard", args, "")
    print(
        f"{args.count:,} x {args.size} B non-durable, sent with no consumer, then consumed "
        f"(qpid-paged: {args.max_pages_loaded} pages of {mib(page_size)} loaded at most):"
    )
    for name, r in (("qpid-paged", paged), ("standard", standard)):
        print(
            f"  {name:<11} produce {r['send']:>9,.0f} msg/s, consume {r['receive']:>9,.0f} "
            f"msg/s; RSS idle {mib(r['idle'])}, peak producing {mib(r['send_peak'])}, "
            f"peak consuming {mib(r['receive_peak'])}"
        )
        if r["received"] != args.count:
            print(f"  !! {name}: received {r['received']:,} of {args.count:,}")
    print(f"  qpid-paged page file at the end of the backlog: {mib(paged['page_file'])}")
    print(
        "  qpid-paged / standard: produce {:.2f}, consume {:.2f}, peak RSS {:.2f} "
        "(growth over idle {:.2f})".format(
            paged["send"] / standard["send"],
            paged["receive"] / standard["receive"],
            max(paged["send_peak"], paged["receive_peak"])
            / max(standard["send_peak"], standard["receive_peak"]),
            (max(paged["send_peak"], paged["receive_peak"]) - paged["idle"])
            / max(1, max(standard["send_peak"], standard["receive_peak"]) - standard["idle"]),
        )
    )
    return 0


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
