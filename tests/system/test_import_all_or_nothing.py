"""`scow data import` is all or nothing: a target that refuses a line while it is written
(a full disk, a database trigger) is left empty, the error names the line and what the
target said, and a second import goes in; an import killed midway leaves a data dir that
a broker refuses and that the next import clears."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from proton import Message

from scow.core.testing import (
    BrokerProcess,
    broker_config,
    free_port,
    scow_command,
    wait_for,
    write_config,
)
from scow.core.unfinished_import import marker
from tests.database.backends import REFUSED, allow_rows, on_database, refuse_rows
from tests.wire.helpers import consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging", "spark"]


def _message(number: int, body: str, **extra: Any) -> dict[str, Any]:
    data = Message(body=body, durable=True).encode()
    return {
        "type": "message",
        "id": number,
        "address": "orders",
        "expiration": 0,
        "priority": 4,
        "queues": {"orders": 0},
        "data": base64.b64encode(data).decode(),
        **extra,
    }


def _large(number: int, body_size: int) -> dict[str, Any]:
    head = Message(durable=True).encode()
    data = head + b"L" * body_size
    line = _message(number, "")
    line.update(
        data=base64.b64encode(data).decode(), large=True, **{"head-size": len(head)}, size=len(data)
    )
    return line


def _export(path: Path, messages: list[dict[str, Any]], *, stream: bool = False) -> Path:
    """An export file: address and queue 'orders' holding `messages` (and a stream queue
    'events' with two records, before them, when `stream`)."""
    queue = {"routing-type": "ANYCAST", "filter": None, "auto-created": False}
    queue |= {"max-consumers": -1, "exclusive": False, "arguments": {}}
    lines: list[dict[str, Any]] = [
        {"type": "address", "name": "orders", "routing-types": ["ANYCAST"], "auto-created": False},
        {"type": "queue", "name": "orders", "address": "orders", "queue-type": "standard", **queue},
    ]
    if stream:
        lines += [
            {"type": "address", "name": "events", "routing-types": ["ANYCAST"]},
            {
                "type": "queue",
                "name": "events",
                "queue-type": "stream",
                **queue,
                "address": "events",
            },
            {"type": "stream", "queue": "events", "cursors": {"spark": [1, 0]}},
        ]
        lines += [
            {"type": "stream-record", "queue": "events", "sequence": seq, "enqueued": 0, "data": ""}
            for seq in (0, 1)
        ]
    lines += messages
    counts = {"addresses": 0, "queues": 0, "messages": 0, "streams": 0, "stream-records": 0}
    kinds = {"address": "addresses", "queue": "queues", "message": "messages"}
    kinds |= {"stream": "streams", "stream-record": "stream-records"}
    for line in lines:
        counts[kinds[line["type"]]] += 1
    with path.open("w") as out:
        out.write(json.dumps({"format": "scow-export", "version": 1, "created": 0}) + "\n")
        for line in [*lines, {"type": "end", **counts}]:
            out.write(json.dumps(line) + "\n")
    return path


def _scow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([scow_command(), *args], capture_output=True, text=True, timeout=120)


def _files(data_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file())


def _good(tmp_path: Path) -> Path:
    return _export(tmp_path / "good.jsonl", [_message(i, f"good {i}") for i in range(3)])


@pytest.mark.parametrize("target", ["data-dir", "config"])
def test_import_refused_by_a_full_disk_leaves_the_data_dir_empty(tmp_path, tmpfs, target):
    disk = tmpfs("32m")
    data = disk.path / "data"
    where = ["--data-dir", str(data)]
    if target == "config":  # the storage a config selects: files too, paged ones journaled
        where = [
            "--config",
            str(write_config(tmp_path / "s.toml", broker_config(data, plugins=PLUGINS))),
        ]
    # a large message, a paged one and a stream go in before the journal runs out of room
    messages = [_large(1, 300_000), _message(2, "paged", paged=True)]
    messages += [_message(i, "x" * 500_000) for i in range(3, 60)]
    big = _export(tmp_path / "big.jsonl", messages, stream=True)

    refused = _scow("data", "import", *where, "--input", str(big))

    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "not written: journal: not stored" in refused.stderr, refused.stderr
    assert "no room for a new" in refused.stderr, refused.stderr
    assert "nothing was imported: the target is empty again" in refused.stderr
    line = int(refused.stderr.split(": line ")[1].split(":")[0])
    assert 10 < line < 64, refused.stderr  # a message line, past the ones that fitted
    assert _files(data) == []  # no journal, page, large message or stream file, no marker

    good = _scow("data", "import", *where, "--input", str(_good(tmp_path)))
    assert good.returncode == 0, good.stderr
    assert "'messages': 3" in good.stdout
    exported = _scow("data", "export", *where, "--output", str(tmp_path / "e"))
    assert exported.returncode == 0, exported.stderr
    assert "'messages': 3" in exported.stdout and "'streams': 0" in exported.stdout


def test_import_into_a_data_dir_holding_data_is_refused_and_keeps_it(tmp_path):
    data = tmp_path / "data"
    good = _good(tmp_path)
    assert _scow("data", "import", "--data-dir", str(data), "--input", str(good)).returncode == 0
    again = _scow("data", "import", "--data-dir", str(data), "--input", str(good))
    assert again.returncode == 2 and "not empty" in again.stderr, again.stderr
    exported = _scow("data", "export", "--data-dir", str(data), "--output", str(tmp_path / "e"))
    assert "'messages': 3" in exported.stdout, exported.stdout + exported.stderr


def test_import_refused_by_the_database_leaves_every_table_empty(tmp_path, database_url):
    tables = broker_config(tmp_path / "data", **on_database({"plugins": PLUGINS}, database_url))
    config = write_config(tmp_path / "db.toml", tables)
    # the tables exist (a first look creates them) before the trigger goes in
    assert _scow("data", "print", "--config", str(config)).returncode == 0
    refuse_rows(database_url)  # a large message's third 1 MiB row is refused
    messages = [_message(i, f"m{i}") for i in range(10)] + [_large(10, 3 << 20)]
    messages += [_message(i, f"m{i}") for i in range(11, 20)]
    export = _export(tmp_path / "large.jsonl", messages, stream=True)

    refused = _scow("data", "import", "--config", str(config), "--input", str(export))

    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "line 19: large message 10 of" in refused.stderr, refused.stderr
    assert REFUSED in refused.stderr
    assert "nothing was imported: the target is empty again" in refused.stderr
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            names = sa.inspect(conn).get_table_names()
            rows = {n: conn.execute(sa.text(f'SELECT COUNT(*) FROM "{n}"')).scalar() for n in names}
    finally:
        engine.dispose()
    assert {"BINDINGS", "MESSAGES", "LARGE_MESSAGES", "STREAMS_DATA"} <= set(rows)
    assert {n: c for n, c in rows.items() if c and n != "NODE_MANAGER_STORE"} == {}
    assert not marker(tmp_path / "data", "database").exists()

    allow_rows(database_url)
    good = _scow("data", "import", "--config", str(config), "--input", str(export))
    assert good.returncode == 0, good.stderr
    assert "'messages': 20" in good.stdout and "'stream-records': 2" in good.stdout


#: What the database says when `_refuse_deletes` refuses one.
KEPT = "BINDINGS keeps its rows"


def _refuse_deletes(url: str, *, drop: bool = False) -> None:
    """Make BINDINGS refuse every DELETE (a trigger raising KEPT), or take that back."""
    engine = sa.create_engine(url)
    postgres = engine.dialect.name == "postgresql"
    if drop:
        statements = [
            'DROP TRIGGER keep_rows ON "BINDINGS"' if postgres else "DROP TRIGGER keep_rows"
        ]
    elif postgres:
        statements = [
            "CREATE FUNCTION keep_rows() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{KEPT}'; END $$",
            'CREATE TRIGGER keep_rows BEFORE DELETE ON "BINDINGS" FOR EACH ROW '
            "EXECUTE FUNCTION keep_rows()",
        ]
    else:
        statements = [
            'CREATE TRIGGER keep_rows BEFORE DELETE ON "BINDINGS" '
            f"BEGIN SELECT RAISE(ABORT, '{KEPT}'); END"
        ]
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_a_target_that_cannot_be_emptied_stays_marked_until_the_next_import(tmp_path, database_url):
    tables = broker_config(tmp_path / "data", **on_database({"plugins": PLUGINS}, database_url))
    config = write_config(tmp_path / "db.toml", tables)
    assert _scow("data", "print", "--config", str(config)).returncode == 0
    refuse_rows(database_url)
    _refuse_deletes(database_url)
    messages = [_message(i, f"m{i}") for i in range(10)] + [_large(10, 3 << 20)]
    export = _export(tmp_path / "large.jsonl", messages)

    refused = _scow("data", "import", "--config", str(config), "--input", str(export))

    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert REFUSED in refused.stderr and KEPT in refused.stderr, refused.stderr
    assert "emptying the target failed too" in refused.stderr, refused.stderr
    assert marker(tmp_path / "data", "database").exists()
    run = _scow("run", "--config", str(config))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "holds an import that did not finish" in run.stderr, run.stderr
    # the files under the same data dir are another store: their import is not held up
    data = ["--data-dir", str(tmp_path / "data")]
    files = _scow("data", "import", *data, "--input", str(_good(tmp_path)))
    assert files.returncode == 0, files.stderr

    _refuse_deletes(database_url, drop=True)
    allow_rows(database_url)
    good = _scow("data", "import", "--config", str(config), "--input", str(export))
    assert good.returncode == 0, good.stderr
    exported = _scow("data", "export", "--config", str(config), "--output", str(tmp_path / "e"))
    assert "'messages': 11" in exported.stdout, exported.stdout + exported.stderr
    assert "'queues': 1" in exported.stdout  # the first attempt's queue went


#: Runs a command with SIGINT as a terminal's Ctrl-C finds it: a job started in the
#: background without job control (a CI run, `cmd &` in a script) inherits SIGINT ignored,
#: and so would the import.
_WITH_SIGINT = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
)


def _interrupted_import(tmp_path: Path, data: Path, sig: int) -> subprocess.CompletedProcess[str]:
    """`scow data import` of a large file, sent `sig` once its first message (a large
    one: a file of its own) is written; it has ended."""
    bodies = data / "large-messages"
    messages = [_large(1, 200_000)] + [_message(i, "x" * 300_000) for i in range(2, 150)]
    big = _export(tmp_path / "big.jsonl", messages)
    importing = subprocess.Popen(
        [
            *_WITH_SIGINT,
            scow_command(),
            "data",
            "import",
            "--data-dir",
            str(data),
            "--input",
            str(big),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: (bodies.is_dir() and any(bodies.iterdir())) or importing.poll() is not None,
            timeout=60,
        )
        # held where it is (a loaded machine can let it finish before the signal comes):
        # `sig` lands mid-import, while its marker says it has not finished
        importing.send_signal(signal.SIGSTOP)
        assert importing.poll() is None and marker(data, "file").exists(), (
            "the import finished before it could be stopped"
        )
    finally:
        importing.send_signal(sig)
        importing.send_signal(signal.SIGCONT)
        out, err = importing.communicate(timeout=60)
    return subprocess.CompletedProcess(importing.args, importing.returncode, out, err)


def test_an_import_interrupted_with_ctrl_c_is_undone(tmp_path):
    data = tmp_path / "data"
    importing = _interrupted_import(tmp_path, data, signal.SIGINT)
    assert importing.returncode == 2
    assert "KeyboardInterrupt; nothing was imported" in importing.stderr, importing.stderr
    assert _files(data) == []


def test_an_import_killed_midway_keeps_brokers_off_and_the_next_import_clears_it(tmp_path):
    data = tmp_path / "data"
    bodies = data / "large-messages"
    _interrupted_import(tmp_path, data, signal.SIGKILL)
    assert marker(data, "file").exists()

    port = free_port()
    config = write_config(tmp_path / "scow.toml", broker_config(data, plugins=PLUGINS, port=port))
    for refused in (
        ["run", "--config", str(config)],
        ["data", "export", "--data-dir", str(data), "--output", str(tmp_path / "half.jsonl")],
    ):
        run = _scow(*refused)
        assert run.returncode == 2, (refused, run.stdout, run.stderr)
        assert "holds an import that did not finish" in run.stderr, (refused, run.stderr)

    good = _scow("data", "import", "--data-dir", str(data), "--input", str(_good(tmp_path)))
    assert good.returncode == 0, good.stderr
    assert not marker(data, "file").exists()
    assert list(bodies.iterdir()) == []  # the killed import's body went with it
    broker = BrokerProcess(config, port, tmp_path / "broker.log").start()
    try:
        assert [m.body for m in consume_all(broker.url, "orders", quiet=0.5)] == [
            f"good {i}" for i in range(3)
        ]
    finally:
        assert broker.stop() == 0


@pytest.mark.slow
def test_an_import_waits_out_a_postgresql_restart_and_completes_once(tmp_path, private_postgres):
    """The server stopped with `pg_ctl -m immediate` mid-import is no refusal: the import
    retries as a broker does, and goes in whole, each message once, when it is back."""
    url = private_postgres.url(private_postgres.create_database())
    tables = broker_config(tmp_path / "data", **on_database({"plugins": PLUGINS}, url))
    config = write_config(tmp_path / "db.toml", tables)
    big = _export(tmp_path / "big.jsonl", [_message(i, "x" * 20_000) for i in range(3000)])
    importing = subprocess.Popen(
        [scow_command(), "data", "import", "--config", str(config), "--input", str(big)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    printed: list[str] = []  # its log and its result: both on stdout
    assert importing.stdout is not None
    reader = threading.Thread(target=lambda: printed.extend(importing.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: marker(tmp_path / "data", "database").exists(), timeout=60)
        private_postgres.stop("immediate")
        wait_for(lambda: any("database lost" in line for line in printed), timeout=60)
        assert importing.poll() is None, "".join(printed)
        private_postgres.start()
        assert importing.wait(120) == 0, "".join(printed) + importing.stderr.read()
    finally:
        importing.kill()
    reader.join(10)
    assert any("'messages': 3000" in line for line in printed), "".join(printed)
    exported = _scow("data", "export", "--config", str(config), "--output", str(tmp_path / "e"))
    assert "'messages': 3000" in exported.stdout, exported.stdout + exported.stderr
