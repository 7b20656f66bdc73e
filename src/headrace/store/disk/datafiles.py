"""A container's segment data files: the open descriptors, and making the files.

A segment's bytes are held contiguously in its data file: offset N is at file
position N, with no header or framing (``docs/storage-format.md#data-file``),
so a read is a ``pread`` and a catch-up read can go out with ``sendfile``. Its
checksums are beside it, in the segment's sidecar.

Both files are made (``create_segment_files``) before the CREATE record that
names them is issued, so a creation that fails leaves no record to undo. A
crash can leave files whose CREATE never became durable, and bytes past what
the WAL knows; recovery removes the first and cuts the second
(``recovery.py``). The data files are written through the group commit
(``commit.py``), which syncs those holding APPEND_REF bytes with each WAL
sync; a checkpoint syncs every one written since the last (``checkpoint.py``).

``DataFiles`` keeps the open descriptors, an LRU by segment id. A write that
the container's sync thread runs pins the descriptors it uses: one evicted or
forgotten (a delete) meanwhile is closed only when that write is done.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable

from headrace.errors import CorruptionError, StoreError
from headrace.store.disk.format import encode_sidecar_header
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import FILE_MODE

__all__ = ["DataFiles", "create_segment_files"]


class DataFiles:
    """Open data files of a container's segments, by segment id (an LRU of fds).

    Out of descriptors (EMFILE, ENFILE) when opening one, it closes the least
    recently used files it holds and tries again, so the store goes on with
    fewer open files rather than failing; with none left to close it raises
    ``StoreError`` saying so.
    """

    def __init__(self, paths: ContainerPaths, max_open: int) -> None:
        self.paths = paths
        self.max_open = max_open
        """Data files kept open at most (``container.MAX_OPEN_DATA_FILES``)."""
        self._fds: dict[int, int] = {}
        self._pins: dict[int, int] = {}
        """fd -> writes in the sync thread that use it: such an fd is not closed..."""
        self._retired: set[int] = set()
        """...until the last of them is done, even if evicted or forgotten meanwhile."""

    def fd(self, segment_id: int) -> int:
        fd = self._fds.pop(segment_id, None)
        if fd is None:
            self._make_room()
            path = self.paths.data(segment_id)
            fd = self._opening(lambda: os.open(path, os.O_RDWR))
        self._fds[segment_id] = fd
        return fd

    def _make_room(self) -> None:
        while self._fds and len(self._fds) >= self.max_open:
            self._close(self._fds.pop(next(iter(self._fds))))

    def _opening(self, open_fd: Callable[[], int]) -> int:
        """``open_fd()``, closing cached files to make room while the process is
        out of descriptors."""
        while True:
            try:
                return open_fd()
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                if not self._fds:
                    raise StoreError(
                        f"out of file descriptors: cannot open a data file ({exc.strerror}); "
                        "raise the open-file limit (ulimit -n)"
                    ) from exc
                count = max(1, len(self._fds) // 2)
                for _ in range(count):
                    self._close(self._fds.pop(next(iter(self._fds))))

    def pin(self, segment_id: int) -> int:
        """The segment's fd, kept open until ``unpin`` (for a write in another thread)."""
        fd = self.fd(segment_id)
        self._pins[fd] = self._pins.get(fd, 0) + 1
        return fd

    def unpin(self, fds: list[int]) -> None:
        for fd in fds:
            count = self._pins[fd] - 1
            if count:
                self._pins[fd] = count
                continue
            del self._pins[fd]
            if fd in self._retired:
                self._retired.discard(fd)
                os.close(fd)

    def _close(self, fd: int) -> None:
        if fd in self._pins:
            self._retired.add(fd)
        else:
            os.close(fd)

    def create(self, segment_id: int) -> None:
        self.forget(segment_id)
        self._make_room()
        self._fds[segment_id] = self._opening(
            functools.partial(create_segment_files, self.paths, segment_id)
        )

    def forget(self, segment_id: int) -> None:
        fd = self._fds.pop(segment_id, None)
        if fd is not None:
            self._close(fd)

    def open_reader(self, segment_id: int) -> int:
        """A new read-only descriptor of the segment's data file, for the caller to close.

        Not from the cache: a zero-copy send may outlive a cached descriptor
        (closed when the cache is full or the segment is deleted), and has a
        file position of its own.
        """
        path = self.paths.data(segment_id)
        return self._opening(lambda: os.open(path, os.O_RDONLY | os.O_CLOEXEC))

    def pread(self, segment_id: int, offset: int, count: int) -> bytes:
        fd = self.fd(segment_id)
        data = os.pread(fd, count, offset)
        while len(data) < count:
            more = os.pread(fd, count - len(data), offset + len(data))
            if not more:
                path = self.paths.data(segment_id)
                raise CorruptionError(str(path), offset + len(data), "data file ends early")
            data += more
        return data

    def close(self) -> None:
        for fd in [*self._fds.values(), *self._retired]:
            os.close(fd)
        self._fds.clear()
        self._retired.clear()
        self._pins.clear()


def create_segment_files(paths: ContainerPaths, segment_id: int, *, empty_data: bool = True) -> int:
    """Create (or reset) a segment's data file and sidecar; return the data file's fd.

    ``empty_data=False`` (replaying a CREATE) keeps an existing data file's
    bytes: APPEND_REF records after the CREATE refer to them; recovery cuts
    the file to the replayed length afterwards.
    """
    fd = os.open(paths.sidecar(segment_id), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        header = encode_sidecar_header(segment_id)
        os.pwrite(fd, header, 0)
    finally:
        os.close(fd)
    flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if empty_data else 0)
    return os.open(paths.data(segment_id), flags, FILE_MODE)
