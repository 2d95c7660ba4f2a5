"""The log of one partition replica: an ordered list of segments plus its epoch cache.

On-disk layout and loading are described in log_loader.py, segment files in
segment.py, the epoch checkpoint in epoch_cache.py.

Offsets: `log_start_offset` is the first offset a reader may ask for,
`log_end_offset` (LEO) is one past the last offset written, `recovery_point` is the
offset below which the data is known to be fsynced. Always
log_start_offset <= recovery_point <= log_end_offset, and the segments are sorted by
base offset with the last one, the active segment, taking the appends.

The leader assigns offsets from the LEO and stamps them with its leader epoch into
the batch headers in place; a follower appends the leader's batches as they are.
Either way the epoch cache learns a new epoch BEFORE the batches that carry it reach
the segment, so the checkpoint on disk is never behind the log. The LEO only goes
back through `truncate_to` / `truncate_fully_and_start_at`.

Idempotent producers (producer_state.py): a leader append checks the batches that
carry a producer id before anything is written (ProducerStateError, or a duplicate
answered with the original offsets, `AppendInfo.duplicate`); follower appends feed the
same state; truncation rolls it back (last snapshot at or below the new end, then the
batch headers after it); a snapshot is written at every roll and at a clean close.

Threading: everything runs on the event-loop thread except `flush`, which may run on
a worker thread; the segment list, recovery point and log start offset change under
`self._lock`, and the fsyncs themselves happen outside it. Given a `SerialWriter`,
the producer snapshot of a roll is encoded on the loop and written (temp file, fsync,
rename, fsync the directory) on the writer's thread; every later step that reads,
deletes or replaces snapshots (truncation, retention, close) first waits for the
pending writes, so they keep their order. A snapshot lost to a crash before it is
written costs only a longer replay of batch headers at the next open.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Concatenate, NamedTuple, ParamSpec, TypeVar

from broker.storage.epoch_cache import LeaderEpochFileCache
from broker.storage.errors import (
    InvalidAppendError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from broker.storage.log_config import LogConfig
from broker.storage.log_dir_failure import LogDirFailureChannel
from broker.storage.log_loader import LogLoader
from broker.storage.offset_index import INT32_MAX
from broker.storage.partition_metadata import read_topic_id, write_topic_id
from broker.storage.producer_state import LeaderAppendCheck, ProducerStateManager
from broker.storage.segment import LogSegment
from protocol.errors import CorruptRecordError
from protocol.record_batch import BatchHeader, check_produce_batches, stamp, validate_batches
from runtime.fileio import SerialWriter, atomic_write, fsync_directory

logger = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2  # ListOffsets sentinels, as in Kafka
LATEST_TIMESTAMP = -1

TopicPartition = tuple[str, int]


class AppendInfo(NamedTuple):
    """What an append wrote. Offsets are -1 for an empty follower append."""

    first_offset: int
    last_offset: int
    log_append_time: int  # -1: batches keep their CreateTime timestamps
    max_timestamp: int
    valid_bytes: int
    batch_count: int
    # True: an idempotent producer's retry; nothing was written and the offsets are
    # those of the original append.
    duplicate: bool = False


_EMPTY_APPEND = AppendInfo(-1, -1, -1, -1, 0, 0)


def parse_topic_partition(dir: Path) -> TopicPartition:
    """(topic, partition) from a `<topic>-<partition>` directory name; topics may hold '-'."""
    topic, sep, partition = Path(dir).name.rpartition("-")
    if not sep or not topic or not partition.isdigit() or not partition.isascii():
        raise StorageError(
            f"log directory name {Path(dir).name!r} is not <topic>-<partition> ({dir})"
        )
    return topic, int(partition)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _touches_disk(
    operation: str,
) -> Callable[[Callable[Concatenate[Log, _P], _R]], Callable[Concatenate[Log, _P], _R]]:
    """A Log method that reads or writes files: refused once the data directory is
    offline, and an OSError in it takes the directory offline (LogDirFailureError)."""

    def decorate(method: Callable[Concatenate[Log, _P], _R]) -> Callable[Concatenate[Log, _P], _R]:
        @functools.wraps(method)
        def guarded(self: Log, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            # LogDirFailureChannel.guard inlined: appends and reads are the hot path.
            channel = self._dir_failure
            if channel.failure is not None:
                raise channel.failure
            try:
                return method(self, *args, **kwargs)
            except OSError as exc:
                raise channel.fail(f"{operation} of log {self._name}", exc) from exc

        return guarded

    return decorate


class Log:
    """One partition replica's log. Build it with `Log.open`."""

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        segments: list[LogSegment],
        epoch_cache: LeaderEpochFileCache,
        *,
        log_start_offset: int,
        recovery_point: int,
        now_ms: int,
        producer_state: ProducerStateManager | None = None,
        writer: SerialWriter | None = None,
        dir_failure: LogDirFailureChannel | None = None,
        topic_id: str | None = None,
    ) -> None:
        self._dir = dir
        self._topic_id = topic_id
        self._writer = writer
        # Shared by every log of the data directory (the LogManager's).
        self._dir_failure = dir_failure or LogDirFailureChannel(dir.parent)
        self._pending_snapshots: list[Future[object]] = []
        self._config = config
        self._topic_partition = parse_topic_partition(dir)
        self._name = f"{self._topic_partition[0]}-{self._topic_partition[1]}"
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self._epoch_cache = epoch_cache
        self._log_start_offset = log_start_offset
        self._recovery_point = recovery_point
        self._lock = threading.Lock()
        self._last_flush_ms = now_ms
        self._truncations = 0  # lets a concurrent flush see that the log went back
        self._dir_dirty = False  # segments created or removed since the last flush
        self._closed = False
        self._check_invariants()
        if producer_state is None:
            producer_state = ProducerStateManager(dir, name=self._name)
            producer_state.load(self._log_start_offset, self.log_end_offset, self._iter_headers)
        self._producer_state = producer_state

    @classmethod
    def open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        had_clean_shutdown: bool,
        now_ms: int | None = None,
        writer: SerialWriter | None = None,
        dir_failure: LogDirFailureChannel | None = None,
    ) -> Log:
        """Open (creating if needed) and, after an unclean shutdown, recover the log in
        `dir`. See log_loader.py for the procedure."""
        dir = Path(dir)
        topic, partition = parse_topic_partition(dir)
        dir.mkdir(parents=True, exist_ok=True)
        now = _now_ms() if now_ms is None else now_ms
        topic_id = read_topic_id(dir)
        loaded = LogLoader(
            dir,
            name=f"{topic}-{partition}",
            index_interval_bytes=config.index_interval_bytes,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            had_clean_shutdown=had_clean_shutdown,
            now_ms=now,
        ).load()
        log = cls(
            dir,
            config,
            loaded.segments,
            loaded.epoch_cache,
            log_start_offset=loaded.log_start_offset,
            recovery_point=loaded.recovery_point,
            now_ms=now,
            writer=writer,
            dir_failure=dir_failure,
            topic_id=topic_id,
        )
        log._producer_state.remove_expired(now)
        logger.info(
            "[Log %s] opened: log start %d, log end %d, recovery point %d, %d segment(s), "
            "latest epoch %d",
            log._name,
            log.log_start_offset,
            log.log_end_offset,
            log.recovery_point,
            len(log._segments),
            log.latest_epoch,
        )
        return log

    # ------------------------------------------------------------------ state

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def topic_id(self) -> str | None:
        """The topic id in `partition.metadata`; None for a directory an older version
        wrote (or one created and never assigned)."""
        return self._topic_id

    def assign_topic_id(self, topic_id: str) -> None:
        """Record the topic id this replica belongs to (durably, before any append
        of the topic's data). A log never changes topic: another id raises."""
        if self._topic_id == topic_id:
            return
        if self._topic_id is not None:
            raise StorageError(
                f"log {self._dir} belongs to topic id {self._topic_id}, not {topic_id}"
            )
        write_topic_id(self._dir, topic_id)
        self._topic_id = topic_id

    @property
    def config(self) -> LogConfig:
        return self._config

    def update_config(self, config: LogConfig) -> None:
        """New settings apply from now on (existing segments keep their index spacing)."""
        self._config = config

    @property
    def topic_partition(self) -> TopicPartition:
        return self._topic_partition

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def epoch_cache(self) -> LeaderEpochFileCache:
        return self._epoch_cache

    @property
    def producer_state(self) -> ProducerStateManager:
        return self._producer_state

    @property
    def latest_epoch(self) -> int:
        return self._epoch_cache.latest_epoch

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_in_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    @property
    def unflushed_messages(self) -> int:
        """Offsets appended since the last flush (what flush.messages compares)."""
        return self.log_end_offset - self._recovery_point

    @property
    def last_flush_ms(self) -> int:
        return self._last_flush_ms

    # ------------------------------------------------------------------ appends

    @_touches_disk("append")
    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        *,
        now_ms: int | None = None,
    ) -> AppendInfo:
        """Validate, assign offsets from the LEO, stamp `leader_epoch`, append.

        A client's batches are validated in full, records included, as Kafka's
        LogValidator does (validate_produce_batches), so nothing a reader would trip
        on is stored: InvalidRecordError (records that break the format's rules) and
        CorruptRecordError (bad length, magic, CRC or compressed data) propagate for
        the caller to answer INVALID_RECORD / CORRUPT_MESSAGE; RecordTooLargeError for
        a batch over max.message.bytes. Nothing is appended unless every batch passes.
        """
        self._check_open()
        buf = bytearray(records)  # the copy that is stamped and written, walked first
        batches = validate_batches(buf)
        for _, header in batches:
            if header.size > self._config.max_message_bytes:
                raise RecordTooLargeError(header.size, self._config.max_message_bytes)
        check_produce_batches(buf, batches)
        if leader_epoch < 0:
            raise ValueError(f"leader epoch must be >= 0, got {leader_epoch}")
        if leader_epoch < self._epoch_cache.latest_epoch:
            raise StorageError(
                f"[Log {self._name}] refusing a leader append in epoch {leader_epoch}: the log "
                f"already has epoch {self._epoch_cache.latest_epoch} (a deposed leader?)"
            )
        first_offset = offset = self.log_end_offset
        stamped: list[tuple[int, BatchHeader]] = []
        for position, header in batches:
            stamp(buf, position, offset, leader_epoch)
            stamped.append(
                (position, header._replace(base_offset=offset, partition_leader_epoch=leader_epoch))
            )
            offset += header.last_offset_delta + 1
        # Idempotence (KIP-98): checked after offsets are assigned, before any write;
        # raises ProducerStateError. A retried batch is answered, not written.
        check: LeaderAppendCheck | None = None
        if any(header.producer_id >= 0 for _, header in stamped):
            check = self._producer_state.prepare_leader_append(h for _, h in stamped)
            if check.duplicate is not None:
                dup = check.duplicate
                return AppendInfo(
                    first_offset=dup.first_offset,
                    last_offset=dup.last_offset,
                    log_append_time=-1,
                    max_timestamp=dup.timestamp,
                    valid_bytes=0,
                    batch_count=0,
                    duplicate=True,
                )
        # Normally a no-op: the leader assigned (epoch, LEO) when it took over.
        self._epoch_cache.assign(leader_epoch, first_offset)
        info = self._append(buf, stamped, _now_ms() if now_ms is None else now_ms)
        if check is not None:
            self._producer_state.commit(check, self.log_end_offset)
        else:
            self._producer_state.map_end_offset = self.log_end_offset
        return info

    @_touches_disk("leader epoch checkpoint")
    def assign_epoch_at_end(self, epoch: int) -> None:
        """KIP-101: a new leader's epoch starts at the log end offset (written to the
        leader-epoch checkpoint before any batch of the epoch is appended)."""
        self._epoch_cache.assign(epoch, self.log_end_offset)

    @_touches_disk("append")
    def append_as_follower(
        self, records: bytes | bytearray | memoryview, *, now_ms: int | None = None
    ) -> AppendInfo:
        """Append the leader's batches as they are (offsets and epochs already stamped).

        Raises InvalidAppendError for a corrupt batch, a base offset below the LEO or
        not above the previous batch, or leader epochs going backwards.
        """
        self._check_open()
        if not records:
            return _EMPTY_APPEND
        try:
            batches = validate_batches(records)
        except CorruptRecordError as exc:
            raise InvalidAppendError(
                f"[Log {self._name}] corrupt batch from the leader: {exc}"
            ) from exc
        next_offset = self.log_end_offset
        epoch = self._last_batch_epoch()
        for _, header in batches:
            if header.base_offset < next_offset:
                raise InvalidAppendError(
                    f"[Log {self._name}] batch base offset {header.base_offset} is below "
                    f"{next_offset} (log end offset {self.log_end_offset}): offsets must "
                    "strictly increase from the log end; truncate first"
                )
            if header.partition_leader_epoch < 0:
                raise InvalidAppendError(
                    f"[Log {self._name}] batch at offset {header.base_offset} carries no "
                    f"leader epoch ({header.partition_leader_epoch})"
                )
            if header.partition_leader_epoch < epoch:
                raise InvalidAppendError(
                    f"[Log {self._name}] batch at offset {header.base_offset} has leader epoch "
                    f"{header.partition_leader_epoch}, below the log's {epoch}"
                )
            next_offset = header.next_offset
            epoch = header.partition_leader_epoch
        for _, header in batches:
            self._learn_epoch(header.partition_leader_epoch, header.base_offset)
        info = self._append(memoryview(records), batches, _now_ms() if now_ms is None else now_ms)
        # A new leader must deduplicate the retries of batches it only replicated.
        self._producer_state.apply_replicated(h for _, h in batches)
        return info

    def _learn_epoch(self, epoch: int, base_offset: int) -> None:
        """Record a follower batch's epoch in the cache before the batch lands."""
        cache = self._epoch_cache
        if epoch < cache.latest_epoch:
            # Our newer entries start at or past the LEO: claims of epochs in which this
            # replica wrote nothing. The leader's lineage replaces them.
            cache.truncate_from_end(self.log_end_offset)
        if epoch >= cache.latest_epoch:
            cache.assign(epoch, base_offset)

    def _last_batch_epoch(self) -> int:
        for segment in reversed(self._segments):
            if not segment.is_empty:
                return segment.last_epoch
        return -1

    def _append(
        self,
        buf: bytearray | memoryview,
        batches: list[tuple[int, BatchHeader]],
        now_ms: int,
    ) -> AppendInfo:
        """Write validated batches, rolling segments where needed; one write per run."""
        view = memoryview(buf)
        log_end = self.log_end_offset
        assert batches[0][1].base_offset >= log_end, "appended offsets must strictly increase"
        segment = self._segments[-1]
        run: list[BatchHeader] = []
        run_start = 0
        run_bytes = 0
        for position, header in batches:
            if self._should_roll(segment, header, run, run_bytes, now_ms):
                if run:
                    segment.append(view[run_start : run_start + run_bytes], run)
                    run, run_bytes = [], 0
                segment = self._roll_to(header.base_offset, now_ms)
            if not run:
                run_start = position
            run.append(header)
            run_bytes += header.size
        segment.append(view[run_start : run_start + run_bytes], run)
        last = batches[-1][1]
        assert self.log_end_offset == last.next_offset > log_end, "LEO must move forward"
        self._check_invariants(full=False)
        return AppendInfo(
            first_offset=batches[0][1].base_offset,
            last_offset=last.last_offset,
            log_append_time=-1,
            max_timestamp=max(header.max_timestamp for _, header in batches),
            valid_bytes=len(view),
            batch_count=len(batches),
        )

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
            size + header.size > self._config.segment_bytes
            or now_ms - segment.created_ms > self._config.segment_ms
            or header.last_offset - segment.base_offset > INT32_MAX
        )

    # ------------------------------------------------------------------ rolling

    @_touches_disk("roll")
    def roll(self, *, now_ms: int | None = None) -> LogSegment:
        """Start a new active segment at the LEO (no-op when the active one is empty)."""
        self._check_open()
        return self._roll_to(self.log_end_offset, _now_ms() if now_ms is None else now_ms)

    @_touches_disk("roll")
    def maybe_roll(self, incoming_bytes: int = 0, *, now_ms: int | None = None) -> LogSegment:
        """Roll when the active segment is non-empty and either `incoming_bytes` more
        would pass segment.bytes or it is older than segment.ms."""
        self._check_open()
        now = _now_ms() if now_ms is None else now_ms
        segment = self._segments[-1]
        if segment.size and (
            segment.size + incoming_bytes > self._config.segment_bytes
            or now - segment.created_ms > self._config.segment_ms
        ):
            return self._roll_to(self.log_end_offset, now)
        return segment

    def _roll_to(self, base_offset: int, now_ms: int) -> LogSegment:
        active = self._segments[-1]
        assert base_offset >= active.next_offset, "a new segment cannot start inside the log"
        if active.is_empty and active.base_offset == base_offset:
            return active
        segment = LogSegment.create(
            self._dir,
            base_offset,
            index_interval_bytes=self._config.index_interval_bytes,
            now_ms=now_ms,
        )
        with self._lock:
            if active.is_empty:
                # An empty active segment at the wrong base (a follower gap) is replaced.
                self._segments.pop()
                self._bases.pop()
                if not self._segments:
                    # The log was empty: it now starts where the leader's data starts.
                    self._log_start_offset = base_offset
                    self._recovery_point = max(self._recovery_point, base_offset)
            self._segments.append(segment)
            self._bases.append(base_offset)
            self._dir_dirty = True
        if active.is_empty:
            active.delete()
        else:
            active.on_become_inactive()
            self._snapshot_producer_state(in_background=True)
        logger.info("[Log %s] rolled new segment at offset %d", self._name, base_offset)
        return segment

    # ------------------------------------------------------------------ reads

    @_touches_disk("read")
    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> bytes | memoryview:
        """Whole batches from the one containing `start_offset`, possibly spanning
        segments: at most `max_bytes` (but the first batch whole when `min_one_batch`,
        KIP-74), none whose base offset is >= `max_offset` (exclusive, the high
        watermark for consumers). b"" at the LEO; OffsetOutOfRangeError outside
        [log_start_offset, log_end_offset]. A read within one segment is the buffer
        pread returned, or a memoryview of it when cut: never copied."""
        log_end = self.log_end_offset
        if start_offset == log_end:
            return b""
        if not self._log_start_offset <= start_offset < log_end:
            raise OffsetOutOfRangeError(start_offset, self._log_start_offset, log_end)
        if max_offset is not None and start_offset >= max_offset:
            return b""  # e.g. a consumer already at the high watermark
        segments = self._segments
        index = max(0, bisect.bisect_right(self._bases, start_offset) - 1)
        parts: list[bytes | memoryview] = []
        remaining = max_bytes
        offset = start_offset
        for segment in itertools.islice(segments, index, None):
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

    @_touches_disk("timestamp lookup")
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first batch whose max timestamp is
        >= `timestamp`, or None. The offset is the batch's base offset (the broker does
        not look inside batches), raised to the log start. Kafka's sentinels -2
        (earliest) and -1 (latest) answer (log start | LEO, -1, epoch)."""
        if timestamp == EARLIEST_TIMESTAMP:
            epoch = self._epoch_cache.epoch_for_offset(self._log_start_offset)
            return self._log_start_offset, -1, -1 if epoch is None else epoch
        if timestamp == LATEST_TIMESTAMP:
            return self.log_end_offset, -1, self._epoch_cache.latest_epoch
        if timestamp < 0:
            raise ValueError(f"invalid timestamp {timestamp}")
        for segment in self._segments:
            if segment.next_offset <= self._log_start_offset:
                continue
            if segment.max_timestamp >= timestamp:
                found = segment.find_offset_by_timestamp(timestamp, self._log_start_offset)
                if found is not None:
                    return found
        return None

    # ------------------------------------------------------------------ truncation

    @_touches_disk("truncation")
    def truncate_to(self, offset: int) -> bool:
        """Remove every offset >= `offset`; returns whether any data was removed.

        Segments are cut at batch boundaries: if `offset` falls inside a batch, that
        whole batch goes too and the LEO ends up below `offset`. The epoch cache drops
        entries starting at or past the new end (even when no data was removed: a
        follower reconciling with its leader must forget epochs it never wrote in).
        The truncation is fsynced before returning.
        """
        self._check_open()
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        if offset >= self.log_end_offset:
            self._epoch_cache.truncate_from_end(offset)
            return False
        if self._segments[0].base_offset > offset:
            self.truncate_fully_and_start_at(offset)
            return True
        old_end = self.log_end_offset
        with self._lock:
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
        with self._lock:
            # Counted again now that the data is cut: a flush that looked at the log
            # between the two counts saw the old end and must not advance past the new one.
            self._truncations += 1
            self._recovery_point = min(self._recovery_point, new_end)
            self._log_start_offset = min(self._log_start_offset, new_end)
        self._epoch_cache.truncate_from_end(new_end)
        # Roll the producer state back: the last snapshot at or below the new end,
        # then the batch headers after it.
        self._wait_for_snapshots()
        self._producer_state.load(self._log_start_offset, new_end, self._iter_headers)
        logger.info(
            "[Log %s] truncated from log end %d to %d (asked for %d)",
            self._name,
            old_end,
            new_end,
            offset,
        )
        self._check_invariants()
        return True

    @_touches_disk("truncation")
    def truncate_fully_and_start_at(self, offset: int, *, now_ms: int | None = None) -> None:
        """Delete everything and restart the log empty at `offset` (a follower whose log
        is entirely below or above the leader's). Clears the epoch cache."""
        self._check_open()
        if offset < 0:
            raise ValueError(f"cannot restart the log at negative offset {offset}")
        now = _now_ms() if now_ms is None else now_ms
        with self._lock:
            doomed = self._segments
            for segment in reversed(doomed):
                segment.delete()
            segment = LogSegment.create(
                self._dir,
                offset,
                index_interval_bytes=self._config.index_interval_bytes,
                now_ms=now,
            )
            self._segments = [segment]
            self._bases = [offset]
            self._log_start_offset = offset
            self._recovery_point = offset
            self._truncations += 1
        fsync_directory(self._dir)
        self._epoch_cache.clear()
        self._wait_for_snapshots()
        self._producer_state.clear(offset)
        logger.info("[Log %s] truncated fully, restarting at offset %d", self._name, offset)
        self._check_invariants()

    # ------------------------------------------------------------------ retention

    @_touches_disk("retention")
    def delete_old_segments(self, *, high_watermark: int, now_ms: int) -> int:
        """Delete the oldest segments breaching retention.ms or retention.bytes, or
        wholly below the log start offset. Only whole segments entirely below the high
        watermark, never the active one. Returns how many were deleted."""
        self._check_open()
        config = self._config
        segments = self._segments
        deletable = 0  # a prefix of segments[:-1] whose successors start <= high watermark
        while (
            deletable < len(segments) - 1 and segments[deletable + 1].base_offset <= high_watermark
        ):
            deletable += 1
        by_start = 0
        while by_start < deletable and segments[by_start + 1].base_offset <= self._log_start_offset:
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
        if count:
            reasons = [
                name
                for name, n in (
                    ("log start", by_start),
                    ("retention.ms", by_time),
                    ("retention.bytes", by_size),
                )
                if n == count
            ]
            self._delete_prefix(count, reason=" and ".join(reasons))
        self._producer_state.remove_expired(now_ms)
        return count

    @_touches_disk("record deletion")
    def delete_records_before(self, offset: int, *, high_watermark: int | None = None) -> int:
        """Advance the log start offset to `offset` (DeleteRecords), deleting the whole
        segments below it. The log start moves exactly to `offset`, which may be inside
        a batch: reads from it still return that whole batch and consumers skip the
        records below. Returns the new log start offset."""
        self._check_open()
        limit = self.log_end_offset if high_watermark is None else high_watermark
        if offset > limit or offset < 0:
            raise OffsetOutOfRangeError(offset, self._log_start_offset, limit)
        if offset <= self._log_start_offset:
            return self._log_start_offset
        if offset == self.log_end_offset and not self._segments[-1].is_empty:
            self.roll()  # every batch goes: the active segment must be deletable too
        with self._lock:
            self._log_start_offset = offset
            self._recovery_point = max(self._recovery_point, offset)
        self._epoch_cache.truncate_from_start(offset)
        self._wait_for_snapshots()
        self._producer_state.delete_snapshots_before(offset)
        count = 0
        while count < len(self._segments) - 1 and self._segments[count + 1].base_offset <= offset:
            count += 1
        if count:
            self._delete_prefix(count, reason="delete records")
        self._check_invariants()
        return self._log_start_offset

    def _delete_prefix(self, count: int, *, reason: str) -> None:
        with self._lock:
            doomed = self._segments[:count]
            del self._segments[:count]
            del self._bases[:count]
            self._log_start_offset = max(self._log_start_offset, self._segments[0].base_offset)
            self._recovery_point = max(self._recovery_point, self._log_start_offset)
            self._dir_dirty = True
        for segment in doomed:
            segment.delete()
        self._epoch_cache.truncate_from_start(self._log_start_offset)
        # A snapshot below the log start could not be replayed from any more.
        self._wait_for_snapshots()
        self._producer_state.delete_snapshots_before(self._log_start_offset)
        logger.info(
            "[Log %s] deleted %d segment(s) (%s), log start offset now %d",
            self._name,
            count,
            reason,
            self._log_start_offset,
        )
        self._check_invariants()

    # ------------------------------------------------------------------ durability

    @_touches_disk("flush")
    def flush(self, up_to: int | None = None, *, now_ms: int | None = None) -> None:
        """fsync the segments holding data below `up_to` (default: the LEO) and advance
        the recovery point. Safe on a worker thread while the event loop appends."""
        with self._lock:
            if self._closed:
                return
            log_end = self._segments[-1].next_offset
            target = log_end if up_to is None else min(up_to, log_end)
            todo = [
                segment
                for segment in self._segments
                if segment.next_offset > self._recovery_point and segment.base_offset < target
            ]
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            truncations = self._truncations
        for segment in todo:
            segment.flush()
        if dir_dirty:
            fsync_directory(self._dir)
        with self._lock:
            # A truncation meanwhile may have replaced data below `target`: then the
            # fsyncs above do not cover it and the recovery point must not move.
            if truncations == self._truncations and target > self._recovery_point:
                self._recovery_point = target
            self._last_flush_ms = _now_ms() if now_ms is None else now_ms

    def close(self, *, snapshot: bool = True) -> None:
        """Close the segments; with `snapshot` (a clean shutdown) first write the
        producer state at the log end, so the next open replays nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            segments = list(self._segments)
        self._wait_for_snapshots()
        online = self._dir_failure.failure is None  # else nothing is written any more
        if snapshot and online:
            self._snapshot_producer_state()
        for segment in segments:
            segment.close(final_time_entry=online)

    def delete(self) -> None:
        """Close and remove the whole directory."""
        self.close(snapshot=False)
        shutil.rmtree(self._dir, ignore_errors=False)

    # ------------------------------------------------------------------ producer state

    def _iter_headers(self, from_offset: int) -> Iterator[BatchHeader]:
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

    def _snapshot_producer_state(self, *, in_background: bool = False) -> None:
        if in_background and self._writer is not None:
            path, data = self._producer_state.encode_snapshot()
            self._pending_snapshots = [f for f in self._pending_snapshots if not f.done()]
            future = self._writer.submit(atomic_write, path, data)
            future.add_done_callback(self._snapshot_written)
            self._pending_snapshots.append(future)
            return
        self._wait_for_snapshots()
        try:
            self._producer_state.take_snapshot()
        except OSError as exc:
            self._snapshot_failed(exc)

    def _wait_for_snapshots(self) -> None:
        """Block until the snapshots handed to the writer are on disk (or failed)."""
        pending, self._pending_snapshots = self._pending_snapshots, []
        for future in pending:
            future.exception()  # waits; a failure was logged by _snapshot_written

    def _snapshot_written(self, future: Future[object]) -> None:
        exc = future.exception()
        if isinstance(exc, OSError):
            self._snapshot_failed(exc)
        elif exc is not None:
            logger.error("[Log %s] producer snapshot write failed: %r", self._name, exc)

    def _snapshot_failed(self, exc: OSError) -> None:
        # Not fatal: the state is rebuilt from the log headers on the next open.
        logger.warning("[Log %s] could not write a producer snapshot: %s", self._name, exc)

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"[Log {self._name}] the log is closed")

    def _check_invariants(self, *, full: bool = True) -> None:
        """Assert the offset invariants; `full` also walks the segment list."""
        assert self._segments, "a log always has an active segment"
        assert self._segments[0].base_offset <= self._log_start_offset, (
            f"log start {self._log_start_offset} below the first segment {self._bases[0]}"
        )
        assert self._log_start_offset <= self._recovery_point <= self.log_end_offset, (
            f"need log start {self._log_start_offset} <= recovery point "
            f"{self._recovery_point} <= log end {self.log_end_offset}"
        )
        if full:
            assert self._bases == [s.base_offset for s in self._segments], "segment index stale"
            for previous, segment in itertools.pairwise(self._segments):
                assert previous.next_offset <= segment.base_offset, (
                    f"segments overlap: {previous} and {segment}"
                )

    def __repr__(self) -> str:
        return (
            f"Log({self._name}, start={self._log_start_offset}, end={self.log_end_offset}, "
            f"segments={len(self._segments)})"
        )
