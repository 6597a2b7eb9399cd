"""A fatal error in C code (proton, the C library) leaves the broker's Python stack in its
log, so that a crash a user meets once can be traced to the line that caused it."""

from __future__ import annotations

import signal


def test_a_segmentation_fault_leaves_every_threads_python_stack_in_the_log(
    scow_broker_process, tmp_path
):
    broker = scow_broker_process()
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGSEGV)
    broker.proc.wait(20)
    assert broker.proc.returncode == -signal.SIGSEGV
    log = broker.log_path.read_text(errors="replace")
    assert "Fatal Python error: Segmentation fault" in log
    assert "most recent call first" in log
    assert "Current thread" in log and 'File "' in log, log[-2000:]
