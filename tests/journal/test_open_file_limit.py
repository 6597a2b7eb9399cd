"""A file journal whose process has no file descriptor left: like a full disk, the journal
refuses new records and tries again, and goes on once descriptors are freed.

Before, the EMFILE of its next file's creation failed the journal for good ("journal
failed; no more appends"): a storm of client sockets left a broker that stored nothing
until restarted. The descriptors are used up for real here: the soft limit is lowered to
what the process has open and the rest is opened on /dev/null.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Iterator
from pathlib import Path

from .helpers import load, wait_until
from .test_disk_full import (
    FILE,
    add_several_files,
    add_until_refused,
    open_on,
    use_the_last_spare,
)


@contextlib.contextmanager
def no_descriptor_left() -> Iterator[None]:
    """Every descriptor this process may open is open, until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
    held: list[int] = []
    try:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_no_descriptor_left_refuses_new_records_and_the_journal_goes_on(tmp_path: Path) -> None:
    journal = open_on(tmp_path / "journal")
    done: list[int] = []
    try:
        with no_descriptor_left():
            first = use_the_last_spare(journal, 1)
            more, reason = add_until_refused(journal, first[-1] + 1, done)
            assert "cannot open a new" in reason and "open-file limit" in reason, reason
            assert journal.stats()["no-room"]
        added = first + more
        # descriptors are back: the held writes complete, a spare is made, records go on
        wait_until(lambda: journal.stats()["no-room"] is None, what="room again")
        journal.flush()
        assert sorted(done) == more
        later = add_several_files(journal)
    finally:
        journal.stop()
    records = load(tmp_path / "journal", journal_file_size=FILE).records
    assert [r.id for r in records] == [*added, *later]
