"""The segment files of one partition replica, as Kafka's LocalLog: which segments
exist, where appends go, reads across them, and the offsets that bound them.

Files: the partition directory `<topic>-<partition>/` holds the segments, each a
`.log` file and its two indexes named by base offset (format in segment.py); this
class owns the list of them. Offsets: `log_start_offset` is the first offset a
reader may ask for, `log_end_offset` (LEO) is one past the last offset written,
`recovery_point` is the offset below which the data is known to be fsynced. Always
log_start_offset <= recovery_point <= log_end_offset, and the segments are sorted by
base offset with the last one, the active segment, taking the appends. The LEO only
goes back through `truncate_to` / `truncate_fully_and_start_at`.

What the files mean beyond bytes (epochs, producer state, validation) is the
unified `Log`'s job (log.py); this class never looks inside a batch header beyond
offsets, sizes and timestamps.

Threading: everything runs on the event-loop thread except `flush`, which may run on
a worker thread; the segment list, recovery point and log start offset change under
`self._lock`, and the fsyncs themselves happen outside it. Every removal of files is
followed by an fsync of the directory before the change is relied upon.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.file_handles import FileHandleCache
from broker.storage.log_config import LogConfig
from broker.storage.offset_index import INT32_MAX
from broker.storage.segment import LogSegment
from protocol.invariants import InvariantError
from protocol.invariants import invariant
from protocol.record_batch import BatchHeader
from runtime.fileio import fsync_directory

logger = logging.getLogger(__name__)


def current_ms() -> int:
    return time.time_ns() // 1_000_000


class LocalLog:
    """The ordered segments of one replica and its start, end and recovery offsets."""

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        name: str,
        log_start_offset: int,
        recovery_point: int,
        now_ms: int,
        on_roll: Callable[[], None],
        handles: FileHandleCache | None = None,
    ) -> None:
        self._dir = dir
        self._handles = handles  # where the segments' descriptors live (None: shared)
        self.config = config
        self._name = name
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        # Called after a non-empty active segment became inactive (a producer snapshot).
        self._on_roll = on_roll
        self.lock = threading.Lock()
        self.last_flush_ms = now_ms
        self._truncations = 0  # lets a concurrent flush see that the log went back
        self._dir_dirty = False  # segments created or removed since the last flush
        self.closed = False
        self.check_invariants()

    # ------------------------------------------------------------------ state

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def segments(self) -> list[LogSegment]:
        return self._segments

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    def last_batch_epoch(self) -> int:
        for segment in reversed(self._segments):
            if not segment.is_empty:
                return segment.last_epoch
        return -1

    # ------------------------------------------------------------------ appends

    def append(self, view: memoryview, batches: list[tuple[int, BatchHeader]], now_ms: int) -> None:
        """Write validated batches, rolling segments where needed; one write per run."""
        log_end = self.log_end_offset
        if batches[0][1].base_offset < log_end:
            raise InvariantError(
                f"[Log {self._name}] appended offsets must strictly increase: batch at "
                f"{batches[0][1].base_offset} below the log end {log_end}"
            )
        segment = self._segments[-1]
        run: list[BatchHeader] = []
        run_start = 0
        run_bytes = 0
        for position, header in batches:
            if self._should_roll(segment, header, run, run_bytes, now_ms):
                if run:
                    segment.append(view[run_start : run_start + run_bytes], run)
                    run, run_bytes = [], 0
                segment = self.roll_to(header.base_offset, now_ms)
            if not run:
                run_start = position
            run.append(header)
            run_bytes += header.size
        segment.append(view[run_start : run_start + run_bytes], run)
        if not self.log_end_offset == batches[-1][1].next_offset > log_end:
            raise InvariantError(
                f"[Log {self._name}] the log end must move forward: {log_end} -> "
                f"{self.log_end_offset}, expected {batches[-1][1].next_offset}"
            )
        self.check_invariants(full=False)

    def _should_roll(
        self,
        segment: LogSegment,
        header: BatchHeader,
        run: list[BatchHeader],
        run_bytes: int,
        now_ms: int,
    ) -> bool:
        expected = run[-1].next_offset if run else segment.next_offset
        if header.base_offset != expected:
            return True  # a follower batch skipping offsets starts a new segment
        size = segment.size + run_bytes
        if size == 0:
            return False
        return (
            size + header.size > self.config.segment_bytes
            or now_ms - segment.created_ms > self.config.segment_ms
            or header.last_offset - segment.base_offset > INT32_MAX
        )

    # ------------------------------------------------------------------ rolling

    def maybe_roll(self, incoming_bytes: int, now_ms: int) -> LogSegment:
        """Roll when the active segment is non-empty and either `incoming_bytes` more
        would pass segment.bytes or it is older than segment.ms."""
        segment = self._segments[-1]
        if segment.size and (
            segment.size + incoming_bytes > self.config.segment_bytes
            or now_ms - segment.created_ms > self.config.segment_ms
        ):
            return self.roll_to(self.log_end_offset, now_ms)
        return segment

    def roll_to(self, base_offset: int, now_ms: int) -> LogSegment:
        active = self._segments[-1]
        invariant(base_offset >= active.next_offset, "a new segment cannot start inside the log")
        if active.is_empty and active.base_offset == base_offset:
            return active
        segment = LogSegment.create(
            self._dir,
            base_offset,
            self._handles,
            index_interval_bytes=self.config.index_interval_bytes,
            now_ms=now_ms,
        )
        with self.lock:
            if active.is_empty:
                # An empty active segment at the wrong base (a follower gap) is replaced.
                self._segments.pop()
                self._bases.pop()
                if not self._segments:
                    # The log was empty: it now starts where the leader's data starts.
                    self.log_start_offset = base_offset
                    self.recovery_point = max(self.recovery_point, base_offset)
            self._segments.append(segment)
            self._bases.append(base_offset)
            self._dir_dirty = True
        if active.is_empty:
            active.delete()
        else:
            active.on_become_inactive()
            self._on_roll()
        logger.info("[Log %s] rolled new segment at offset %d", self._name, base_offset)
        return segment

    # ------------------------------------------------------------------ reads

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        max_offset: int | None,
        min_one_batch: bool,
    ) -> bytes | memoryview:
        """Whole batches from the one containing `start_offset`, possibly spanning
        segments; see Log.read."""
        log_end = self.log_end_offset
        if start_offset == log_end:
            return b""
        if not self.log_start_offset <= start_offset < log_end:
            raise OffsetOutOfRangeError(start_offset, self.log_start_offset, log_end)
        if max_offset is not None and start_offset >= max_offset:
            return b""  # e.g. a consumer already at the high watermark
        index = max(0, bisect.bisect_right(self._bases, start_offset) - 1)
        parts: list[bytes | memoryview] = []
        remaining = max_bytes
        offset = start_offset
        for segment in itertools.islice(self._segments, index, None):
            if max_offset is not None and segment.base_offset >= max_offset:
                break
            part = segment.read_slice(
                offset, remaining, max_offset=max_offset, min_one_batch=min_one_batch and not parts
            )
            if part.data:
                parts.append(part.data)
                remaining -= len(part.data)
            if not part.reached_end or remaining <= 0:
                break
            offset = segment.next_offset
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first batch whose max timestamp is
        >= `timestamp` (>= 0), raised to the log start, or None."""
        for segment in self._segments:
            if segment.next_offset <= self.log_start_offset:
                continue
            if segment.max_timestamp >= timestamp:
                found = segment.find_offset_by_timestamp(timestamp, self.log_start_offset)
                if found is not None:
                    return found
        return None

    def iter_headers(self, from_offset: int) -> Iterator[BatchHeader]:
        """Batch headers from the batch holding `from_offset` to the log end."""
        for segment in list(self._segments):
            if segment.next_offset <= from_offset:
                continue
            position = 0
            if segment.base_offset < from_offset:
                found = segment.translate_offset(from_offset)
                if found is None:
                    continue
                position = found[0]
            for _, header in segment.iter_batches(position):
                yield header

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> int:
        """Cut the segments at the batch boundary at or below `offset` (inside the log,
        at or past the first segment's base), fsynced; returns the new LEO."""
        with self.lock:
            keep = bisect.bisect_right(self._bases, offset)
            doomed = self._segments[keep:]
            del self._segments[keep:]
            del self._bases[keep:]
            self._truncations += 1
        for segment in reversed(doomed):
            segment.delete()
        active = self._segments[-1]
        active.truncate_to(offset)
        active.flush()
        if doomed:
            fsync_directory(self._dir)
        new_end = active.next_offset
        with self.lock:
            # Counted again now that the data is cut: a flush that looked at the log
            # between the two counts saw the old end and must not advance past the new one.
            self._truncations += 1
            self.recovery_point = min(self.recovery_point, new_end)
            self.log_start_offset = min(self.log_start_offset, new_end)
        return new_end

    def truncate_fully_and_start_at(self, offset: int, now_ms: int | None) -> None:
        """Delete every segment and restart empty at `offset`, fsynced."""
        if now_ms is None:
            now_ms = current_ms()
        with self.lock:
            for segment in reversed(self._segments):
                segment.delete()
            segment = LogSegment.create(
                self._dir,
                offset,
                self._handles,
                index_interval_bytes=self.config.index_interval_bytes,
                now_ms=now_ms,
            )
            self._segments = [segment]
            self._bases = [offset]
            self.log_start_offset = offset
            self.recovery_point = offset
            self._truncations += 1
        fsync_directory(self._dir)

    # ------------------------------------------------------------------ retention

    def segments_to_delete(self, *, high_watermark: int, now_ms: int) -> tuple[int, str]:
        """How many of the oldest segments breach retention.ms or retention.bytes, or
        lie wholly below the log start offset, and why. Only whole segments entirely
        below the high watermark, never the active one."""
        config = self.config
        segments = self._segments
        deletable = 0  # a prefix of segments[:-1] whose successors start <= high watermark
        while (
            deletable < len(segments) - 1 and segments[deletable + 1].base_offset <= high_watermark
        ):
            deletable += 1
        by_start = 0
        while by_start < deletable and segments[by_start + 1].base_offset <= self.log_start_offset:
            by_start += 1
        by_time = 0
        if config.retention_ms >= 0:
            while (
                by_time < deletable
                and now_ms - segments[by_time].largest_timestamp > config.retention_ms
            ):
                by_time += 1
        by_size = 0
        if config.retention_bytes >= 0:
            excess = self.size_in_bytes - config.retention_bytes
            while by_size < deletable and excess - segments[by_size].size >= 0:
                excess -= segments[by_size].size
                by_size += 1
        count = max(by_start, by_time, by_size)
        reasons = (("log start", by_start), ("retention.ms", by_time), ("retention.bytes", by_size))
        return count, " and ".join(name for name, n in reasons if n == count)

    def segments_below(self, offset: int) -> int:
        """How many of the oldest segments (never the active one) end at or below `offset`."""
        count = 0
        while count < len(self._segments) - 1 and self._segments[count + 1].base_offset <= offset:
            count += 1
        return count

    def advance_log_start(self, offset: int) -> None:
        with self.lock:
            self.log_start_offset = offset
            self.recovery_point = max(self.recovery_point, offset)

    def delete_prefix(self, count: int) -> None:
        """Delete the `count` oldest segments; the log start moves up to what remains
        (the directory is fsynced by the next flush)."""
        with self.lock:
            doomed = self._segments[:count]
            del self._segments[:count]
            del self._bases[:count]
            self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
            self.recovery_point = max(self.recovery_point, self.log_start_offset)
            self._dir_dirty = True
        for segment in doomed:
            segment.delete()

    # ------------------------------------------------------------------ durability

    def flush(self, up_to: int | None, now_ms: int | None) -> None:
        """fsync the segments holding data below `up_to` (default: the LEO) and advance
        the recovery point. Safe on a worker thread while the event loop appends."""
        with self.lock:
            if self.closed:
                return
            log_end = self._segments[-1].next_offset
            target = log_end if up_to is None else min(up_to, log_end)
            todo = [
                segment
                for segment in self._segments
                if segment.next_offset > self.recovery_point and segment.base_offset < target
            ]
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            truncations = self._truncations
        for segment in todo:
            segment.flush()
        if dir_dirty:
            fsync_directory(self._dir)
        with self.lock:
            # A truncation meanwhile may have replaced data below `target`: then the
            # fsyncs above do not cover it and the recovery point must not move.
            if truncations == self._truncations and target > self.recovery_point:
                self.recovery_point = target
            self.last_flush_ms = current_ms() if now_ms is None else now_ms

    def mark_closed(self) -> list[LogSegment] | None:
        """Refuse further work; the segments to close, or None when already closed."""
        with self.lock:
            if self.closed:
                return None
            self.closed = True
            return list(self._segments)

    # ------------------------------------------------------------------ invariants

    def check_invariants(self, *, full: bool = True) -> None:
        """The offset invariants; `full` also walks the segment list."""
        segments = self._segments
        invariant(segments, "a log always has an active segment")
        start = self.log_start_offset
        if segments[0].base_offset > start:
            raise InvariantError(f"log start {start} below the first segment {self._bases[0]}")
        if not start <= self.recovery_point <= self.log_end_offset:
            raise InvariantError(
                f"need log start {start} <= recovery point "
                f"{self.recovery_point} <= log end {self.log_end_offset}"
            )
        if full:
            invariant(self._bases == [s.base_offset for s in segments], "segment index stale")
            for previous, segment in itertools.pairwise(segments):
                if previous.next_offset > segment.base_offset:
                    raise InvariantError(f"segments overlap: {previous} and {segment}")
