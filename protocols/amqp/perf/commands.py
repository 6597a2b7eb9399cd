"""The `scow perf client` and `scow perf sink` commands: their arguments and handlers."""

from __future__ import annotations

import argparse
import json
import sys

from scow.protocols.amqp.perf.client import mode_conflict, run_client
from scow.protocols.amqp.perf.errors import PerfError
from scow.protocols.amqp.perf.sink import run_sink
from scow.protocols.amqp.perf.summary import completed, format_summary


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:5673")
    return host.strip("[]") or "127.0.0.1", int(port)


def _property(value: str) -> tuple[str, str]:
    name, equals, text = value.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(
            f"--property {value!r}: expected NAME=VALUE, such as color=red"
        )
    return name, text


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return n


def _non_negative(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be 0 or more")
    return n


def cmd_client(args: argparse.Namespace) -> int:
    options = {
        "count": args.count,
        "size": args.size,
        "pairs": args.pairs,
        "durable": args.durable,
        "duplicate_ids": args.duplicate_ids,
        "properties": dict(args.property),
        "presettled": args.presettled,
        "rate": args.rate or 0.0,
        "warmup": args.warmup,
        "credit": args.credit,
        "max_pending": args.max_pending,
        "timeout": args.timeout,
        "mode": args.mode,
        "ca_file": args.ca_file,
    }
    conflict = mode_conflict(options)
    if conflict:
        print(f"scow perf client: {conflict}", file=sys.stderr)
        return 2  # a usage error, as argparse exits with
    try:
        result = run_client(args.url, options)
    except PerfError as exc:
        print(f"scow perf client: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else format_summary(result))
    return 0 if completed(result) else 1


def cmd_sink(args: argparse.Namespace) -> int:
    host, port = args.listen
    try:
        run_sink(
            host,
            port,
            size=args.size,
            credit=args.credit,
            generate=not args.no_generate,
            fork=not args.single_process,
        )
    except PerfError as exc:
        print(f"scow perf sink: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"scow perf sink: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add `scow perf client` and `scow perf sink`."""
    from scow.core.cli import command_group

    sub = command_group(subparsers, "perf", "load generators and measurements")

    client = sub.add_parser(
        "client",
        help="producer/consumer pairs: send and receive rates, end-to-end latency; "
        "or producers only (--mode send) or consumers only (--mode receive)",
    )
    client.add_argument("--url", required=True, help="amqp://HOST:PORT/ADDRESS (amqps:// for TLS)")
    client.add_argument(
        "--ca-file", help="CA certificates (PEM) to trust for amqps (default: the system's)"
    )
    client.add_argument(
        "--count",
        type=_positive,
        default=100_000,
        help="messages per pair (with --mode send or receive: per producer or consumer)",
    )
    client.add_argument("--size", type=int, default=100, help="body bytes, at least 8")
    client.add_argument(
        "--pairs",
        type=_positive,
        default=1,
        help="producer/consumer pairs (with --mode send or receive: producers or consumers)",
    )
    client.add_argument("--durable", action="store_true", help="send durable messages")
    client.add_argument(
        "--duplicate-ids",
        action="store_true",
        help="give each message an _AMQ_DUPL_ID of its own (duplicate detection's cost)",
    )
    client.add_argument(
        "--property",
        type=_property,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an application property (string) on every message sent, repeatable",
    )
    client.add_argument(
        "--presettled",
        action="store_true",
        help="at-most-once: send pre-settled (with --mode receive: ask to receive pre-settled)",
    )
    client.add_argument("--rate", type=float, help="total send rate (msg/s) over all producers")
    client.add_argument(
        "--warmup", type=_non_negative, default=0, help="messages per pair sent first, not measured"
    )
    client.add_argument("--credit", type=_positive, default=1000, help="consumer credit window")
    client.add_argument(
        "--max-pending",
        type=_non_negative,
        default=10_000,
        help="unsettled messages a producer may have in flight (0: credit alone limits)",
    )
    client.add_argument(
        "--mode",
        choices=("pairs", "send", "receive"),
        default="pairs",
        help="pairs (default); send: producers only, to fill a queue; receive: consumers "
        "only, each until it got --count (no latency: the stamps are from another run)",
    )
    client.add_argument("--timeout", type=float, default=300.0, help="give up after (s)")
    client.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    client.set_defaults(handler=cmd_client)

    sink = sub.add_parser("sink", help="trivial AMQP peer: accepts all, generates for receivers")
    sink.add_argument("--listen", type=_host_port, default=("127.0.0.1", 5673), metavar="HOST:PORT")
    sink.add_argument("--size", type=int, default=100, help="body bytes of generated messages")
    sink.add_argument("--credit", type=_positive, default=1000, help="credit given to senders")
    sink.add_argument(
        "--no-generate", action="store_true", help="send nothing on links the client receives on"
    )
    sink.add_argument(
        "--single-process",
        action="store_true",
        help="serve every connection in one process (default: a process per connection)",
    )
    sink.set_defaults(handler=cmd_sink)
