"""The sparse offset index of one segment: offset -> position in the `.log` file.

File `<20-digit base offset>.index`, append-only, a sequence of 8-byte entries,
big-endian::

    offset  size  field
         0     4  relative offset   int32, batch base offset minus the segment base offset
         4     4  position          int32, byte position of that batch in the .log file

An entry is added for the first batch written after more than `index.interval.bytes`
bytes since the previous entry, so entries are sparse and strictly increase in both
fields. A lookup finds the largest entry <= the target (a bisect on the in-memory
copy) and the segment scans batch headers forward from there.

The index is derived data: it is flushed with its segment, and whenever it is found
inconsistent (length not a multiple of 8, entries not increasing, a position past the
end of the log, an entry that does not point at a batch starting at its offset) the
segment rebuilds it from the log.
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array
from collections.abc import MutableSequence
from pathlib import Path

from broker.storage.errors import CorruptIndexError
from broker.storage.file_handles import FileHandleCache
from broker.storage.index_file import IndexFile
from protocol.invariants import InvariantError

ENTRY_SIZE = 8
_ENTRY = struct.Struct(">ii")
INT32_MAX = 2**31 - 1


class OffsetIndex(IndexFile):
    """One `.index` file, mirrored in two int32 arrays."""

    def __init__(
        self, path: Path, base_offset: int, handles: FileHandleCache | None = None
    ) -> None:
        super().__init__(path, base_offset, ENTRY_SIZE, handles)
        pairs = array("i")
        pairs.frombytes(self._raw_entries)
        del self._raw_entries
        if sys.byteorder == "little":
            pairs.byteswap()
        self._relative_offsets = pairs[0::2]
        self._positions = pairs[1::2]

    def _columns(self) -> tuple[MutableSequence[int], MutableSequence[int]]:
        return self._relative_offsets, self._positions

    @property
    def entries(self) -> list[tuple[int, int]]:
        """(absolute offset, position) of every entry."""
        base = self.base_offset
        return [(base + r, p) for r, p in zip(self._relative_offsets, self._positions, strict=True)]

    @property
    def last_entry(self) -> tuple[int, int]:
        """The last entry, or (base offset, 0) when the index is empty."""
        if not self._relative_offsets:
            return self.base_offset, 0
        return self.base_offset + self._relative_offsets[-1], self._positions[-1]

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the largest entry <= offset, else (base offset, 0)."""
        relative = offset - self.base_offset
        if relative < 0:
            return self.base_offset, 0
        index = bisect.bisect_right(self._relative_offsets, min(relative, INT32_MAX)) - 1
        if index < 0:
            return self.base_offset, 0
        return self.base_offset + self._relative_offsets[index], self._positions[index]

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        if not 0 <= relative <= INT32_MAX:
            raise InvariantError(f"relative offset {relative} out of int32 range")
        if not 0 <= position <= INT32_MAX:
            raise InvariantError(f"position {position} out of int32 range")
        if self._relative_offsets:
            if relative <= self._relative_offsets[-1]:
                raise InvariantError(
                    f"index offsets must strictly increase: {offset} after "
                    f"{self.base_offset + self._relative_offsets[-1]} in {self.path}"
                )
            if position <= self._positions[-1]:
                raise InvariantError(f"index positions must increase: {self.path}")
        self._write_entry(_ENTRY.pack(relative, position))
        self._relative_offsets.append(relative)
        self._positions.append(position)
        self._file_size += ENTRY_SIZE

    def truncate_to(self, offset: int) -> None:
        """Remove every entry for an offset >= `offset`."""
        keep = bisect.bisect_left(self._relative_offsets, max(0, offset - self.base_offset))
        self._truncate_entries(keep)

    def reset(self) -> None:
        """Remove every entry (before a rebuild)."""
        self._truncate_entries(0)

    def sanity_check(self, log_size: int) -> None:
        """Raise CorruptIndexError unless the file is structurally sound."""
        if self._file_size % ENTRY_SIZE:
            raise CorruptIndexError(
                f"index file {self.path} is {self._file_size} bytes, not a multiple of {ENTRY_SIZE}"
            )
        previous = (-1, -1)
        for relative, position in zip(self._relative_offsets, self._positions, strict=True):
            if relative <= previous[0] or position <= previous[1]:
                raise CorruptIndexError(
                    f"index file {self.path} has entry ({relative}, {position}) "
                    f"not above the previous one {previous}"
                )
            previous = (relative, position)
        if self._positions and self._positions[-1] >= log_size:
            raise CorruptIndexError(
                f"index file {self.path} points at position {self._positions[-1]} "
                f"past the end of its {log_size}-byte log"
            )
