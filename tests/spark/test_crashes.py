"""Crashes as a user's Spark job meets them: the driver process, or the broker (`scow run`),
killed with SIGKILL in the middle of a micro-batch, then the job run again from its
checkpoint: every input message is in the output exactly once.

The job is `crash_job.py` in a process of its own (with its JVM and Python workers); it
stops at a named point of a micro-batch and says so with a file (see its docstring), so
the kill lands there and nowhere else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scow.core.testing import BrokerProcess, free_port, wait_for
from tests.spark.conftest import client, publish, stream, wait_stream

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("crash_job.py")
ROOT = Path(__file__).resolve().parents[2]
#: How long one run of the job may take (a JVM start on a busy machine, then the batches).
RUN_TIMEOUT = 300


class Job:
    """`crash_job.py` as a process group of its own: the driver, its JVM, its workers."""

    def __init__(self, url: str, tmp_path: Path, per_trigger: int, per_partition: int) -> None:
        self.args = [
            sys.executable,
            str(JOB),
            url,
            str(tmp_path / "checkpoint"),
            "--per-trigger",
            str(per_trigger),
            "--per-partition",
            str(per_partition),
        ]
        self.points = tmp_path / "points"
        self.points.mkdir()
        self.log = tmp_path / "job.log"
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, crash_at: str | None = None, batch: int = 1) -> Job:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCOW_CRASH_")}
        env["PYTHONPATH"] = str(ROOT)
        if crash_at:
            env.update(SCOW_CRASH_AT=crash_at, SCOW_CRASH_BATCH=str(batch))
            env["SCOW_CRASH_DIR"] = str(self.points)
        self.runs += 1
        with open(self.log, "ab") as log:
            log.write(f"--- run {self.runs} (crash at {crash_at})\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return self

    def wait_point(self, point: str) -> None:
        """Wait until the job stands at `point` (failing at once if it ended instead)."""
        assert self.proc is not None

        def there() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"the job ended ({self.proc.returncode}) before {point}:\n{self.tail()}"
                )
            return (self.points / point).exists()

        wait_for(there, RUN_TIMEOUT, 0.05, f"the job to stop at {point}")

    def kill_driver(self) -> None:
        """SIGKILL the driver; then wait until its JVM and workers have gone with it (the
        JVM ends when its driver's pipe closes; its workers follow it)."""
        assert self.proc is not None
        group = self.proc.pid
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        wait_for(lambda: not _group_alive(group), 60, 0.1, "the driver's JVM and workers to end")

    def release(self) -> None:
        (self.points / "release").touch()

    def wait(self) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(
                f"the job did not end in {RUN_TIMEOUT} s:\n{self.tail()}"
            ) from None

    def run_to_the_end(self, tries: int = 3) -> None:
        """Run the job again until it catches up (a run fails when the broker goes away
        under it, as a user's job would, and its user starts it again)."""
        for _ in range(tries):
            if self.start().wait() == 0:
                return
        raise AssertionError(f"the job failed {tries} times:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return any(_state(pid) not in ("Z", "") for pid in _members(group))


def _members(group: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if os.getpgid(int(entry)) == group:
                    pids.append(int(entry))
    return pids


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def bodies(n: int) -> list[str]:
    return [f"m{i:07d}" for i in range(n)]


def out_bodies(url: str, count: int) -> list[str]:
    """Every body of stream `out`, in order (a read of the whole stream)."""
    from scow.plugins.spark.schema import to_batch

    reader = client(url)
    try:
        found: list[str] = []
        for messages in reader.read("out", 0, count * 2 + 1):
            found += [bytes(b).decode() for b in to_batch("out", messages).column(0).to_pylist()]
        return found
    finally:
        reader.close()


def assert_once(url: str, count: int) -> None:
    found = out_bodies(url, count)
    assert len(found) == len(set(found)), f"{len(found) - len(set(found))} rows written twice"
    assert sorted(found) == bodies(count), f"{count - len(set(found))} of {count} rows missing"


def fill(url: str, count: int) -> None:
    every = bodies(count)
    chunk = 50_000
    for start in range(0, count, chunk):
        publish(url, "in", every[start : start + chunk])


def client_state(url: str) -> dict[str, Any]:
    reader = client(url)
    try:
        return dict(reader.call("stream", "in", "READ"))
    finally:
        reader.close()


POINTS = ["read", "write", "staged", "committed"]


def points(default_run: tuple[str, ...]) -> list[Any]:
    """Every point; those not in `default_run` only with -m slow (each run of the job
    starts a JVM: a test takes a minute or more on a busy machine)."""
    return [
        point if point in default_run else pytest.param(point, marks=pytest.mark.slow)
        for point in POINTS
    ]


def _driver_killed(streams: Any, tmp_path: Path, point: str, count: int, per_trigger: int):
    broker = streams.start({"in": stream(), "out": stream()})
    fill(broker.url, count)
    wait_stream(broker, "in", count)
    job = Job(broker.url, tmp_path, per_trigger, per_trigger // 2)
    try:
        job.start(crash_at=point, batch=1).wait_point(point)
        job.kill_driver()
        job.run_to_the_end()
    finally:
        job.stop()
    assert_once(broker.url, count)


@pytest.mark.parametrize("point", points(("write", "committed")))
def test_driver_killed_mid_batch_and_run_again_writes_every_message_once(streams, tmp_path, point):
    _driver_killed(streams, tmp_path, point, 300, 100)


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_driver_killed_mid_batch_of_a_million_messages_writes_every_message_once(
    streams, tmp_path, point
):
    _driver_killed(streams, tmp_path, point, 1_000_000, 250_000)


def _broker_killed(streams: Any, tmp_path: Path, point: str, count: int, per_trigger: int):
    port = free_port()
    config = streams.config({"in": stream(), "out": stream()}, port=port)
    broker = BrokerProcess(config, port, tmp_path / "broker.log").start()
    job = Job(broker.url, tmp_path, per_trigger, per_trigger // 2)
    try:
        fill(broker.url, count)
        wait_for(lambda: client_state(broker.url)["next-sequence"] >= count, 60, 0.1, "in filled")
        job.start(crash_at=point, batch=1).wait_point(point)
        broker.kill()
        broker.start()
        job.release()  # the job goes on against the restarted broker, and fails or not
        job.wait()
        job.run_to_the_end()
        assert_once(broker.url, count)
    finally:
        job.stop()
        broker.stop()


@pytest.mark.parametrize("point", points(("staged",)))
def test_broker_killed_mid_batch_and_restarted_loses_and_repeats_nothing(streams, tmp_path, point):
    _broker_killed(streams, tmp_path, point, 300, 100)


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_broker_killed_mid_batch_of_a_million_messages_loses_and_repeats_nothing(
    streams, tmp_path, point
):
    _broker_killed(streams, tmp_path, point, 1_000_000, 250_000)
