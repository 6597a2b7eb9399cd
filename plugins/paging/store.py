"""The file page store: a folder per address, page files that grow by appends.

`<paging-directory>/<safe address>-<hash>/` holds `address.txt` (the address) and
`%09d.page` files of framed records. Opening a store cuts a torn or corrupt tail off its
last page, so appends continue after the last valid record.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from scow.core.page_frames import frame_all, valid_length

log = structlog.get_logger("scow.paging")

ADDRESS_FILE = "address.txt"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def folder_name(address: str) -> str:
    digest = hashlib.sha1(address.encode()).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', address)[:100]}-{digest}"


def _page_file(folder: Path, page: int) -> Path:
    return folder / f"{page:09d}.page"


class FilePageStore:
    """The pages of one address as files."""

    def __init__(self, directory: Path, address: str) -> None:
        self.address = address
        self.folder = directory / folder_name(address)
        self.folder.mkdir(parents=True, exist_ok=True)
        marker = self.folder / ADDRESS_FILE
        if not marker.exists():
            marker.write_text(address, encoding="utf-8")
        self._pages = sorted(int(p.stem) for p in self.folder.glob("*.page") if p.stem.isdigit())
        self._fd: int | None = None
        self._fd_page = 0
        self._dirty = False
        self._dir_dirty = True
        if self._pages:
            self._repair(self._pages[-1])

    def _repair(self, page: int) -> None:
        path = _page_file(self.folder, page)
        data = path.read_bytes()
        valid = valid_length(data)
        if valid < len(data):
            os.truncate(path, valid)
            log.warning("torn page tail cut", file=str(path), bytes_cut=len(data) - valid)

    def page_numbers(self) -> list[int]:
        return list(self._pages)

    def append(self, page: int, records: Sequence[bytes]) -> int:
        if not all(records):
            raise ValueError(f"{self.folder}: page {page}: an empty record cannot be stored")
        if self._pages and page < self._pages[-1]:
            raise ValueError(
                f"{self.folder}: cannot append to page {page}; page {self._pages[-1]} is open"
            )
        if self._fd is None or self._fd_page != page:
            self._close_fd()
            path = _page_file(self.folder, page)
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            except OSError as exc:
                raise OSError(exc.errno, f"{path}: {exc.strerror}") from exc
            self._fd_page = page
            if not self._pages or self._pages[-1] != page:
                self._pages.append(page)
                self._dir_dirty = True
        os.write(self._fd, frame_all(records))
        self._dirty = True
        return os.fstat(self._fd).st_size

    def _close_fd(self) -> None:
        if self._fd is not None:
            if self._dirty:
                os.fdatasync(self._fd)
                self._dirty = False
            os.close(self._fd)
            self._fd = None

    def sync(self) -> None:
        if self._fd is not None and self._dirty:
            os.fdatasync(self._fd)
            self._dirty = False
        if self._dir_dirty:
            fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._dir_dirty = False

    def read(self, page: int, offset: int = 0) -> bytes:
        try:
            with open(_page_file(self.folder, page), "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return b""
        return data[: valid_length(data)]

    def delete(self, page: int) -> None:
        if page == self._fd_page and self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._dirty = False
        _page_file(self.folder, page).unlink(missing_ok=True)
        if page in self._pages:
            self._pages.remove(page)
        self._dir_dirty = True

    def close(self) -> None:
        self._close_fd()


def open_store(directory: Path, address: str, settings: Mapping[str, Any]) -> FilePageStore:
    return FilePageStore(directory, address)


def discover(directory: Path, settings: Mapping[str, Any]) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(
        (d / ADDRESS_FILE).read_text(encoding="utf-8")
        for d in directory.iterdir()
        if (d / ADDRESS_FILE).is_file()
    )
