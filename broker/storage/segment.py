"""A log segment: one `.log` file of record batches and its two sparse indexes.

Files, in the partition directory, named by the segment's base offset (20 digits)::

    00000000000000001500.log         the batches, back to back
    00000000000000001500.index       offset -> position   (see offset_index.py)
    00000000000000001500.timeindex   timestamp -> offset  (see time_index.py)

`.log` format: see file_records.py (batches back to back, exactly as on the wire).
Invariants of a segment file:

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

Reads use os.pread (FileRecords); flush() may run on a worker thread while the event
loop appends, and close() waits for an fsync in progress. The three descriptors are
the broker's file-handle cache's (file_handles.py): opened when first used, closed by
the cache when others were used more recently, reopened transparently. A `.log` that
cannot be opened fails the append before anything is written (FileOpenError, for that
partition only); an index that cannot be opened only loses the entry (sparse, derived
data: a lookup scans a little further). A truncation pins all three files before it
changes anything.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import NamedTuple

from broker.storage.errors import CorruptIndexError
from broker.storage.errors import CorruptSegmentError
from broker.storage.errors import FileOpenError
from broker.storage.file_handles import SHARED_FILE_HANDLES
from broker.storage.file_handles import CachedFile
from broker.storage.file_handles import FileHandleCache
from broker.storage.file_records import FileRecords
from broker.storage.offset_index import INT32_MAX
from broker.storage.offset_index import OffsetIndex
from broker.storage.time_index import TimeIndex
from protocol.invariants import InvariantError
from protocol.invariants import invariant
from protocol.record_batch import HEADER_SIZE
from protocol.record_batch import BatchHeader
from protocol.record_batch import TimestampType
from protocol.record_batch import decode_batch

if TYPE_CHECKING:
    from broker.storage.epoch_cache import LeaderEpochFileCache

logger = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)


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
        handles: FileHandleCache | None = None,
    ) -> None:
        handles = handles or SHARED_FILE_HANDLES
        self.dir = Path(dir)
        self.base_offset = base_offset
        self.log_path = self.dir / segment_file_name(base_offset, LOG_SUFFIX)
        self.index_path = self.dir / segment_file_name(base_offset, INDEX_SUFFIX)
        self.time_index_path = self.dir / segment_file_name(base_offset, TIME_INDEX_SUFFIX)
        self._index_interval_bytes = index_interval_bytes
        self._io_lock = threading.Lock()
        self._closed = False
        if create:
            self._file = FileRecords(self.log_path, create=True, handles=handles)
            # Index files with no .log are leftovers; a new segment starts them afresh.
            self.index_path.unlink(missing_ok=True)
            self.time_index_path.unlink(missing_ok=True)
            self._indexes_missing = False
        else:
            self._file = FileRecords(self.log_path, create=False, handles=handles)
            self._indexes_missing = not (self.index_path.exists() and self.time_index_path.exists())
        try:
            self.offset_index = OffsetIndex(self.index_path, base_offset, handles)
            try:
                self.time_index = TimeIndex(self.time_index_path, base_offset, handles)
            except BaseException:
                self.offset_index.close()
                raise
        except BaseException:
            self._file.close()
            if create:
                # Just created, empty: left behind it would refuse the next attempt
                # (O_EXCL) after, say, the indexes found no file descriptor.
                self.log_path.unlink(missing_ok=True)
            raise
        # Derived state, valid once `_loaded` (always for a new segment).
        self._loaded = create
        self._next_offset = base_offset
        self._max_timestamp = -1
        self._offset_of_max_timestamp = base_offset
        self._last_epoch = -1
        self._bytes_since_last_index_entry = 0
        self._created_ms = now_ms

    # The two ways to get a segment; `sizing` is index_interval_bytes and now_ms;
    # `handles` the file-handle cache (None: the process-wide one).
    @classmethod
    def create(
        cls, dir: Path, base_offset: int, handles: FileHandleCache | None = None, **sizing: int
    ) -> LogSegment:
        """A new empty segment; fails if its `.log` file already exists."""
        return cls(dir, base_offset, create=True, handles=handles, **sizing)

    @classmethod
    def open(
        cls, dir: Path, base_offset: int, handles: FileHandleCache | None = None, **sizing: int
    ) -> LogSegment:
        """Existing segment files; follow with `sanity_check()` or `recover()`."""
        return cls(dir, base_offset, create=False, handles=handles, **sizing)

    # ------------------------------------------------------------------ state

    @property
    def size(self) -> int:
        return self._file.size

    @property
    def is_empty(self) -> bool:
        return self._file.size == 0

    @property
    def next_offset(self) -> int:
        """One past the last offset in the segment (the base offset when empty)."""
        if not self._loaded:
            raise InvariantError(f"segment {self.log_path} used before sanity_check()/recover()")
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        """Largest batch max_timestamp in the segment, -1 when there is none."""
        return self._max_timestamp

    @property
    def largest_timestamp(self) -> int:
        """What retention.ms compares: the max timestamp, else the file's mtime."""
        if self._max_timestamp >= 0:
            return self._max_timestamp
        return int(os.stat(self.log_path).st_mtime * 1000)  # the file's last modification

    @property
    def created_ms(self) -> int:
        """Start of the segment's life for segment.ms: creation time for a segment made
        by this process, else the first batch's timestamp (bounded by the open time)."""
        return self._created_ms

    @property
    def last_epoch(self) -> int:
        """Leader epoch of the last batch, -1 when empty."""
        invariant(self._loaded, "segment used before sanity_check()/recover()")
        return self._last_epoch

    # ------------------------------------------------------------------ writes

    def append(
        self, records: bytes | bytearray | memoryview, headers: Sequence[BatchHeader]
    ) -> None:
        """Append whole, already validated batches (`headers` describe `records` in order).

        The first must start at `next_offset`, and each next one where the previous
        ended; the log rolls a new segment rather than leave a gap.
        """
        if not self._loaded or self._closed:
            raise InvariantError(f"append to unusable segment {self.log_path}")
        view = memoryview(records)
        expected = self._next_offset
        total = 0
        for header in headers:
            # Kept under python -O: offsets appended strictly increase, with no gap.
            if header.base_offset != expected:
                raise InvariantError(
                    f"batch at offset {header.base_offset} appended to {self.log_path} "
                    f"whose next offset is {expected}"
                )
            if header.last_offset - self.base_offset > INT32_MAX:
                raise InvariantError("relative offset overflow")
            expected = header.next_offset
            total += header.size
        if total != len(view):
            raise InvariantError(f"{len(view)} bytes do not match the batch headers ({total})")
        position = self._file.size
        if position + total > INT32_MAX:
            raise InvariantError(f"segment {self.log_path} would exceed 2 GiB")
        self._file.append(view)
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
        removed = self._file.size - position
        self._pin_files()
        try:
            self.offset_index.truncate_to(header.base_offset)
            self.time_index.truncate_to(header.base_offset)
            self._file.truncate(position)
            self._load_tail_state()
        finally:
            self._unpin_files()
        return removed

    def on_become_inactive(self) -> None:
        """The log rolled past this segment: record its largest timestamp for good.
        Derived data: when the time index cannot be opened the entry is left out
        (lookups then scan a little more) rather than fail the roll or the close."""
        if self._loaded:
            try:
                self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            except FileOpenError as exc:
                logger.warning("segment %s: no final time index entry: %s", self.log_path, exc)

    def release_descriptors(self) -> None:
        """Close the segment's descriptors now unless in use (they reopen when used):
        an older segment of a loaded log need hold none until it is read."""
        for handle in self._handles():
            handle.evict()

    def _pin_files(self) -> None:
        """Open and pin all three files (FileOpenError, none left pinned, before
        anything is changed); `_unpin_files` after."""
        log_file, index, time_index = self._handles()
        log_file.acquire()
        try:
            index.acquire()
            try:
                time_index.acquire()
            except BaseException:
                index.release()
                raise
        except BaseException:
            log_file.release()
            raise

    def _unpin_files(self) -> None:
        for handle in self._handles():
            handle.release()

    def _handles(self) -> tuple[CachedFile, CachedFile, CachedFile]:
        return self._file.handle, self.offset_index.handle, self.time_index.handle

    def flush(self) -> None:
        """fsync the log and both indexes (safe from a worker thread)."""
        with self._io_lock:
            if self._closed:
                return
            self._file.fsync()
            self.offset_index.flush()
            self.time_index.flush()

    def close(self, *, final_time_entry: bool = True) -> None:
        """Close the files, first recording the largest timestamp in the time index
        (unless told not to write: a data directory gone offline)."""
        with self._io_lock:
            if self._closed:
                return
            if final_time_entry:
                self.on_become_inactive()
            self._closed = True
            self._file.close()
            self.offset_index.close()
            self.time_index.close()

    def delete(self) -> None:
        """Close and remove the three files, the `.log` first (see the module docstring)."""
        self.close(final_time_entry=False)
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

    def read(self, start_offset: int, max_bytes: int, *more: Any, **options: Any) -> bytes:
        """`read_slice` (the same arguments), as bytes."""
        data = self.read_slice(start_offset, max_bytes, *more, **options).data
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
        size = self._file.size
        limit = size if max_position is None else min(max_position, size)
        if position + first.size > limit or (
            max_offset is not None and first.base_offset >= max_offset
        ):
            return SegmentRead(b"", False)
        window = min(max_bytes, limit - position)
        if first.size > window:
            if not min_one_batch:
                return SegmentRead(b"", False)
            window = first.size
        data, bounded = self._file.read_batches(position, window, max_offset)
        return SegmentRead(data, not bounded and position + len(data) == size)

    def translate_offset(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset is >= `offset`."""
        if offset >= self.next_offset:
            return None
        _, position = self.offset_index.lookup(offset)
        for batch_position, header in self._file.scan_headers(position):
            if header.last_offset >= offset:
                return batch_position, header
        return None

    def find_offset_by_timestamp(
        self, timestamp: int, start_offset: int = 0
    ) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record at or after
        `start_offset` whose timestamp is >= `timestamp`, else None. As Kafka, the
        batch found by its max_timestamp is decoded to find the record in it (a
        consumer's offsetsForTimes, and Spark's ending offsets by time, must not stop
        at the start of a batch that begins before the time)."""
        if self._max_timestamp < timestamp:
            return None
        found = self.translate_offset(max(self.time_index.lookup(timestamp), start_offset))
        if found is None:
            return None
        for position, header in self._file.scan_headers(found[0]):
            if header.max_timestamp < timestamp:
                continue
            if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
                # Every record of the batch carries the batch's time (Kafka's rule).
                offset = max(header.base_offset, start_offset)
                return offset, header.max_timestamp, header.partition_leader_epoch
            data, _ = self._file.read_batches(position, header.size, None)
            _, records = decode_batch(data, verify_crc=False)
            for record in records:
                if record.offset >= start_offset and record.timestamp >= timestamp:
                    return record.offset, record.timestamp, header.partition_leader_epoch
        return None

    def iter_batches(self, start_position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every batch from `start_position`, headers only."""
        return self._file.scan_headers(start_position)

    # ------------------------------------------------------------------ loading

    def sanity_check(self) -> None:
        """Load a segment from a clean shutdown: check the indexes and the batches after
        the last index entry. Raises CorruptIndexError or CorruptSegmentError, after
        which the caller recovers the segment."""
        size = self._file.size
        if self._indexes_missing and size:
            raise CorruptIndexError(f"index files of segment {self.log_path} are missing")
        self.offset_index.sanity_check(size)
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
        later_records: bool = False,
    ) -> int:
        """Validate every batch, cut a torn tail and rebuild both indexes. Returns the
        number of bytes cut.

        Only a torn tail is cut: bytes from the first invalid batch to the end of the
        file with no valid batch among them, in the last segment holding records
        (`later_records` False). Anything else is damage in the middle of the log
        (a valid batch follows, or the first bad batch is whole and CRC-valid but out
        of place): CorruptSegmentError, nothing cut, for the operator to decide.

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
        for position, header in self._file.scan_valid():
            problem = _recovery_problem(self, header, epoch_cache, log_start_offset)
            if problem is not None:
                break
            self._index_batch(position, header)
            valid_end = position + header.size
        truncated = self._file.size - valid_end
        if truncated:
            if problem is None:
                problem = self._file.describe_invalid(valid_end)
                follows = self._file.find_valid_batch(valid_end, self._next_offset)
            else:
                follows = valid_end  # a whole, CRC-valid batch: out of place, not torn
            if follows is not None or later_records:
                what = (
                    f"a valid batch lies at position {follows}"
                    if follows is not None
                    else "later segments hold records"
                )
                raise CorruptSegmentError(
                    self.log_path,
                    valid_end,
                    f"{problem}; {what}, so this is damage inside the log, not a torn write "
                    "at its end (nothing was cut)",
                )
            logger.warning(
                "Recovery of %s: cutting %d bytes at position %d (offset %d): %s",
                self.log_path,
                truncated,
                valid_end,
                self._next_offset,
                problem,
            )
            self._file.truncate(valid_end)
        self._indexes_missing = False
        self._init_created_ms()
        self._loaded = True
        return truncated

    # ------------------------------------------------------------------ internals

    def _index_batch(self, position: int, header: BatchHeader) -> None:
        """Account for a batch written at `position`: indexes and cached state."""
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = header.base_offset
        if self._bytes_since_last_index_entry > self._index_interval_bytes:
            try:
                self.offset_index.append(header.base_offset, position)
                self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            except FileOpenError as exc:
                # The batch is written: account for it whatever happens. The indexes
                # are sparse, derived data: an entry left out only lengthens the scan
                # of a lookup (the file-handle cache logged the failure).
                logger.debug("segment %s: index entry left out: %s", self.log_path, exc)
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
            self._file.check_index_entry(self.offset_index.path, index_offset, index_position)
        expected = index_offset
        last_epoch = -1
        for _, header in self._file.scan_headers(index_position):
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
        self._bytes_since_last_index_entry = self._file.size - index_position

    def _init_created_ms(self) -> None:
        if self._file.size >= HEADER_SIZE:
            first = self._file.header_at(0)
            if first.max_timestamp >= 0:
                # Survives restarts, but never in the future of the opening time.
                self._created_ms = min(self._created_ms, first.max_timestamp)

    def __repr__(self) -> str:
        state = f"next_offset={self._next_offset}" if self._loaded else "not loaded"
        return f"LogSegment({self.log_path}, size={self._file.size}, {state})"


def _recovery_problem(
    segment: LogSegment,
    header: BatchHeader,
    epoch_cache: LeaderEpochFileCache | None,
    log_start: int,
) -> str | None:
    """Why a CRC-valid batch still cannot be kept by `segment` (recovering), or None."""
    if header.base_offset != segment._next_offset:
        return f"batch base offset {header.base_offset} where {segment._next_offset} was expected"
    if header.last_offset - segment.base_offset > INT32_MAX:
        return f"batch last offset {header.last_offset} overflows the segment's int32 range"
    epoch = header.partition_leader_epoch
    if epoch < 0:
        return f"batch at offset {header.base_offset} carries no leader epoch ({epoch})"
    if epoch < segment._last_epoch:
        return (
            f"batch at offset {header.base_offset} has leader epoch {epoch}, "
            f"below the previous batch's {segment._last_epoch}"
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
