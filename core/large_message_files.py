"""Large message bodies as files: `<data-dir>/large-messages/<id>.msg`, one per message.

The store every journal without one of its own uses (the file journal's, the memory
journal's). A write lands in the page cache at memory speed, so arrivals write on the
event loop; what waits on the disk (the sync, the unlink of a large file) runs on the
store's threads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from scow.core.large_messages import (
    DEFAULT_DIRECTORY,
    READ_CHUNK,
    Arrival,
    Chunks,
    LargeBody,
    LargeMessageStore,
    Wake,
)

if TYPE_CHECKING:
    from scow.core.config import Config
    from scow.core.descriptors import LargeMessageStoreBackend

log = structlog.get_logger("scow.large")

_SUFFIX = ".msg"
#: Threads that sync and delete files: each sync also commits its file's creation, and
#: several in flight let the file system commit them together.
SYNC_THREADS = 4


class FileArrival(Arrival):
    """A large message arriving into a file of its own."""

    __slots__ = ("fd",)

    store: FileLargeMessageStore

    def __init__(self, store: FileLargeMessageStore, file_id: int) -> None:
        self.fd = os.open(store.path_of(file_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        super().__init__(store, file_id)

    def write(self, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.written += n

    def overwrite(self, offset: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, offset)
            view = view[n:]
            offset += n

    def _finish(self, body: LargeBody, sync: bool) -> None:
        fd, self.fd = self.fd, -1
        if not sync:
            os.close(fd)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # an offline tool (`scow data import`): synced here
            _sync_and_close(fd)
            return
        body.synced = False

        def synced(_future: object) -> None:
            loop.call_soon_threadsafe(body._now_synced)

        self.store.executor().submit(_sync_and_close, fd).add_done_callback(synced)

    def _discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.store.path_of(self.file_id).unlink(missing_ok=True)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:  # removed as an orphan at the next start
        log.warning("large message file not deleted", path=str(path), reason=str(exc))


def _sync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path, start: int, length: int) -> Generator[bytes]:
    # from the page cache, usually: fast enough to read on the loop as a delivery needs it
    fd = os.open(path, os.O_RDONLY)
    try:
        offset = start
        while offset < length:
            chunk = os.pread(fd, min(READ_CHUNK, length - offset), offset)
            if not chunk:
                raise OSError(f"large message file {path}: ends at {offset} of {length} bytes")
            offset += len(chunk)
            yield chunk
    finally:
        os.close(fd)


class FileLargeMessageStore(LargeMessageStore):
    """The directory of large message files of one broker."""

    def __init__(self, directory: Path, *, sync: bool) -> None:
        super().__init__(sync=sync)
        self.directory = directory
        self._executor: ThreadPoolExecutor | None = None
        self._made = False

    def path_of(self, file_id: int) -> Path:
        return self.directory / f"{file_id}{_SUFFIX}"

    def describe(self, file_id: int) -> str:
        return f"file {self.path_of(file_id)}"

    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="scow-large")
        return self._executor

    def begin(self, file_id: int) -> FileArrival:
        if not self._made:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._made = True
        return FileArrival(self, file_id)

    def read(self, body: LargeBody, start: int, wake: Wake | None) -> Chunks:
        return _read(self.path_of(body.file_id), start, body.length)

    def _found(self, file_id: int, length: int) -> bool:
        try:
            return self.path_of(file_id).stat().st_size >= length
        except FileNotFoundError:
            return False

    def _delete(self, body: LargeBody) -> None:
        # unlinking a large file can take milliseconds: on the store's threads
        self.executor().submit(_unlink, self.path_of(body.file_id))

    def _delete_all_but(self, kept: set[int]) -> int:
        if not self.directory.is_dir():
            return 0
        removed = 0
        for path in self.directory.iterdir():
            stem = path.name.removesuffix(_SUFFIX)
            if path.name.endswith(_SUFFIX) and stem.isdigit() and int(stem) in kept:
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
        return removed

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def configured_store(
    backends: Mapping[str, LargeMessageStoreBackend],
    config: Config,
    journal: str,
    *,
    persistent: bool,
) -> LargeMessageStore:
    """The store of a broker's large message bodies: the backend named like its journal
    (`journal`: `[broker] journal` resolved, "" without persistence), else files under
    `[broker] large-messages-directory` (see `LargeMessageStoreBackend` for why the
    journal decides)."""
    broker = config.section("broker")
    data_dir = Path(str(broker.get("data-dir", "./data")))
    sync = persistent and bool(broker.get("large-message-sync", True))
    backend = backends.get(journal)
    if backend is None:
        directory = str(broker.get("large-messages-directory", DEFAULT_DIRECTORY))
        return FileLargeMessageStore(data_dir / directory, sync=sync)
    section = backend.config_section
    settings = config.section(section) if section in config.section_names else {}
    return backend.factory(data_dir, settings, sync)
