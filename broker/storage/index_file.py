"""What the two index files of a segment share (formats in offset_index.py and
time_index.py): an append-only file of fixed-size big-endian entries, mirrored in
memory in two columns, cut back by whole entries. The descriptor is the file-handle
cache's (file_handles.py): read once when the index is loaded, then opened only to
append, cut or fsync.
"""

from __future__ import annotations

import os
from collections.abc import MutableSequence
from pathlib import Path

from broker.storage.file_handles import SHARED_FILE_HANDLES
from broker.storage.file_handles import CachedFile
from broker.storage.file_handles import FileHandleCache
from runtime.fileio import read_all
from runtime.fileio import write_all

# Created when missing (a segment whose indexes are rebuilt), appended at the end.
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND


class IndexFile:
    """One index file of `entry_size`-byte entries; subclasses parse the entries."""

    def __init__(
        self, path: Path, base_offset: int, entry_size: int, handles: FileHandleCache | None
    ) -> None:
        self.path = Path(path)
        self.base_offset = base_offset
        self._entry_size = entry_size
        self.handle: CachedFile = (handles or SHARED_FILE_HANDLES).lazy(self.path, _OPEN_FLAGS)
        try:
            with self.handle as fd:
                raw = read_all(fd)
        except BaseException:
            self.handle.close()
            raise
        self._file_size = len(raw)
        # Whole entries only: a torn last entry is left for sanity_check to refuse.
        self._raw_entries = raw[: len(raw) - len(raw) % entry_size]

    def _columns(self) -> tuple[MutableSequence[int], MutableSequence[int]]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._columns()[0])

    def flush(self) -> None:
        with self.handle as fd:
            os.fsync(fd)

    def close(self) -> None:
        self.handle.close()

    def _write_entry(self, entry: bytes) -> None:
        with self.handle as fd:
            write_all(fd, entry)

    def delete(self) -> None:
        """Close and remove the file (a missing file is fine)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def _truncate_entries(self, keep: int) -> None:
        first, second = self._columns()
        size = keep * self._entry_size
        if keep == len(first) and self._file_size == size:
            return
        with self.handle as fd:
            os.ftruncate(fd, size)
        del first[keep:]
        del second[keep:]
        self._file_size = size
