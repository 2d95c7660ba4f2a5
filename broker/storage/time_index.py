"""The sparse time index of one segment: timestamp -> offset.

File `<20-digit base offset>.timeindex`, append-only, a sequence of 12-byte entries,
big-endian::

    offset  size  field
         0     8  timestamp         int64, the largest batch max_timestamp seen so far
         8     4  relative offset   int32, base offset (minus the segment base) of the
                                    batch where that timestamp was first reached

Entries are written at the same moments as offset index entries, only when the
timestamp grew, plus one final entry with the segment's largest timestamp when the
segment is rolled or closed. Timestamps strictly increase; offsets never decrease.

Because an entry names the batch where its timestamp was FIRST reached, every batch
before that offset has a smaller max timestamp. `lookup(ts)` therefore returns the
offset of the last entry whose timestamp is <= ts: the first batch whose
max_timestamp >= ts is at or after it (a conservative start for the segment's scan).

Derived data like the offset index: rebuilt from the log when inconsistent.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import MutableSequence
from pathlib import Path

from broker.storage.errors import CorruptIndexError
from broker.storage.file_handles import FileHandleCache
from broker.storage.index_file import IndexFile
from broker.storage.offset_index import INT32_MAX
from protocol.invariants import InvariantError

ENTRY_SIZE = 12
_ENTRY = struct.Struct(">qi")


class TimeIndex(IndexFile):
    """One `.timeindex` file, mirrored in two lists."""

    def __init__(
        self, path: Path, base_offset: int, handles: FileHandleCache | None = None
    ) -> None:
        super().__init__(path, base_offset, ENTRY_SIZE, handles)
        self._timestamps: list[int] = []
        self._relative_offsets: list[int] = []
        for timestamp, relative in _ENTRY.iter_unpack(self._raw_entries):
            self._timestamps.append(timestamp)
            self._relative_offsets.append(relative)
        del self._raw_entries

    def _columns(self) -> tuple[MutableSequence[int], MutableSequence[int]]:
        return self._timestamps, self._relative_offsets

    @property
    def entries(self) -> list[tuple[int, int]]:
        """(timestamp, absolute offset) of every entry."""
        base = self.base_offset
        return [
            (t, base + r) for t, r in zip(self._timestamps, self._relative_offsets, strict=True)
        ]

    @property
    def last_entry(self) -> tuple[int, int]:
        """The last entry, or (-1, base offset) when the index is empty."""
        if not self._timestamps:
            return -1, self.base_offset
        return self._timestamps[-1], self.base_offset + self._relative_offsets[-1]

    def lookup(self, timestamp: int) -> int:
        """Offset to start scanning from for the first batch with max_timestamp >= ts."""
        index = bisect.bisect_right(self._timestamps, timestamp) - 1
        if index < 0:
            return self.base_offset
        return self.base_offset + self._relative_offsets[index]

    def maybe_append(self, timestamp: int, offset: int) -> bool:
        """Append (timestamp, offset) if the timestamp is larger than the last one."""
        if timestamp < 0 or (self._timestamps and timestamp <= self._timestamps[-1]):
            return False
        relative = offset - self.base_offset
        if not 0 <= relative <= INT32_MAX:
            raise InvariantError(f"relative offset {relative} out of int32 range")
        if self._relative_offsets and relative < self._relative_offsets[-1]:
            raise InvariantError(f"time index offsets must not decrease: {offset} in {self.path}")
        self._write_entry(_ENTRY.pack(timestamp, relative))
        self._timestamps.append(timestamp)
        self._relative_offsets.append(relative)
        self._file_size += ENTRY_SIZE
        return True

    def truncate_to(self, offset: int) -> None:
        """Remove every entry for an offset >= `offset`."""
        relative = max(0, offset - self.base_offset)
        keep = bisect.bisect_left(self._relative_offsets, relative)
        self._truncate_entries(keep)

    def reset(self) -> None:
        self._truncate_entries(0)

    def sanity_check(self, next_offset: int) -> None:
        """Raise CorruptIndexError unless the entries are well-formed and point below
        `next_offset`, the segment's end."""
        if self._file_size % ENTRY_SIZE:
            raise CorruptIndexError(
                f"time index file {self.path} is {self._file_size} bytes, "
                f"not a multiple of {ENTRY_SIZE}"
            )
        previous = (-1, 0)
        for timestamp, relative in zip(self._timestamps, self._relative_offsets, strict=True):
            if timestamp <= previous[0] or relative < previous[1]:
                raise CorruptIndexError(
                    f"time index file {self.path} has entry ({timestamp}, {relative}) "
                    f"out of order after {previous}"
                )
            previous = (timestamp, relative)
        if self._relative_offsets and self.base_offset + self._relative_offsets[-1] >= next_offset:
            raise CorruptIndexError(
                f"time index file {self.path} points at offset "
                f"{self.base_offset + self._relative_offsets[-1]}, past the segment end "
                f"{next_offset}"
            )
