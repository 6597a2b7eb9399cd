"""Recovery time: a journal (or, with --paged, page files) holding N durable messages,
restarted to serving.

Writes N durable 100-byte AMQP messages straight into a fresh data dir through the
broker's storage manager (the same records a running broker writes), then starts
`scow run` on it and times launch -> accepting connections -> the first message
received. With --paged, a broker whose address pages everything is sent the messages by
`scow perf client` and stopped, and the restarts read its pages. Prints the figures; run
it a few times and quote the median.

    .venv/bin/python benchmarks/recovery.py --messages 1000000
    .venv/bin/python benchmarks/recovery.py --messages 1000000 --size 1024 --paged
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scow.core.storage import StorageManager
from scow.core.testing import broker_config, free_port, write_config
from scow.plugins.file_journal.journal import FileJournal
from scow.plugins.file_journal.plugin import journal_settings
from scow.protocols.amqp.codec import encode_message

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]
PAGED = {"bench": {"max-size-bytes": 0}}


def fill(data_dir: Path, count: int, size: int) -> float:
    storage = StorageManager(
        FileJournal(journal_settings(data_dir, "bindings", {})),
        FileJournal(journal_settings(data_dir, "messages", {})),
        sync_non_transactional=False,
    )
    storage.load()
    address_id = storage.next_id()
    storage.store_address(
        address_id, {"name": "bench", "routing-types": ["ANYCAST"], "auto-created": False}
    )
    queue_id = storage.next_id()
    storage.store_queue(
        queue_id,
        {"name": "bench", "address": "bench", "routing-type": "ANYCAST", "filter": None},
    )
    started = time.perf_counter()
    for i in range(count):
        body = (b"%010d" % i).ljust(size, b".")
        data = encode_message(body, durable=True)
        storage.store_message(storage.next_id(), "bench", 0, 4, [queue_id], data, None)
    storage.flush()
    storage.stop()
    return time.perf_counter() - started


def fill_pages(config: Path, port: int, count: int, size: int) -> float:
    """Send `count` durable messages to a broker whose address pages them all; stop it."""
    proc = _broker(config, port)
    try:
        started = time.perf_counter()
        subprocess.run(
            [
                *(sys.executable, "-m", "scow.core.cli", "perf", "client", "--mode", "send"),
                *("--url", f"amqp://127.0.0.1:{port}/bench", "--durable"),
                *("--count", str(count), "--size", str(size), "--timeout", "3600", "--json"),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(120)


def _broker(config: Path, port: int) -> subprocess.Popen[bytes]:
    """`scow run` on `config`, once it accepts connections on `port`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "scow.core.cli", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(proc, port)
    except BaseException:
        proc.kill()
        raise
    return proc


def _wait_listening(proc: subprocess.Popen[bytes], port: int) -> None:
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            raise SystemExit(f"broker exited with {proc.returncode}")
        time.sleep(0.01)


def restart(config: Path, port: int) -> tuple[float, float]:
    from proton.utils import BlockingConnection

    started = time.perf_counter()
    proc = _broker(config, port)
    try:
        listening = time.perf_counter() - started
        conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=60)
        receiver = conn.create_receiver("bench")
        receiver.receive(timeout=60)
        first = time.perf_counter() - started
        conn.close()
        return listening, first
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--paged", action="store_true", help="the messages in page files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port = free_port()
        plugins, settings = ([*PLUGINS, "paging"], PAGED) if args.paged else (PLUGINS, {})
        config = write_config(
            root / "scow.toml",
            broker_config(root / "data", plugins=plugins, address_settings=settings, port=port),
        )
        if args.paged:
            fill_seconds = fill_pages(config, port, args.messages, args.size)
        else:
            fill_seconds = fill(root / "data", args.messages, args.size)
        print(f"wrote {args.messages:,} durable {args.size} B messages in {fill_seconds:.1f} s")
        results = []
        for run in range(args.runs):
            listening, first = restart(config, port)
            results.append(first)
            print(f"run {run + 1}: listening after {listening:.2f} s, first message {first:.2f} s")
        results.sort()
        print(f"median restart-to-serving: {results[len(results) // 2]:.2f} s")


if __name__ == "__main__":
    main()
