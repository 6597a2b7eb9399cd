"""Seeded random fault schedules against a broker with every feature on at once.

A failure prints its seed and the command that replays it:
`SCOW_CHAOS_SEED=N [SCOW_CHAOS_SECONDS=S SCOW_CHAOS_FAULTS=a,b SCOW_CHAOS_MUST=c
SCOW_CHAOS_RATE=R] pytest tests/system/test_chaos.py -k replay` (the same faults in the same
order; their timing against the traffic differs from run to run). `-m slow` runs many
longer schedules.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.security.helpers import Pki
from tests.system import native
from tests.system.faults import FAULT_KINDS, QUICK_FAULTS
from tests.system.harness import ChaosRun, Report, Settings
from tests.system.records import read_events


def run_schedule(
    tmp_path: Path, c_build: native.CExamples | str, pki: Pki, settings: Settings
) -> Report:
    run = ChaosRun(
        settings,
        tmp_path / f"chaos-{settings.seed}",
        c_examples=c_build if not isinstance(c_build, str) else None,
        tls=(pki.ca, pki.server_cert, pki.server_key),
    )
    report = run.run()
    if isinstance(c_build, str):
        report.notes.append(f"proton's C examples left out: {c_build}")
    print(report.describe())
    return report


@pytest.mark.parametrize("seed", [1701, 1702])
def test_short_schedule_of_client_faults_keeps_every_invariant(tmp_path, c_build, pki, seed):
    report = run_schedule(
        tmp_path,
        c_build,
        pki,
        Settings(seed=seed, duration=7, faults=QUICK_FAULTS, rate_factor=0.5),
    )
    assert not report.failed, report.describe()


def test_short_schedule_with_broker_kills_and_a_full_disk_keeps_every_invariant(
    tmp_path, c_build, pki
):
    report = run_schedule(
        tmp_path,
        c_build,
        pki,
        Settings(
            seed=1703,
            duration=8,
            faults=FAULT_KINDS,
            must=("broker-restart", "disk-full", "client-stop"),
            rate_factor=0.5,
        ),
    )
    assert not report.failed, report.describe()


def test_laps_drain_and_measure_each_lap_and_read_streams_once(tmp_path, c_build, pki):
    """A soak's laps: queues drained after each lap with the broker left running, the
    stream read once at the end (a second read would count its messages twice)."""
    report = run_schedule(
        tmp_path,
        c_build,
        pki,
        Settings(
            seed=1704,
            duration=4,
            laps=2,
            faults=QUICK_FAULTS,
            must=("c-receive-kill", "stream-read"),
            rate_factor=0.5,
        ),
    )
    assert not report.failed, report.describe()
    assert len(report.resources["laps"]) == 2
    # a client's name names its log: one reused in the next lap mixed two clients' events
    spawned = [
        e["name"] for e in read_events(report.workdir / "schedule.jsonl") if e["kind"] == "spawn"
    ]
    assert len(spawned) == len(set(spawned)), spawned


@pytest.mark.skipif("SCOW_CHAOS_SEED" not in os.environ, reason="set SCOW_CHAOS_SEED to replay")
def test_replay(tmp_path, c_build, pki):
    report = run_schedule(tmp_path, c_build, pki, Settings.from_environment(os.environ))
    assert not report.failed, report.describe()


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 140))
def test_long_schedule_keeps_every_invariant(tmp_path, c_build, pki, seed):
    report = run_schedule(tmp_path, c_build, pki, Settings(seed=seed, duration=40))
    assert not report.failed, report.describe()
