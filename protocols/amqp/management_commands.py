"""`scow queue|address|connection ...`: managing a running broker from the command line.

The commands send requests to the broker's `$management` node (see `management.py`)
over an ordinary AMQP connection, as `artemis queue` does over its own protocol.
Credentials come from `--user`/`--password`, `--password-file`, or the environment
(`SCOW_USER`, `SCOW_PASSWORD`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
import uuid
from pathlib import Path
from typing import Any

from proton import Message, SSLDomain
from proton.utils import BlockingConnection

from scow.protocols.amqp.management import MANAGEMENT_NODE

DEFAULT_URL = "amqp://localhost:5672"

#: Columns of `scow queue list`, as (header, attribute).
_COLUMNS = (
    ("NAME", "name"),
    ("ADDRESS", "address"),
    ("TYPE", "queue-type"),
    ("ROUTING", "routing-type"),
    ("DURABLE", "durable"),
    ("MESSAGES", "message-count"),
    ("IN MEMORY", "messages-in-memory"),
    ("PAGED", "messages-paged"),
    ("CONSUMERS", "consumer-count"),
)


#: `scow queue stat`, like `artemis queue stat`.
_STAT_COLUMNS = (
    ("NAME", "name"),
    ("ADDRESS", "address"),
    ("CONSUMER_COUNT", "consumer-count"),
    ("MESSAGE_COUNT", "message-count"),
    ("MESSAGES_ADDED", "messages-added"),
    ("DELIVERING_COUNT", "delivering-count"),
    ("MESSAGES_ACKED", "messages-acknowledged"),
    ("MESSAGES_EXPIRED", "messages-expired"),
    ("MESSAGES_KILLED", "messages-killed"),
    ("PAGED", "messages-paged"),
    ("ROUTING_TYPE", "routing-type"),
)
_ADDRESS_COLUMNS = (
    ("NAME", "name"),
    ("ROUTING", "routing-types"),
    ("QUEUES", "queues"),
    ("MEMORY", "memory-bytes"),
    ("PAGING", "paging"),
    ("BLOCKED", "blocked"),
)
_CONNECTION_COLUMNS = (
    ("ID", "id"),
    ("PROTOCOL", "protocol"),
    ("REMOTE", "remote"),
    ("CONTAINER", "container-id"),
    ("USER", "user"),
)


class CommandError(Exception):
    """What to tell the user; the exit status is 1 (refused) or 2 (no broker)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def request(
    args: argparse.Namespace,
    operation: str,
    name: str = "",
    body: Any = None,
    *,
    kind: str = "queue",
    **extra: Any,
) -> Any:
    """Send one management request and return the response body; raise CommandError."""
    user, password = _credentials(args)
    try:
        conn = BlockingConnection(
            args.url,
            timeout=args.timeout,
            user=user,
            password=password,
            allow_insecure_mechs=True,
            ssl_domain=_tls(args),
        )
    except Exception as exc:  # proton reports refused connections and bad logins alike
        raise CommandError(f"cannot connect to {args.url}: {exc}", 2) from None
    try:
        replies = conn.create_receiver(None, dynamic=True)
        sender = conn.create_sender(MANAGEMENT_NODE)
        message_id = str(uuid.uuid4())
        properties = {"operation": operation, "type": kind, "name": name, **extra}
        sender.send(
            Message(
                id=message_id,
                reply_to=replies.link.remote_source.address,
                properties=properties,
                body=body,
            )
        )
        reply = replies.receive(timeout=args.timeout)
        replies.accept()
    finally:
        conn.close()
    answer: dict[str, Any] = reply.properties or {}
    status = int(answer.get("statusCode", 500))
    if status >= 300:
        description = answer.get("statusDescription", "")
        raise CommandError(f"{operation.lower()} refused ({status}): {description}")
    return reply.body


def _credentials(args: argparse.Namespace) -> tuple[str | None, str | None]:
    user = args.user or os.environ.get("SCOW_USER")
    password = args.password or os.environ.get("SCOW_PASSWORD")
    if args.password_file is not None:
        password = Path(args.password_file).read_text().strip()
    return user, password


def parse_argument(text: str) -> tuple[str, Any]:
    """`key=value`, the value read as a TOML value (true, 10, "x") or else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. qpid.paging=true")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key, parsed


def cmd_create(args: argparse.Namespace) -> int:
    attributes: dict[str, Any] = {"durable": args.durable, "max-consumers": args.max_consumers}
    for key, value in (
        ("address", args.address),
        ("routing-type", args.routing_type),
        ("filter", args.filter),
        ("exclusive", args.exclusive),
        ("non-destructive", args.non_destructive),
    ):
        if value is not None:
            attributes[key] = value
    if args.argument:
        attributes["arguments"] = dict(args.argument)
    created = request(args, "CREATE", args.name, attributes)
    if args.json:
        print(json.dumps(created, sort_keys=True))
    else:
        print(f"queue '{created['name']}' created: {created['queue-type']} on "
              f"{created['address']} ({created['routing-type']})")  # fmt: skip
    return 0


def query(args: argparse.Namespace, kind: str) -> list[dict[str, Any]]:
    answer = request(args, "QUERY", kind=kind)
    names = answer["attributeNames"]
    return [dict(zip(names, row, strict=True)) for row in answer["results"]]


def print_rows(
    args: argparse.Namespace, rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]
) -> int:
    """A table (or JSON with --json) of `rows`, one column per (header, attribute)."""
    if args.json:
        print(json.dumps(rows, sort_keys=True))
        return 0
    table = [[str(row.get(attr, "")) for _, attr in columns] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in table)]) for i, (h, _) in enumerate(columns)]
    print("  ".join(h.ljust(w) for (h, _), w in zip(columns, widths, strict=True)).rstrip())
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rows = query(args, "queue")
    if not args.all:
        rows = [row for row in rows if not row["temporary"]]
    return print_rows(args, rows, _COLUMNS)


def cmd_stat(args: argparse.Namespace) -> int:
    rows = [row for row in query(args, "queue") if args.all or not row["temporary"]]
    return print_rows(args, rows, _STAT_COLUMNS)


def cmd_purge(args: argparse.Namespace) -> int:
    purged = request(args, "PURGE", args.name)["purged"]
    print(f"queue '{args.name}': {purged} message(s) purged")
    return 0


def cmd_move(args: argparse.Namespace) -> int:
    extra = {"to": args.to, **({"filter": args.filter} if args.filter else {})}
    moved = request(args, "MOVE", args.name, **extra)["moved"]
    print(f"queue '{args.name}': {moved} message(s) moved to '{args.to}'")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    moved = request(args, "RETRY", args.name)["moved"]
    print(f"queue '{args.name}': {moved} message(s) sent back to their original address")
    return 0


def cmd_address_list(args: argparse.Namespace) -> int:
    rows = query(args, "address")
    for row in rows:
        row["routing-types"] = ",".join(row["routing-types"])
        row["queues"] = ",".join(row["queues"])
    return print_rows(args, rows, _ADDRESS_COLUMNS)


def cmd_connection_list(args: argparse.Namespace) -> int:
    return print_rows(args, query(args, "connection"), _CONNECTION_COLUMNS)


def cmd_connection_close(args: argparse.Namespace) -> int:
    request(args, "DELETE", str(args.id), kind="connection")
    print(f"connection {args.id} closed")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    request(args, "DELETE", args.name, force=args.force)
    print(f"queue '{args.name}' deleted")
    return 0


def _run(handler: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except CommandError as exc:
            print(f"scow: {exc}", file=sys.stderr)
            return exc.status

    return run


def _tls(args: argparse.Namespace) -> SSLDomain | None:
    """For amqps://: check the broker's certificate and name (against --ca-file when
    given); with --cert-file and --key-file, present a client certificate (EXTERNAL)."""
    if not args.url.startswith("amqps:"):
        return None
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    if args.ca_file is not None:
        domain.set_trusted_ca_db(str(args.ca_file))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if args.cert_file is not None:
        domain.set_credentials(str(args.cert_file), str(args.key_file or args.cert_file), None)
    return domain


#: The default --timeout of move and retry, which the broker answers once every message
#: is moved (pages included: a few tens of thousands a second).
_MOVING = (3600.0, ": the answer comes once every message is moved")


def _common(parser: argparse.ArgumentParser, timeout: float = 10.0, why: str = "") -> None:
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the broker (default {DEFAULT_URL})")
    parser.add_argument("--user", help="SASL user (or SCOW_USER)")
    parser.add_argument("--password", help="password (or SCOW_PASSWORD, or --password-file)")
    parser.add_argument("--password-file", type=Path, help="read the password from this file")
    parser.add_argument(
        "--timeout", type=float, default=timeout, help=f"seconds (default {timeout:g}{why})"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--ca-file", type=Path, help="CA (PEM) to trust for amqps:// URLs")
    parser.add_argument("--cert-file", type=Path, help="client certificate (PEM) for amqps://")
    parser.add_argument("--key-file", type=Path, help="its private key (PEM)")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    from scow.core.cli import command_group

    sub = command_group(subparsers, "queue", "create, list and delete queues of a running broker")
    create = sub.add_parser("create", help="create a queue (its arguments choose its type)")
    create.add_argument("name")
    create.add_argument("--address", help="the address to bind it to (default: its name)")
    create.add_argument("--routing-type", type=str.upper, choices=("ANYCAST", "MULTICAST"))
    create.add_argument(
        "--durable", action=argparse.BooleanOptionalAction, default=True, help="(default: yes)"
    )
    create.add_argument("--filter", help="selector: only matching messages enter the queue")
    create.add_argument(
        "--argument",
        action="append",
        type=parse_argument,
        metavar="KEY=VALUE",
        help="queue argument, repeatable: qpid.priorities=10, last-value-key=stock, ...",
    )
    create.add_argument("--max-consumers", type=int, default=-1)
    create.add_argument("--exclusive", action=argparse.BooleanOptionalAction, default=None)
    create.add_argument("--non-destructive", action=argparse.BooleanOptionalAction, default=None)
    _common(create)
    create.set_defaults(handler=_run(cmd_create))

    listing = sub.add_parser("list", help="every queue with its type and figures")
    listing.add_argument("--all", action="store_true", help="temporary queues too")
    _common(listing)
    listing.set_defaults(handler=_run(cmd_list))

    stat = sub.add_parser("stat", help="every queue's counters, like artemis queue stat")
    stat.add_argument("--all", action="store_true", help="temporary queues too")
    _common(stat)
    stat.set_defaults(handler=_run(cmd_stat))

    purge = sub.add_parser("purge", help="drop a queue's waiting messages")
    purge.add_argument("name")
    _common(purge)
    purge.set_defaults(handler=_run(cmd_purge))

    move = sub.add_parser("move", help="send a queue's waiting messages to another address")
    move.add_argument("name")
    move.add_argument("--to", required=True, help="the address to send them to")
    move.add_argument("--filter", help="selector: only the messages it matches")
    _common(move, *_MOVING)
    move.set_defaults(handler=_run(cmd_move))

    retry = sub.add_parser("retry", help="send dead letters back to their original address")
    retry.add_argument("name")
    _common(retry, *_MOVING)
    retry.set_defaults(handler=_run(cmd_retry))

    delete = sub.add_parser("delete", help="delete a queue and its messages")
    delete.add_argument("name")
    delete.add_argument("--force", action="store_true", help="even with consumers (detached)")
    _common(delete)
    delete.set_defaults(handler=_run(cmd_delete))

    addresses = command_group(subparsers, "address", "addresses of a running broker")
    listing = addresses.add_parser("list", help="every address, its queues and paging state")
    _common(listing)
    listing.set_defaults(handler=_run(cmd_address_list))

    connections = command_group(subparsers, "connection", "client connections of a running broker")
    listing = connections.add_parser("list", help="open client connections")
    _common(listing)
    listing.set_defaults(handler=_run(cmd_connection_list))
    close = connections.add_parser("close", help="close a client connection")
    close.add_argument("id", type=int)
    _common(close)
    close.set_defaults(handler=_run(cmd_connection_close))
