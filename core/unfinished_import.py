"""An import is all or nothing: a target it did not finish is emptied, or marked unusable.

`scow data import` checks its whole file before writing (see `scow.core.export`), but the
target can still refuse a line while it is written (a full disk, a database constraint,
a lost server). `all_or_nothing` then empties the target with the `discard` its caller
gives (what empties that store: journal, page, large message and stream files, or every
table of a database) so that the next import finds it empty again.

While an import writes, `<data-dir>/import-<journal>.unfinished` says so (one per journal
backend: a data dir can hold a broker's files while an import into a database that names
it as its data dir runs). It is synced before the first line is written and removed once
the import is complete (or undone), so an import killed with SIGKILL leaves it behind: a
broker on that journal refuses such a data dir (`check_finished`), and the next import
into it empties it first.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path


def marker(data_dir: Path, journal: str) -> Path:
    """The file saying that an import into the store of `journal` (`[broker] journal`, as
    resolved) under `data_dir` has not finished."""
    return Path(data_dir) / f"import-{journal}.unfinished"


class UnfinishedImport(Exception):
    """The data dir holds what an import left when it was cut short: not a broker's data."""


class ImportUndone(Exception):
    """A write the import's target refused; the message says what, and what became of it."""


def check_finished(data_dir: Path, journal: str) -> None:
    """UnfinishedImport when an import into the store of `journal` under `data_dir`
    began and never finished."""
    path = marker(data_dir, journal)
    try:
        what = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return
    raise UnfinishedImport(
        f"data dir {Path(data_dir).resolve()} holds an import that did not finish ({what}; "
        f"{path.name} says so): run that `scow data import` again (it empties its target "
        "first), or empty the target and remove that file"
    )


@contextlib.contextmanager
def all_or_nothing(
    data_dir: Path, journal: str, source: Path, discard: Callable[[], None]
) -> Iterator[Callable[[], None]]:
    """Run an import into the store of `journal` under `data_dir`, all or nothing.

    Yields `begin`, which the import calls once its checks passed, before its first
    write (a file refused by its checks touches nothing, so nothing is discarded).
    Leftovers of an import cut short are discarded first. The body must stop the store
    before it ends (the discard runs on a stopped store; see `stopping`). A failure
    after `begin` raises ImportUndone saying what failed and that nothing was imported,
    once `discard()` emptied the target; if that fails too, the marker stays and the
    error says so.
    """
    data_dir = Path(data_dir)
    path = marker(data_dir, journal)
    if path.exists():
        try:
            discard()
        except Exception as exc:
            raise UnfinishedImport(
                f"data dir {data_dir.resolve()} holds an import that did not finish, and "
                f"emptying what it left failed: {first_line(exc)}"
            ) from exc
        _remove(path)
    begun = False

    def begin() -> None:
        nonlocal begun
        _write(path, f"import of {source} by pid {os.getpid()}")
        begun = True

    try:
        yield begin
    except (Exception, KeyboardInterrupt) as exc:  # Ctrl-C included: nothing half done
        if not begun:
            raise
        failure = first_line(exc)
        try:
            discard()
        except Exception as undo:
            raise ImportUndone(
                f"{failure}; emptying the target failed too ({first_line(undo)}): it holds "
                f"part of the import, and {path} keeps a broker off it; run the import "
                "again once the target works: it empties it first"
            ) from exc
        _remove(path)
        raise ImportUndone(f"{failure}; nothing was imported: the target is empty again") from exc
    if begun:
        _remove(path)


def first_line(error: BaseException) -> str:
    """What a store said, without the statement and parameters a database error adds."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


@contextlib.contextmanager
def stopping(*closes: Callable[[], None]) -> Iterator[None]:
    """Run every one of `closes` (what stops an import's stores) at the end, in order.
    After a failure their own errors are dropped (the failure says what went wrong; these
    follow from it); otherwise the first one is raised once all ran."""
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        errors: list[Exception] = []
        for close in closes:
            try:
                close()
            except Exception as exc:
                errors.append(exc)
        if errors and not failed:
            raise errors[0]


def _write(path: Path, text: str) -> None:
    """`path` holding `text`, on disk (file and directory entry) before it returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{text}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_directory(path.parent)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
