"""Hostile AMQP frames against a live broker (a subprocess): it must keep serving.

Each case (see `fuzz_frames`) is one connection: the AMQP header, a valid open, sessions
and links, then frames with hostile values. Cases go in batches of 100 connections at
once; every 10 batches a normal client must still get a message through, and after all
of them the broker's resident memory must not have grown past a bound (10 k cases in the
default run, 1 M with `-m slow`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.security.fuzz_frames import batches
from tests.wire.helpers import AMQP_HEADER, round_trip

BATCH = 100
#: Growth of the broker's RSS allowed between the warm-up and the end of the run.
RSS_BOUND = 16 << 20  # measured: +8.5 MiB over the first 10 k cases, +0.7 over the next 10 k


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _one(port: int, data: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(AMQP_HEADER + data)
        writer.write_eof()  # then wait for the broker to close: it has read every byte
        while await asyncio.wait_for(reader.read(65536), 10):
            pass
    except ConnectionResetError:
        pass  # a refusal may reset rather than close
    finally:
        writer.close()


async def _batch(port: int, batch: list[bytes]) -> None:
    await asyncio.gather(*(_one(port, data) for data in batch))


def fuzz(broker, examples: int) -> None:
    """Run `examples` Hypothesis examples of BATCH cases each against `broker`."""
    done = 0

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(batches(BATCH))
    def run(batch: list[bytes]) -> None:
        nonlocal done
        asyncio.run(_batch(broker.port, batch))
        done += 1
        if done % 10 == 0:
            round_trip(broker.url)  # a normal client is still served

    run()


@pytest.fixture
def fuzzed_broker(scow_broker_process):
    return scow_broker_process(sections={"amqp": {"max-frame-size": 65536}})


def check_fuzz(broker, cases_total: int) -> None:
    pid = broker.proc.pid
    fuzz(broker, 10)  # warm-up: 1,000 cases fill the allocator's pools and caches
    before = rss(pid)
    fuzz(broker, cases_total // BATCH - 10)
    round_trip(broker.url)
    grown = rss(pid) - before
    assert grown < RSS_BOUND, f"broker RSS grew by {grown >> 20} MiB over the fuzz run"
    assert broker.proc.poll() is None


def test_ten_thousand_hostile_cases_leave_the_broker_serving(fuzzed_broker):
    check_fuzz(fuzzed_broker, 10_000)


@pytest.mark.slow
def test_a_million_hostile_cases_leave_the_broker_serving(fuzzed_broker):
    check_fuzz(fuzzed_broker, 1_000_000)
