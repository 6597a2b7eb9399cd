"""The file page store: a folder per address, page files that grow by appends.

`<paging-directory>/<safe address>-<hash>/` holds `address.txt` (the address, UTF-8) and
`%09d.page` files of framed records (`scow.core.page_frames`). The hash keeps apart
addresses whose safe forms are equal ("a/b" and "a:b"). Opening a store cuts a torn tail
off its last page (whatever follows its last valid record), so appends continue right
after it; a damaged frame with valid ones after it is left for the readers to pass over,
as in earlier pages.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from scow.core import disk_monitor
from scow.core.model import StorageFull
from scow.core.page_frames import crc32, frame_all, salvaged_frames, valid_length

log = structlog.get_logger("scow.paging")

ADDRESS_FILE = "address.txt"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_PAGE_NAME = re.compile(r"([0-9]+)\.page")
#: Characters of the safe form kept in a folder name: with the hash, well under NAME_MAX.
_SAFE_PREFIX = 100
# fdatasync is enough (it flushes the size too) where the OS has it
_fdatasync = getattr(os, "fdatasync", os.fsync)


def folder_name(address: str) -> str:
    """The folder of `address`'s pages: a filesystem-safe form plus 8 hex chars of its sha1."""
    digest = hashlib.sha1(address.encode("utf-8")).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', address)[:_SAFE_PREFIX]}-{digest}"


def _os_error(exc: OSError, path: Path | str, doing: str) -> OSError:
    """`exc` again, saying which file and what for (os.write and fsync errors name neither)."""
    return OSError(exc.errno, f"{path}: {doing}: {exc.strerror}")


def _existing(path: Path) -> Path:
    """`path` or its nearest existing parent."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _fsync_path(path: Path) -> None:
    """Flush a file, or a directory's entries (a new or removed file in it), to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _os_error(exc, path, "syncing") from exc


class FilePageStore:
    """The pages of one address as files; one thread writes, any thread may read."""

    def __init__(self, directory: Path, address: str, *, repair: bool = True) -> None:
        """Open (creating) the store; `repair` cuts a torn tail off the last page, which
        read-only tools leave alone (reads stop at it anyway)."""
        self.address = address
        self.folder = Path(directory) / folder_name(address)
        self._fd: int | None = None  # write fd of the highest page
        self._fd_page = -1
        self._size = 0  # bytes in the page behind _fd
        #: CRC-32 of those bytes, kept while this store wrote them all (for `appended`)
        self._crc: int | None = None
        self._unsynced = False  # written to _fd since its last fdatasync
        self._folder_unsynced = False  # a page file was created or removed since the last sync
        #: Set when a failed append could not be undone: appending after its torn bytes
        #: would write records that no read could reach.
        self._broken: str | None = None
        #: address.txt and the folders a new store made, in the order the first `sync`
        #: makes them durable (the file, then the directory entries).
        self._unsynced_paths: list[Path] = []
        self._open_folder()
        self._pages = self._list_pages()
        if self._pages and repair:
            self._cut_torn_tail(self._pages[-1])

    def _open_folder(self) -> None:
        """Make the folder and its address.txt unless they exist. Raises StorageFull when
        the file system has no room for them: nothing is stored then, and opening the
        store again once space returns finishes the job."""
        try:
            self._make_folder()
        except OSError as exc:
            if not disk_monitor.is_no_room(exc):
                raise
            raise StorageFull(
                f"page store of {self.address!r}: not stored: "
                + disk_monitor.describe_no_room(
                    _existing(self.folder), f"its page folder {self.folder} ({exc.strerror})"
                )
                + "; producers resume once space returns"
            ) from exc

    def _make_folder(self) -> None:
        """The folder and its address.txt, made with nothing that waits on the disk (the
        loop opens a store when an address starts paging, and a stalled disk must not
        stall it): the first `sync`, which precedes any record's being durable, syncs
        them."""
        marker = self.folder / ADDRESS_FILE
        created: list[Path] = []  # folders this store makes, whose parents then need a sync
        parent = self.folder
        while not parent.exists():
            created.append(parent)
            parent = parent.parent
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            stored = marker.read_text(encoding="utf-8") if marker.exists() else None
        except OSError as exc:
            raise _os_error(exc, marker, "opening the page store") from exc
        if not stored:  # none, or emptied by a crash before the sync that follows it
            self._write_marker(marker)
            # the folder's parent too when an earlier attempt made the folder and then
            # found no room for address.txt
            self._unsynced_paths = [marker, self.folder] + [
                new.parent for new in reversed(created or [self.folder])
            ]
        elif stored != self.address:
            raise FileExistsError(
                f"{marker}: holds the pages of address {stored!r}, not of {self.address!r}"
            )

    def _write_marker(self, marker: Path) -> None:
        # written aside and renamed, so discover() never reads a torn address
        tmp = marker.with_name(ADDRESS_FILE + ".tmp")
        try:
            tmp.write_bytes(self.address.encode("utf-8"))
            os.replace(tmp, marker)
        except OSError as exc:
            with contextlib.suppress(OSError):  # no half-written address left behind
                os.unlink(tmp)
            raise _os_error(exc, marker, "writing the address") from exc

    def _list_pages(self) -> list[int]:
        try:
            with os.scandir(self.folder) as entries:
                return sorted(
                    int(match[1])
                    for entry in entries
                    if (match := _PAGE_NAME.fullmatch(entry.name)) and entry.is_file()
                )
        except OSError as exc:
            raise _os_error(exc, self.folder, "listing pages") from exc

    def _cut_torn_tail(self, page: int) -> None:
        path = self._path(page)
        data = path.read_bytes()
        frames = salvaged_frames(data)[0]
        valid = frames[-1][2] if frames else 0
        if valid < len(data):
            os.truncate(path, valid)
            log.warning(
                "torn page tail cut",
                address=self.address,
                file=str(path),
                bytes_cut=len(data) - valid,
                bytes_kept=valid,
            )

    def _path(self, page: int) -> Path:
        return self.folder / f"{page:09d}.page"

    # ------------------------------------------------------------------ PageStore

    def page_numbers(self) -> list[int]:
        """Every page stored, in ascending order."""
        return list(self._pages)

    def append(self, page: int, records: Sequence[bytes]) -> int:
        """Append `records` to `page` with one write; returns the page's size in bytes."""
        if self._broken is not None:
            raise OSError(self._broken)
        opening = page != self._fd_page  # -1 while no page is open
        if opening:
            self._check_appendable(page)
        try:
            data = frame_all(records)
        except ValueError as exc:
            raise ValueError(f"page store of {self.address!r}, page {page}: {exc}") from None
        if opening:
            self._open_page(page)
        fd = self._fd
        assert fd is not None
        try:
            written = os.write(fd, data)
            while written < len(data):  # a short write: rare on a regular file, but allowed
                written += os.write(fd, memoryview(data)[written:])
        except OSError as exc:
            self._undo_torn_write(fd, page)
            raise _os_error(exc, self._path(page), f"appending {len(data)} bytes") from exc
        self._size += len(data)
        if self._crc is not None:
            self._crc = crc32(data, self._crc)
        self._unsynced = True
        return self._size

    def appended(self, page: int) -> tuple[int, int] | None:
        """(size, CRC-32 of all its bytes) of `page` when this store wrote it from its
        first byte and is still appending to it; None otherwise. What a closing page's
        index is sealed with (`scow.plugins.paging.index`): one CRC call per append,
        not a read of the page back."""
        if page != self._fd_page or self._crc is None:
            return None
        return self._size, self._crc

    def _check_appendable(self, page: int) -> None:
        if page < 0:
            raise ValueError(
                f"page store of {self.address!r}: page {page} is negative; pages count from 0"
            )
        if self._pages and page < self._pages[-1]:
            raise ValueError(
                f"page store of {self.address!r}: cannot append to page {page}; "
                f"only page {self._pages[-1]} (the highest) or a higher one takes appends"
            )

    def _open_page(self, page: int) -> None:
        if not self._pages or page > self._pages[-1]:
            # a new page file: the disk monitor checks now, with room for one more page
            # as large as the last (not only at its next scan)
            disk_monitor.allocating(self.folder, self._size)
        self._close_fd()
        path = self._path(page)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise _os_error(exc, path, "opening the page for appends") from exc
        self._fd = fd
        self._fd_page = page
        self._size = os.fstat(fd).st_size
        self._crc = 0 if self._size == 0 else None
        if not self._pages or self._pages[-1] != page:
            self._pages.append(page)
            self._folder_unsynced = True

    def _undo_torn_write(self, fd: int, page: int) -> None:
        """Cut what a failed append wrote, so later appends follow the last whole record."""
        try:
            os.ftruncate(fd, self._size)
        except OSError as exc:
            self._broken = (
                f"{self._path(page)}: an append failed and its partial frame could not be cut "
                f"({exc.strerror}); reopen the store to cut it"
            )

    def _close_fd(self) -> None:
        fd, page, self._fd, self._fd_page = self._fd, self._fd_page, None, -1
        if fd is None:
            return
        try:
            if self._unsynced:
                self._unsynced = False
                started = time.monotonic()
                _fdatasync(fd)
                disk_monitor.synced(f"pages of {self.address!r}", started)
        except OSError as exc:
            raise _os_error(exc, self._path(page), "syncing before closing") from exc
        finally:
            os.close(fd)

    def sync(self) -> None:
        """fdatasync the page written since the last sync, then the folder if it changed
        (with, the first time, the address.txt and the folders the store made)."""
        started = time.monotonic()
        if self._unsynced and self._fd is not None:
            try:
                _fdatasync(self._fd)
            except OSError as exc:
                raise _os_error(exc, self._path(self._fd_page), "syncing") from exc
            self._unsynced = False
        if self._folder_unsynced and not self._unsynced_paths:
            self._unsynced_paths.append(self.folder)
        while self._unsynced_paths:
            _fsync_path(self._unsynced_paths[0])
            del self._unsynced_paths[0]
        self._folder_unsynced = False
        disk_monitor.synced(f"pages of {self.address!r}", started)

    def read(self, page: int, offset: int = 0) -> bytes:
        """The page's valid frames from `offset`; a half-written append is left out."""
        data = self.read_unchecked(page, offset)
        end = valid_length(data)
        return data if end == len(data) else data[:end]

    def read_unchecked(self, page: int, offset: int = 0) -> bytes:
        """The page's bytes from `offset` as they are on disk, with one pread: `read`
        less the check of each frame, for a reader that checks frames as it parses
        them (the paging cursor), so each page is walked once, not twice."""
        if offset < 0:
            raise ValueError(f"page store of {self.address!r}: read offset {offset} is negative")
        path = self._path(page)
        fd = self._open_to_read(path)
        if fd is None:
            return b""
        try:
            want = os.fstat(fd).st_size - offset
            if want <= 0:
                return b""
            data = os.pread(fd, want, offset)
            if 0 < len(data) < want:  # one pread returns at most ~2 GiB on Linux
                parts = [data]
                got = len(data)
                while got < want and (more := os.pread(fd, want - got, offset + got)):
                    parts.append(more)
                    got += len(more)
                data = b"".join(parts)
        except OSError as exc:
            raise _os_error(exc, path, f"reading from byte {offset}") from exc
        finally:
            os.close(fd)
        return data

    @staticmethod
    def _open_to_read(path: Path) -> int | None:
        """A read-only descriptor of a page file; None if there is no such page."""
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(exc, path, "opening the page to read") from exc

    def delete(self, page: int) -> None:
        """Remove a page file; a missing one is fine. The folder and address.txt stay."""
        if page == self._fd_page and self._fd is not None:
            self._unsynced = False  # its writes go with it
            self._close_fd()
        path = self._path(page)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _os_error(exc, path, "deleting the page") from exc
        else:
            self._folder_unsynced = True
        if page in self._pages:
            self._pages.remove(page)

    def close(self) -> None:
        """Sync what is unsynced and close the write fd; idempotent."""
        try:
            self.sync()
        finally:
            self._close_fd()


def open_store(directory: Path, address: str, settings: Mapping[str, Any]) -> FilePageStore:
    """The `file` backend's factory; the file store takes no settings."""
    return FilePageStore(directory, address)


def discover(directory: Path, settings: Mapping[str, Any]) -> list[str]:
    """Addresses with a store under `directory`, read from each folder's address.txt, sorted.

    A folder whose address.txt is missing or names another folder is skipped (with a
    warning when it holds pages), since opening that address would not find it.
    """
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except FileNotFoundError:
        return []
    addresses = []
    for entry in entries:
        if not entry.is_dir():
            continue
        folder = Path(entry.path)
        try:
            address: str | None = (folder / ADDRESS_FILE).read_text(encoding="utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            address = None
        if address is not None and folder_name(address) == entry.name:
            addresses.append(address)
        elif any(_PAGE_NAME.fullmatch(name) for name in os.listdir(folder)):
            log.warning(
                "page folder skipped: its address.txt is missing or names another folder",
                folder=str(folder),
                address=address,
            )
    return sorted(addresses)
