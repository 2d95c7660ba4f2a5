"""A log segment: one `.log` file of record batches and its two sparse indexes.

Files, in the partition directory, named by the segment's base offset (20 digits)::

    00000000000000001500.log         the batches, back to back
    00000000000000001500.index       offset -> position   (see offset_index.py)
    00000000000000001500.timeindex   timestamp -> offset  (see time_index.py)

`.log` format: a concatenation of Kafka RecordBatch v2 batches exactly as they
travel on the wire (layout in protocol/record_batch.py), with no file header, no
padding and no trailer. The broker writes and reads whole batches and only ever
looks at their 61-byte headers. Invariants of a segment file:

- the first batch starts at the segment's base offset, and every further batch starts
  at the previous batch's next offset (no gaps inside a segment; the log rolls a new
  segment when a follower's batch skips offsets);
- the partition leader epochs of the batches never decrease, and are >= 0;
- every batch's last offset fits in an int32 relative to the base offset, and the
  file stays below 2 GiB (index positions are int32).

After an unclean shutdown `recover()` re-validates every batch (length, magic, CRC,
offsets, epochs, also against the leader-epoch checkpoint because base offset and
epoch lie outside the CRC), cuts the file at the first bad or torn batch, and
rebuilds both indexes. Deleting a segment renames its files to `*.deleted` (the
`.log` first: from then on the segment does not exist) and then unlinks them; the
log loader removes `*.deleted` leftovers of a crash.

Reads use os.pread on a descriptor kept open; flush() may run on a worker thread
while the event loop appends, and close() waits for an fsync in progress.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from broker.storage.errors import CorruptIndexError, CorruptSegmentError
from broker.storage.offset_index import INT32_MAX, OffsetIndex
from broker.storage.time_index import TimeIndex
from protocol.errors import CorruptRecordError
from protocol.record_batch import (
    HEADER_SIZE,
    BatchHeader,
    iter_headers,
    parse_header,
    scan_valid_prefix,
    validate_batch,
)
from runtime.fileio import write_all

if TYPE_CHECKING:
    from broker.storage.epoch_cache import LeaderEpochFileCache

logger = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)

# Header scans read this much at a time: a few index intervals of small batches.
_SCAN_CHUNK = 16 * 1024
# Recovery validates CRCs over large reads.
_RECOVERY_CHUNK = 4 * 1024 * 1024


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class SegmentRead(NamedTuple):
    """Whole batches read from one segment."""

    # A memoryview when the read was cut before the end of what pread returned: the
    # bytes go to the socket as they are (scatter-gather), so cutting must not copy.
    data: bytes | memoryview
    # True when the read went to the end of the segment's data, so a log-level read
    # may continue in the next segment.
    reached_end: bool


class LogSegment:
    """One segment: the `.log` file plus its `.index` and `.timeindex`.

    Build with `create` (a new, empty segment) or `open` (existing files; then call
    `sanity_check()` or `recover()` before using it).
    """

    def __init__(
        self,
        dir: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        now_ms: int,
        create: bool,
    ) -> None:
        self.dir = Path(dir)
        self.base_offset = base_offset
        self.log_path = self.dir / segment_file_name(base_offset, LOG_SUFFIX)
        self.index_path = self.dir / segment_file_name(base_offset, INDEX_SUFFIX)
        self.time_index_path = self.dir / segment_file_name(base_offset, TIME_INDEX_SUFFIX)
        self._index_interval_bytes = index_interval_bytes
        self._io_lock = threading.Lock()
        self._closed = False
        if create:
            self._fd = os.open(
                self.log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644
            )
            # Index files with no .log are leftovers; a new segment starts them afresh.
            self.index_path.unlink(missing_ok=True)
            self.time_index_path.unlink(missing_ok=True)
            self._indexes_missing = False
        else:
            self._fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND)
            self._indexes_missing = not (self.index_path.exists() and self.time_index_path.exists())
        try:
            self._size = os.fstat(self._fd).st_size
            self.offset_index = OffsetIndex(self.index_path, base_offset)
            self.time_index = TimeIndex(self.time_index_path, base_offset)
        except BaseException:
            os.close(self._fd)
            raise
        # Derived state, valid once `_loaded` (always for a new segment).
        self._loaded = create
        self._next_offset = base_offset
        self._max_timestamp = -1
        self._offset_of_max_timestamp = base_offset
        self._last_epoch = -1
        self._bytes_since_last_index_entry = 0
        self._created_ms = now_ms

    @classmethod
    def create(
        cls, dir: Path, base_offset: int, *, index_interval_bytes: int, now_ms: int
    ) -> LogSegment:
        """A new empty segment; fails if its `.log` file already exists."""
        return cls(
            dir, base_offset, index_interval_bytes=index_interval_bytes, now_ms=now_ms, create=True
        )

    @classmethod
    def open(
        cls, dir: Path, base_offset: int, *, index_interval_bytes: int, now_ms: int
    ) -> LogSegment:
        """Existing segment files; follow with `sanity_check()` or `recover()`."""
        return cls(
            dir, base_offset, index_interval_bytes=index_interval_bytes, now_ms=now_ms, create=False
        )

    # ------------------------------------------------------------------ state

    @property
    def size(self) -> int:
        return self._size

    @property
    def is_empty(self) -> bool:
        return self._size == 0

    @property
    def next_offset(self) -> int:
        """One past the last offset in the segment (the base offset when empty)."""
        assert self._loaded, f"segment {self.log_path} used before sanity_check()/recover()"
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        """Largest batch max_timestamp in the segment, -1 when there is none."""
        return self._max_timestamp

    @property
    def largest_timestamp(self) -> int:
        """What retention.ms compares: the max timestamp, else the file's mtime."""
        return self._max_timestamp if self._max_timestamp >= 0 else self.last_modified_ms

    @property
    def last_modified_ms(self) -> int:
        return int(os.stat(self.log_path).st_mtime * 1000)

    @property
    def created_ms(self) -> int:
        """Start of the segment's life for segment.ms: creation time for a segment made
        by this process, else the first batch's timestamp (bounded by the open time)."""
        return self._created_ms

    @property
    def last_epoch(self) -> int:
        """Leader epoch of the last batch, -1 when empty."""
        assert self._loaded
        return self._last_epoch

    # ------------------------------------------------------------------ writes

    def append(
        self, records: bytes | bytearray | memoryview, headers: Sequence[BatchHeader]
    ) -> None:
        """Append whole, already validated batches (`headers` describe `records` in order).

        The first must start at `next_offset`, and each next one where the previous
        ended; the log rolls a new segment rather than leave a gap.
        """
        assert self._loaded and not self._closed, f"append to unusable segment {self.log_path}"
        view = memoryview(records)
        expected = self._next_offset
        total = 0
        for header in headers:
            assert header.base_offset == expected, (
                f"batch at offset {header.base_offset} appended to {self.log_path} "
                f"whose next offset is {expected}"
            )
            assert header.last_offset - self.base_offset <= INT32_MAX, "relative offset overflow"
            expected = header.next_offset
            total += header.size
        assert total == len(view), f"{len(view)} bytes do not match the batch headers ({total})"
        position = self._size
        assert position + total <= INT32_MAX, f"segment {self.log_path} would exceed 2 GiB"
        try:
            write_all(self._fd, view)
        except OSError as exc:
            # Leave no partial batch behind for readers; recovery would cut it anyway.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, position)
            # os.write names no file: say which one (the log directory goes offline).
            raise OSError(exc.errno, exc.strerror, str(self.log_path)) from exc
        self._size += total
        for header in headers:
            self._index_batch(position, header)
            position += header.size

    def truncate_to(self, offset: int) -> int:
        """Remove the batch containing `offset` and everything after; returns bytes removed.

        The cut is always at a batch boundary: when `offset` falls inside a batch, the
        whole batch goes, so the segment then ends below `offset`.
        """
        found = self.translate_offset(offset)
        if found is None:
            return 0
        position, header = found
        removed = self._size - position
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        os.ftruncate(self._fd, position)
        self._size = position
        self._load_tail_state()
        return removed

    def on_become_inactive(self) -> None:
        """The log rolled past this segment: record its largest timestamp for good."""
        if self._loaded:
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)

    def flush(self) -> None:
        """fsync the log and both indexes (safe from a worker thread)."""
        with self._io_lock:
            if self._closed:
                return
            os.fsync(self._fd)
            self.offset_index.flush()
            self.time_index.flush()

    def close(self, *, final_time_entry: bool = True) -> None:
        """Close the files, first recording the largest timestamp in the time index
        (unless told not to write: a data directory gone offline)."""
        self._close(final_time_entry=final_time_entry)

    def _close(self, *, final_time_entry: bool) -> None:
        with self._io_lock:
            if self._closed:
                return
            if final_time_entry:
                self.on_become_inactive()
            self._closed = True
            os.close(self._fd)
            self.offset_index.close()
            self.time_index.close()

    def delete(self) -> None:
        """Close and remove the three files, the `.log` first (see the module docstring)."""
        self._close(final_time_entry=False)
        renamed = []
        for path in (self.log_path, self.index_path, self.time_index_path):
            target = path.with_name(path.name + DELETED_SUFFIX)
            try:
                os.replace(path, target)
            except FileNotFoundError:
                continue
            renamed.append(target)
        for target in renamed:
            target.unlink(missing_ok=True)

    # ------------------------------------------------------------------ reads

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        max_position: int | None = None,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> bytes:
        """Whole batches from the one containing `start_offset`, as bytes; see `read_slice`."""
        data = self.read_slice(
            start_offset,
            max_bytes,
            max_position,
            max_offset=max_offset,
            min_one_batch=min_one_batch,
        ).data
        return data if isinstance(data, bytes) else bytes(data)

    def read_slice(
        self,
        start_offset: int,
        max_bytes: int,
        max_position: int | None = None,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> SegmentRead:
        """Whole batches from the one containing `start_offset`, at most `max_bytes`
        (but the first batch whole when `min_one_batch`), none at or past
        `max_position` (a file position) or starting at or past `max_offset`."""
        found = self.translate_offset(start_offset)
        if found is None:
            return SegmentRead(b"", True)
        position, first = found
        limit = self._size if max_position is None else min(max_position, self._size)
        if position + first.size > limit or (
            max_offset is not None and first.base_offset >= max_offset
        ):
            return SegmentRead(b"", False)
        window = min(max_bytes, limit - position)
        if first.size > window:
            if not min_one_batch:
                return SegmentRead(b"", False)
            window = first.size
        chunk = os.pread(self._fd, window, position)
        end = 0
        bounded = False
        try:
            for batch_position, header in iter_headers(chunk):
                if max_offset is not None and header.base_offset >= max_offset:
                    bounded = True
                    break
                end = batch_position + header.size
        except CorruptRecordError as exc:
            raise self._corrupt(position + end, str(exc)) from exc
        data = chunk if end == len(chunk) else memoryview(chunk)[:end]
        return SegmentRead(data, not bounded and position + end == self._size)

    def translate_offset(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset is >= `offset`."""
        if offset >= self.next_offset:
            return None
        _, position = self.offset_index.lookup(offset)
        for batch_position, header in self._scan_headers(position):
            if header.last_offset >= offset:
                return batch_position, header
        return None

    def find_offset_by_timestamp(
        self, timestamp: int, start_offset: int = 0
    ) -> tuple[int, int, int] | None:
        """(offset, max timestamp, leader epoch) of the first batch at or after
        `start_offset` whose max_timestamp >= `timestamp`, else None."""
        if self._max_timestamp < timestamp:
            return None
        found = self.translate_offset(max(self.time_index.lookup(timestamp), start_offset))
        if found is None:
            return None
        for _, header in self._scan_headers(found[0]):
            if header.max_timestamp >= timestamp:
                return (
                    max(header.base_offset, start_offset),
                    header.max_timestamp,
                    header.partition_leader_epoch,
                )
        return None

    def iter_batches(self, start_position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every batch from `start_position`, headers only."""
        return self._scan_headers(start_position)

    # ------------------------------------------------------------------ loading

    def sanity_check(self) -> None:
        """Load a segment from a clean shutdown: check the indexes and the batches after
        the last index entry. Raises CorruptIndexError or CorruptSegmentError, after
        which the caller recovers the segment."""
        if self._indexes_missing and self._size:
            raise CorruptIndexError(f"index files of segment {self.log_path} are missing")
        self.offset_index.sanity_check(self._size)
        self._load_tail_state()
        self.time_index.sanity_check(self._next_offset)
        self._init_created_ms()
        self._loaded = True

    def recover(
        self,
        *,
        epoch_cache: LeaderEpochFileCache | None = None,
        log_start_offset: int = 0,
        previous_epoch: int = -1,
    ) -> int:
        """Validate every batch, cut the file at the first invalid or torn one and
        rebuild both indexes. Returns the number of bytes cut.

        `epoch_cache`, when trustworthy, catches flips in the leader epoch field (it is
        outside the CRC): a batch must carry the epoch the cache gives its offset.
        `previous_epoch` is the last epoch of the previous segment.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self._next_offset = self.base_offset
        self._max_timestamp = -1
        self._offset_of_max_timestamp = self.base_offset
        self._last_epoch = previous_epoch
        self._bytes_since_last_index_entry = 0
        valid_end = 0
        problem: str | None = None
        for position, header in self._scan_valid():
            problem = self._recovery_problem(header, epoch_cache, log_start_offset)
            if problem is not None:
                break
            self._index_batch(position, header)
            valid_end = position + header.size
        truncated = self._size - valid_end
        if truncated:
            if problem is None:
                problem = self._describe_invalid(valid_end)
            logger.warning(
                "Recovery of %s: cutting %d bytes at position %d (offset %d): %s",
                self.log_path,
                truncated,
                valid_end,
                self._next_offset,
                problem,
            )
            os.ftruncate(self._fd, valid_end)
            self._size = valid_end
        self._indexes_missing = False
        self._init_created_ms()
        self._loaded = True
        return truncated

    def last_batch_header(self) -> BatchHeader | None:
        last = None
        for _, header in self._scan_headers(self.offset_index.last_entry[1]):
            last = header
        return last

    # ------------------------------------------------------------------ internals

    def _index_batch(self, position: int, header: BatchHeader) -> None:
        """Account for a batch written at `position`: indexes and cached state."""
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = header.base_offset
        if self._bytes_since_last_index_entry > self._index_interval_bytes:
            self.offset_index.append(header.base_offset, position)
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += header.size
        self._next_offset = header.next_offset
        self._last_epoch = header.partition_leader_epoch

    def _load_tail_state(self) -> None:
        """Recompute next offset, max timestamp and index spacing from the last index
        entries plus a header scan of the batches after the last offset index entry."""
        index_offset, index_position = self.offset_index.last_entry
        max_timestamp, offset_of_max = self.time_index.last_entry
        if index_position:
            # The last entry must name a batch starting at its offset, or the index is bad.
            try:
                pointed = parse_header(os.pread(self._fd, HEADER_SIZE, index_position))
            except CorruptRecordError as exc:
                raise CorruptIndexError(
                    f"index {self.offset_index.path} points at position {index_position}, "
                    f"where there is no batch header: {exc}"
                ) from exc
            if pointed.base_offset != index_offset:
                raise CorruptIndexError(
                    f"index {self.offset_index.path} maps offset {index_offset} to position "
                    f"{index_position}, where batch {pointed.base_offset} starts"
                )
        expected = index_offset
        last_epoch = -1
        for _, header in self._scan_headers(index_position):
            if header.base_offset != expected:
                raise CorruptIndexError(
                    f"segment {self.log_path}: batch at offset {header.base_offset} where "
                    f"{expected} was expected (index entry ({index_offset}, {index_position}))"
                )
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
                offset_of_max = header.base_offset
            expected = header.next_offset
            last_epoch = header.partition_leader_epoch
        self._next_offset = expected
        self._max_timestamp = max_timestamp
        self._offset_of_max_timestamp = offset_of_max
        self._last_epoch = last_epoch
        self._bytes_since_last_index_entry = self._size - index_position

    def _init_created_ms(self) -> None:
        if self._size >= HEADER_SIZE:
            first = parse_header(os.pread(self._fd, HEADER_SIZE, 0))
            if first.max_timestamp >= 0:
                # Survives restarts, but never in the future of the opening time.
                self._created_ms = min(self._created_ms, first.max_timestamp)

    def _scan_headers(self, start: int) -> Iterator[tuple[int, BatchHeader]]:
        """Headers (no CRC check) from `start` to the end of the file, read in chunks."""
        end = self._size
        position = start
        while position < end:
            chunk = os.pread(self._fd, min(_SCAN_CHUNK, end - position), position)
            if len(chunk) < HEADER_SIZE:
                raise self._corrupt(position, "partial batch header at the end of the file")
            offset = 0
            while len(chunk) - offset >= HEADER_SIZE:
                try:
                    header = parse_header(chunk, offset)
                except CorruptRecordError as exc:
                    raise self._corrupt(position + offset, str(exc)) from exc
                if position + offset + header.size > end:
                    raise self._corrupt(position + offset, "batch runs past the end of the file")
                yield position + offset, header
                offset += header.size
            position += offset

    def _scan_valid(self) -> Iterator[tuple[int, BatchHeader]]:
        """Fully validated batches (length, magic, CRC) from the start of the file,
        stopping at the first invalid or incomplete one."""
        position = 0
        want = _RECOVERY_CHUNK
        while position < self._size:
            chunk = os.pread(self._fd, min(want, self._size - position), position)
            at_eof = position + len(chunk) >= self._size
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

    def _recovery_problem(
        self, header: BatchHeader, epoch_cache: LeaderEpochFileCache | None, log_start: int
    ) -> str | None:
        """Why a CRC-valid batch still cannot be kept, or None."""
        if header.base_offset != self._next_offset:
            return f"batch base offset {header.base_offset} where {self._next_offset} was expected"
        if header.last_offset - self.base_offset > INT32_MAX:
            return f"batch last offset {header.last_offset} overflows the segment's int32 range"
        epoch = header.partition_leader_epoch
        if epoch < 0:
            return f"batch at offset {header.base_offset} carries no leader epoch ({epoch})"
        if epoch < self._last_epoch:
            return (
                f"batch at offset {header.base_offset} has leader epoch {epoch}, "
                f"below the previous batch's {self._last_epoch}"
            )
        if epoch_cache is not None and header.next_offset > log_start:
            offset = max(header.base_offset, log_start)
            expected = epoch_cache.epoch_for_offset(offset)
            if expected is not None and expected != epoch:
                return (
                    f"batch at offset {header.base_offset} has leader epoch {epoch} but "
                    f"{epoch_cache.path.name} says epoch {expected} wrote offset {offset}"
                )
        return None

    def _describe_invalid(self, position: int) -> str:
        remaining = self._size - position
        head = os.pread(self._fd, min(remaining, HEADER_SIZE), position)
        try:
            header = parse_header(head)
            if header.size > remaining:
                return f"batch claims {header.size} bytes but only {remaining} remain (torn write)"
            validate_batch(os.pread(self._fd, header.size, position))
        except CorruptRecordError as exc:
            return str(exc)
        return "invalid batch"

    def _corrupt(self, position: int, problem: str) -> CorruptSegmentError:
        return CorruptSegmentError(self.log_path, position, problem)

    def __repr__(self) -> str:
        state = f"next_offset={self._next_offset}" if self._loaded else "not loaded"
        return f"LogSegment({self.log_path}, size={self._size}, {state})"
