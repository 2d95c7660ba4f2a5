"""What the two index files of a segment share (formats in offset_index.py and
time_index.py): an append-only file of fixed-size big-endian entries, kept open for
appends and mirrored in memory in two columns, cut back by whole entries.
"""

from __future__ import annotations

import os
from collections.abc import MutableSequence
from pathlib import Path

from runtime.fileio import read_all


class IndexFile:
    """One index file of `entry_size`-byte entries; subclasses parse the entries."""

    def __init__(self, path: Path, base_offset: int, entry_size: int) -> None:
        self.path = Path(path)
        self.base_offset = base_offset
        self._entry_size = entry_size
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        raw = read_all(self._fd)
        self._file_size = len(raw)
        # Whole entries only: a torn last entry is left for sanity_check to refuse.
        self._raw_entries = raw[: len(raw) - len(raw) % entry_size]

    def _columns(self) -> tuple[MutableSequence[int], MutableSequence[int]]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._columns()[0])

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Close and remove the file (a missing file is fine)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def _truncate_entries(self, keep: int) -> None:
        first, second = self._columns()
        size = keep * self._entry_size
        if keep == len(first) and self._file_size == size:
            return
        os.ftruncate(self._fd, size)
        del first[keep:]
        del second[keep:]
        self._file_size = size
