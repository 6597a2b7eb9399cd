"""The `scow` command line."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import getpass
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from scow.core import app, critical, ha, open_files, version
from scow.core import logging as scow_logging
from scow.core.config import ConfigError, default_config_path, read_plugin_list, to_toml
from scow.core.model import derived_global_max_size, memory_limit
from scow.core.plugins import PluginManager, describe_plugins, installed_plugins
from scow.core.security.scram import DEFAULT_ITERATIONS
from scow.core.security.users import UsersFileError, add_user, read_users, remove_user


def command_group(
    subparsers: argparse._SubParsersAction,
    name: str,
    help: str,
) -> argparse._SubParsersAction:
    """The sub-commands of group `name` (`scow perf ...`), created by whichever plugin
    asks first, so several plugins can add commands to one group."""
    parser = subparsers.choices.get(name)
    if parser is None:
        parser = subparsers.add_parser(name, help=help)
        parser.set_defaults(_group=parser.add_subparsers(dest=f"{name}_command", required=True))
    return parser.get_default("_group")


def _config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"config file (default: the packaged {default_config_path().name})",
    )


def _config_path(args: argparse.Namespace) -> Path:
    return args.config if args.config is not None else default_config_path()


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    broker: dict[str, object] = {}
    if getattr(args, "data_dir", None) is not None:
        broker["data-dir"] = str(args.data_dir)
    if getattr(args, "log_format", None) is not None:
        broker["log-format"] = args.log_format
    overrides: dict[str, dict[str, object]] = {"broker": broker}
    if getattr(args, "listen", None):
        overrides["amqp"] = {"listen": list(args.listen)}
    return overrides


def cmd_run(args: argparse.Namespace) -> int:
    try:
        plugins, config = app.load(_config_path(args), _overrides(args))
        broker_cfg = config.section("broker")
        scow_logging.configure(broker_cfg["log-format"], broker_cfg["log-level"], background=True)
        structlog.get_logger().info(
            "scow starting", version=version(), pid=os.getpid(), config=str(_config_path(args))
        )
        _raise_open_files()
        if broker_cfg["global-max-size"] == -1:
            structlog.get_logger().info(
                "global-max-size derived", bytes=derived_global_max_size(), memory=memory_limit()
            )
        critical.on_storage_failure(critical.halt)
        server = app.Server(plugins, config)
    except app.StartupError as exc:
        return _stopped_by(str(exc), 2)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # uvloop is optional on platforms without it
        runner = asyncio.run
    try:
        runner(server.run_forever())
    except (app.StartupError, ConfigError) as exc:
        return _stopped_by(str(exc), 2)
    except OSError as exc:  # a listener's bind, mostly; the error names its address
        return _stopped_by(f"cannot start: {exc}", 1)
    scow_logging.drain()
    return 0


def _stopped_by(problem: str, status: int) -> int:
    """`scow run` ends for `problem`: said after the log lines still waiting to be written."""
    scow_logging.drain()
    print(f"scow: {problem}", file=sys.stderr)
    return status


def _raise_open_files() -> None:
    """The soft open-file limit up to the hard one, logged with what client sockets get."""
    before, files = open_files.raise_limit()
    raised = {"raised-from": before} if files != before else {}
    structlog.get_logger().info(
        "open files", limit=files, **raised, client_sockets=open_files.socket_ceiling(files)
    )


def cmd_ha_status(args: argparse.Namespace) -> int:
    """Read what the members of an HA pair left in their shared store (no lock taken)."""
    try:
        plugins, config = app.load(_config_path(args))
        member = app.Server(plugins, config).ha
    except app.StartupError as exc:
        print(f"scow: {exc}", file=sys.stderr)
        return 2
    if member is None:
        print(
            f"scow: {_config_path(args)}: no [ha] policy: this broker shares no store",
            file=sys.stderr,
        )
        return 2
    lock = member.lock
    state, members = lock.read_state(), lock.members()
    now = time.time()
    if args.json:
        print(
            json.dumps(
                {"store": lock.where, "state": state, "members": [m.to_dict() for m in members]}
            )
        )
        return 0
    print(f"store: {lock.where}\nstate: {state or 'never served'}")
    for m in members:
        age = now - m.updated
        stale = "  (stale: not heard from since)" if age > ha.STALE_AFTER * ha.HEARTBEAT else ""
        print(
            f"  {m.name:<16} {m.role:<8} {m.state:<8} {m.url or '-':<28} pid {m.pid} on "
            f"{m.host}, {age:.1f} s ago{stale}"
        )
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    try:
        enabled = read_plugin_list(_config_path(args))
    except ConfigError as exc:
        print(f"scow: {exc}", file=sys.stderr)
        return 2
    for info in describe_plugins(enabled):
        state = "enabled" if info.enabled else "installed"
        print(f"{info.name:<18} {state:<10} {info.module}")
        for hook in info.hooks:
            print(f"    {hook}")
    unknown = [name for name in enabled if name not in installed_plugins()]
    for name in unknown:
        print(f"{name:<18} MISSING    listed in [plugins] enable but not installed")
    return 1 if unknown else 0


def cmd_config_check(args: argparse.Namespace) -> int:
    try:
        _plugins, config = app.load(_config_path(args))
    except app.StartupError as exc:
        print(f"scow: {exc}", file=sys.stderr)
        return 2
    print(f"# {config.path or 'defaults'}: valid")
    if config.section("broker")["global-max-size"] == -1:
        print(
            f"# global-max-size = -1 derives {derived_global_max_size()} bytes here "
            "(1/16 of the memory this process may use, at most 128 MiB)"
        )
    print(to_toml(config.effective()))
    return 0


def _users_file(args: argparse.Namespace) -> Path:
    """--users-file, else the config's [security] users-file."""
    if args.users_file is not None:
        return Path(args.users_file)
    configured = str(app.load(_config_path(args))[1].section("security")["users-file"])
    if not configured:
        raise UsersFileError(
            f"{_config_path(args)}: [security] users-file is not set; give --users-file"
        )
    return Path(configured)


def _password(args: argparse.Namespace) -> str:
    if args.password is not None:
        return str(args.password)
    if args.password_file is not None:
        return Path(args.password_file).read_text().rstrip("\n")
    if not sys.stdin.isatty():
        raise UsersFileError("give --password or --password-file (no terminal to ask on)")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise UsersFileError("the passwords differ")
    return first


def cmd_user(args: argparse.Namespace) -> int:
    try:
        path = _users_file(args)
        if args.user_command == "add":
            user = add_user(
                path, args.name, _password(args), args.role or (), iterations=args.iterations
            )
            print(f"user {user.name!r} saved in {path} (roles: {', '.join(sorted(user.roles))})")
        elif args.user_command == "remove":
            remove_user(path, args.name)
            print(f"user {args.name!r} removed from {path}")
        else:
            for user in sorted(read_users(path).values(), key=lambda u: u.name):
                print(f"{user.name:<24} {', '.join(sorted(user.roles))}")
    except (UsersFileError, app.StartupError, OSError) as exc:
        print(f"scow: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_user_commands(sub: argparse._SubParsersAction) -> None:
    user = sub.add_parser("user", help="manage the users file (names, roles, credentials)")
    user_sub = user.add_subparsers(dest="user_command", required=True)
    add = user_sub.add_parser("add", help="add a user, or change its password and roles")
    add.add_argument("name")
    add.add_argument("--password", help="the password (or --password-file, or asked)")
    add.add_argument("--password-file", type=Path, help="read the password from this file")
    add.add_argument("--role", action="append", help="a role, repeatable")
    add.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"PBKDF2 rounds of the SCRAM credential (default {DEFAULT_ITERATIONS})",
    )
    remove = user_sub.add_parser("remove", help="remove a user")
    remove.add_argument("name")
    listing = user_sub.add_parser("list", help="the users and their roles")
    for parser in (add, remove, listing):
        _config_arg(parser)
        parser.add_argument(
            "--users-file", type=Path, help="the users file (default: [security] users-file)"
        )
        parser.set_defaults(handler=cmd_user)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scow", description="Scow, an AMQP 1.0 broker")
    parser.add_argument(
        "--version",
        action="version",
        version=f"scow {version()} (Python {platform.python_version()})",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start the broker")
    _config_arg(run)
    run.add_argument(
        "--listen",
        action="append",
        metavar="HOST:PORT",
        help="AMQP listen address, repeatable (overrides [amqp] listen)",
    )
    run.add_argument("--data-dir", type=Path, help="overrides [broker] data-dir")
    run.add_argument("--log-format", choices=("console", "json"), help="overrides [broker]")
    run.set_defaults(handler=cmd_run)

    plugins = sub.add_parser("plugins", help="installed and enabled plugins and their hooks")
    _config_arg(plugins)
    plugins.set_defaults(handler=cmd_plugins)

    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config and print the effective one")
    _config_arg(check)
    check.set_defaults(handler=cmd_config_check)

    _add_user_commands(sub)

    ha = sub.add_parser("ha", help="high availability: the members sharing this broker's store")
    ha_sub = ha.add_subparsers(dest="ha_command", required=True)
    status = ha_sub.add_parser(
        "status", help="the store's state and each member's role and state, as they announced"
    )
    _config_arg(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=cmd_ha_status)

    tools = PluginManager()
    for name, ep in sorted(installed_plugins().items()):
        try:
            tools.register(ep.load(), name)
        except Exception as exc:  # a broken plugin must not take the CLI down
            print(f"scow: plugin '{name}' failed to load: {exc}", file=sys.stderr)
    tools.hook.scow_add_commands(subparsers=sub)
    return parser


#: The status of a command whose reader went away, as if SIGPIPE had ended it (128 + 13).
EXIT_BROKEN_PIPE = 141


def _open_standard_streams() -> None:
    """Open /dev/null on each of descriptors 0-2 that the caller closed (`scow run <&-
    2>&-`, a supervisor passing nothing on), as sshd and systemd do: left closed, the
    broker's first files and sockets would take them (a journal file written as stdout;
    libuv aborts when it closes a descriptor below 3), and Python has no stream for them."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            # the lowest free descriptor, which is fd: those below it are open by now
            os.open(os.devnull, os.O_RDWR)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 - the process's


def main(argv: Sequence[str] | None = None) -> int:
    _open_standard_streams()
    if not faulthandler.is_enabled():  # (pytest enables its own for in-process calls)
        # a fatal error in C code (proton, the C library) leaves every thread's Python
        # stack on stderr (the broker's log), not just an exit status
        faulthandler.enable()
    # SIGPIPE stays ignored (Python's default): a peer that vanishes costs `scow run` one
    # connection (EPIPE), never the process. A command whose output reader goes away
    # (`scow data print | head`) meets BrokenPipeError instead and ends quietly.
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except BrokenPipeError:
        # the interpreter flushes stdout at exit: point it somewhere that cannot break
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
