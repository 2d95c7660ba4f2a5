"""The `.log` file of a segment, as Kafka's FileRecords: record batches on disk.

Format: a concatenation of Kafka RecordBatch v2 batches exactly as they travel on the
wire (layout in protocol/record_batch.py), with no file header, no padding and no
trailer. The broker writes and reads whole batches and only ever looks at their
61-byte headers. Appends go through an O_APPEND descriptor; a failed write is cut
back so no partial batch is left for readers (recovery would cut it anyway). Reads
use os.pread, so they need no seek and no lock. The descriptor is the file-handle
cache's (file_handles.py): opened on first use, possibly closed and reopened between
operations, which changes nothing since no operation depends on a file position.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from broker.storage.errors import CorruptIndexError
from broker.storage.errors import CorruptSegmentError
from broker.storage.file_handles import SHARED_FILE_HANDLES
from broker.storage.file_handles import CachedFile
from broker.storage.file_handles import FileHandleCache
from protocol.errors import CorruptRecordError
from protocol.record_batch import HEADER_SIZE
from protocol.record_batch import BatchHeader
from protocol.record_batch import iter_headers
from protocol.record_batch import parse_header
from protocol.record_batch import scan_valid_prefix
from protocol.record_batch import validate_batch
from runtime.fileio import write_all

# Header scans read this much at a time: a few index intervals of small batches.
_SCAN_CHUNK = 16 * 1024
# Recovery validates CRCs over large reads.
_RECOVERY_CHUNK = 4 * 1024 * 1024
# A batch's magic byte (v2) and where it lies in the batch: resynchronising after
# damage looks for it.
_MAGIC = b"\x02"
_MAGIC_AT = 16
# An evicted descriptor is reopened like this: the file exists, appends go to its end.
_REOPEN_FLAGS = os.O_RDWR | os.O_APPEND


class FileRecords:
    """One `.log` file: its size, appends, cuts and header scans."""

    def __init__(self, path: Path, *, create: bool, handles: FileHandleCache | None = None) -> None:
        self.path = path
        handles = handles or SHARED_FILE_HANDLES
        if create:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            self.handle: CachedFile = handles.adopt(path, fd, _REOPEN_FLAGS)
            self.size = 0
        else:
            # Not opened until used (a recovered log's older segments may never be).
            self.size = os.stat(path).st_size
            self.handle = handles.lazy(path, _REOPEN_FLAGS)

    def append(self, view: memoryview) -> None:
        """Write `view` (whole batches) at the end of the file."""
        position = self.size
        with self.handle as fd:
            try:
                write_all(fd, view)
            except OSError as exc:
                # Leave no partial batch behind for readers; recovery would cut it anyway.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, position)
                # os.write names no file: say which one (the log directory goes offline).
                raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        self.size += len(view)

    def truncate(self, position: int) -> None:
        with self.handle as fd:
            os.ftruncate(fd, position)
        self.size = position

    def fsync(self) -> None:
        # An evicted descriptor is reopened: fsync flushes the file, whichever
        # descriptor wrote it.
        with self.handle as fd:
            os.fsync(fd)

    def close(self) -> None:
        self.handle.close()

    def _pread(self, size: int, position: int) -> bytes:
        with self.handle as fd:
            return os.pread(fd, size, position)

    def header_at(self, position: int) -> BatchHeader:
        """The batch header at `position` (CorruptRecordError when there is none)."""
        return parse_header(self._pread(HEADER_SIZE, position))

    def check_index_entry(self, index: Path, offset: int, position: int) -> None:
        """CorruptIndexError unless the batch at `position` starts at `offset`."""
        try:
            pointed = self.header_at(position)
        except CorruptRecordError as exc:
            raise CorruptIndexError(
                f"index {index} points at position {position}, "
                f"where there is no batch header: {exc}"
            ) from exc
        if pointed.base_offset != offset:
            raise CorruptIndexError(
                f"index {index} maps offset {offset} to position "
                f"{position}, where batch {pointed.base_offset} starts"
            )

    def read_batches(
        self, position: int, window: int, max_offset: int | None
    ) -> tuple[bytes | memoryview, bool]:
        """The whole batches in `window` bytes from `position` (one pread, cut without
        copying), none starting at or past `max_offset`; and whether `max_offset`
        stopped the read."""
        chunk = self._pread(window, position)
        end = 0
        bounded = False
        try:
            for batch_position, header in iter_headers(chunk):
                if max_offset is not None and header.base_offset >= max_offset:
                    bounded = True
                    break
                end = batch_position + header.size
        except CorruptRecordError as exc:
            raise self.corrupt(position + end, str(exc)) from exc
        return (chunk if end == len(chunk) else memoryview(chunk)[:end]), bounded

    def scan_headers(self, start: int) -> Iterator[tuple[int, BatchHeader]]:
        """Headers (no CRC check) from `start` to the end of the file, read in chunks."""
        end = self.size
        position = start
        while position < end:
            chunk = self._pread(min(_SCAN_CHUNK, end - position), position)
            if len(chunk) < HEADER_SIZE:
                raise self.corrupt(position, "partial batch header at the end of the file")
            offset = 0
            while len(chunk) - offset >= HEADER_SIZE:
                try:
                    header = parse_header(chunk, offset)
                except CorruptRecordError as exc:
                    raise self.corrupt(position + offset, str(exc)) from exc
                if position + offset + header.size > end:
                    raise self.corrupt(position + offset, "batch runs past the end of the file")
                yield position + offset, header
                offset += header.size
            position += offset

    def scan_valid(self) -> Iterator[tuple[int, BatchHeader]]:
        """Fully validated batches (length, magic, CRC) from the start of the file,
        stopping at the first invalid or incomplete one."""
        position = 0
        want = _RECOVERY_CHUNK
        while position < self.size:
            chunk = self._pread(min(want, self.size - position), position)
            at_eof = position + len(chunk) >= self.size
            valid, batches = scan_valid_prefix(chunk)
            for batch_position, header in batches:
                yield position + batch_position, header
            position += valid
            want = _RECOVERY_CHUNK
            if valid == len(chunk):
                continue
            if at_eof:
                return
            # The scan stopped inside the chunk: a bad batch, or one the chunk cut short.
            if valid and len(chunk) - valid < HEADER_SIZE:
                continue  # only the header was cut: read again from it
            try:
                need = parse_header(chunk, valid).size
            except CorruptRecordError:
                return
            if valid + need <= len(chunk):
                return
            want = max(want, need)

    def find_valid_batch(self, position: int, min_offset: int) -> int | None:
        """The position of the first valid batch (length, magic, CRC) that starts
        after `position` with a base offset of at least `min_offset`, or None.
        Recovery cuts only bytes that no valid batch follows (a torn tail): this is
        how it tells damage in the middle of a segment from a torn end. Candidates are
        the bytes holding the magic value; only a plausible length is CRC-checked."""
        start = position + 1
        while start + HEADER_SIZE <= self.size:
            chunk = self._pread(min(_RECOVERY_CHUNK + HEADER_SIZE, self.size - start), start)
            starts = min(_RECOVERY_CHUNK, len(chunk) - HEADER_SIZE + 1)  # candidates here
            at = chunk.find(_MAGIC, _MAGIC_AT)
            while at != -1 and at - _MAGIC_AT < starts:
                candidate = at - _MAGIC_AT
                size = int.from_bytes(chunk[candidate + 8 : candidate + 12], "big") + 12
                base = int.from_bytes(chunk[candidate : candidate + 8], "big", signed=True)
                if HEADER_SIZE <= size <= self.size - start - candidate and base >= min_offset:
                    whole = candidate + size <= len(chunk)
                    data = (
                        chunk[candidate : candidate + size]
                        if whole
                        else self._pread(size, start + candidate)
                    )
                    with contextlib.suppress(CorruptRecordError):
                        validate_batch(data)
                        return start + candidate
                at = chunk.find(_MAGIC, at + 1)
            start += _RECOVERY_CHUNK
        return None

    def describe_invalid(self, position: int) -> str:
        """Why the batch at `position` is not valid (for recovery's warning)."""
        remaining = self.size - position
        head = self._pread(min(remaining, HEADER_SIZE), position)
        try:
            header = parse_header(head)
            if header.size > remaining:
                return f"batch claims {header.size} bytes but only {remaining} remain (torn write)"
            validate_batch(self._pread(header.size, position))
        except CorruptRecordError as exc:
            return str(exc)
        return "invalid batch"

    def corrupt(self, position: int, problem: str) -> CorruptSegmentError:
        return CorruptSegmentError(self.path, position, problem)
