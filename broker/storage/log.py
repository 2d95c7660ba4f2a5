"""The log of one partition replica, as Kafka's UnifiedLog: its segments (LocalLog,
local_log.py) plus what gives the bytes meaning, the leader-epoch cache and the
producer state.

Files, in the partition directory `<topic>-<partition>/`: the segments (`.log`,
`.index`, `.timeindex`, segment.py), `leader-epoch-checkpoint` (epoch_cache.py),
`*.snapshot` producer state (producer_state.py) and `partition.metadata` (the topic
id, partition_metadata.py); loading and recovery are described in log_loader.py.
Offsets (log start, log end, recovery point) are kept by LocalLog.

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
a worker thread (LocalLog's lock guards what it reads). Given a `SerialWriter`,
the producer snapshot of a roll is encoded on the loop and written (temp file, fsync,
rename, fsync the directory) on the writer's thread; every later step that reads,
deletes or replaces snapshots (truncation, retention, close) first waits for the
pending writes, so they keep their order. A snapshot lost to a crash before it is
written costs only a longer replay of batch headers at the next open.
"""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable
from concurrent.futures import Executor
from concurrent.futures import Future
from pathlib import Path
from typing import Concatenate
from typing import ParamSpec
from typing import TypeVar

from broker.storage.epoch_cache import LeaderEpochFileCache
from broker.storage.errors import InvalidAppendError
from broker.storage.errors import StorageError
from broker.storage.file_handles import FileHandleCache
from broker.storage.local_log import LocalLog
from broker.storage.local_log import current_ms
from broker.storage.log_append import EMPTY_APPEND
from broker.storage.log_append import AppendInfo
from broker.storage.log_append import appended
from broker.storage.log_append import duplicate_append
from broker.storage.log_append import stamp_batches
from broker.storage.log_append import validate_client_batches
from broker.storage.log_append import validate_leader_batches
from broker.storage.log_config import LogConfig
from broker.storage.log_dir_failure import LogDirFailureChannel
from broker.storage.log_loader import DeferredSync
from broker.storage.log_loader import LogLoader
from broker.storage.log_truncation import LogTruncation
from broker.storage.partition_metadata import read_topic_id
from broker.storage.partition_metadata import write_topic_id
from broker.storage.producer_snapshots import ProducerSnapshots
from broker.storage.producer_state import LeaderAppendCheck
from broker.storage.producer_state import ProducerStateManager
from broker.storage.segment import LogSegment
from protocol.errors import InvalidRecordError
from protocol.invariants import invariant
from protocol.records.batch_format import first_batch_epoch
from runtime.fileio import SerialWriter

logger = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2  # ListOffsets sentinels, as in Kafka
LATEST_TIMESTAMP = -1

TopicPartition = tuple[str, int]


def parse_topic_partition(dir: Path) -> TopicPartition:
    """(topic, partition) from a `<topic>-<partition>` directory name; topics may hold '-'."""
    topic, sep, partition = Path(dir).name.rpartition("-")
    if not sep or not topic or not partition.isdigit() or not partition.isascii():
        raise StorageError(
            f"log directory name {Path(dir).name!r} is not <topic>-<partition> ({dir})"
        )
    return topic, int(partition)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _touches_disk(
    operation: str,
) -> Callable[[Callable[Concatenate[Log, _P], _R]], Callable[Concatenate[Log, _P], _R]]:
    """A Log method that reads or writes files: refused once the data directory is
    offline, and an OSError in it takes the directory offline (LogDirFailureError),
    except running out of file descriptors (FileOpenError, this partition only)."""

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
                raise channel.error_for(f"{operation} of log {self._name}", exc) from exc

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
        handles: FileHandleCache | None = None,
    ) -> None:
        self._dir = dir
        self._topic_id = topic_id
        # Shared by every log of the data directory (the LogManager's).
        self._dir_failure = dir_failure or LogDirFailureChannel(dir.parent)
        # The replica's parts, fixed for its life: read them, never replace them.
        self.topic_partition: TopicPartition = parse_topic_partition(dir)
        self._name = f"{self.topic_partition[0]}-{self.topic_partition[1]}"
        self._local = LocalLog(
            dir,
            config,
            segments,
            name=self._name,
            log_start_offset=log_start_offset,
            recovery_point=recovery_point,
            now_ms=now_ms,
            on_roll=self._on_roll,
            handles=handles,
        )
        self.epoch_cache: LeaderEpochFileCache = epoch_cache
        if producer_state is None:
            producer_state = ProducerStateManager(dir, name=self._name)
            producer_state.load(log_start_offset, self.log_end_offset, self._local.iter_headers)
        self.producer_state: ProducerStateManager = producer_state
        self._snapshots = ProducerSnapshots(producer_state, writer, self._name)
        self._truncation = LogTruncation(
            self._local, epoch_cache, producer_state, self._snapshots, self._name
        )

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
        handles: FileHandleCache | None = None,
        deferred_sync: DeferredSync | None = None,
    ) -> Log:
        """Open (creating if needed) and, after an unclean shutdown, recover the log in
        `dir`. See log_loader.py for the procedure (and `deferred_sync`)."""
        dir = Path(dir)
        topic, partition = parse_topic_partition(dir)
        dir.mkdir(parents=True, exist_ok=True)
        now = current_ms() if now_ms is None else now_ms
        topic_id = read_topic_id(dir)
        loaded = LogLoader(
            dir,
            name=f"{topic}-{partition}",
            index_interval_bytes=config.index_interval_bytes,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            had_clean_shutdown=had_clean_shutdown,
            now_ms=now,
            handles=handles,
            deferred_sync=deferred_sync,
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
            handles=handles,
        )
        log.producer_state.remove_expired(now)
        logger.info(
            "[Log %s] opened: log start %d, log end %d, recovery point %d, %d segment(s), "
            "latest epoch %d",
            log._name,
            log.log_start_offset,
            log.log_end_offset,
            log.recovery_point,
            len(log._local.segments),
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
        return self._local.config

    def update_config(self, config: LogConfig) -> None:
        """New settings apply from now on (existing segments keep their index spacing)."""
        self._local.config = config

    @property
    def log_start_offset(self) -> int:
        return self._local.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._local.log_end_offset

    @property
    def recovery_point(self) -> int:
        return self._local.recovery_point

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._local.segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._local.segments[-1]

    @property
    def size_in_bytes(self) -> int:
        return self._local.size_in_bytes

    @property
    def unflushed_messages(self) -> int:
        """Offsets appended since the last flush (what flush.messages compares)."""
        return self.log_end_offset - self._local.recovery_point

    @property
    def last_flush_ms(self) -> int:
        return self._local.last_flush_ms

    # ------------------------------------------------------------------ appends

    @_touches_disk("append")
    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        *,
        now_ms: int | None = None,
        in_place: bool = False,
    ) -> AppendInfo:
        """Validate, assign offsets from the LEO, stamp `leader_epoch`, append.

        A client's batches are validated in full, records included, as Kafka's
        LogValidator does (validate_produce_batches), so nothing a reader would trip
        on is stored: InvalidRecordError (records that break the format's rules) and
        CorruptRecordError (bad length, magic, CRC or compressed data) propagate for
        the caller to answer INVALID_RECORD / CORRUPT_MESSAGE; RecordTooLargeError for
        a batch over max.message.bytes. Nothing is appended unless every batch passes.

        `in_place`: `records` is writable memory no one else reads (a request read into
        its own buffer, protocol/framing.py), stamped and written as it is; otherwise
        a copy is.
        """
        self._check_open()
        if in_place:
            invariant(
                isinstance(records, memoryview) and not records.readonly,
                "records stamped in place are writable memory",
            )
            buf: bytearray | memoryview = records  # type: ignore[assignment]
        else:
            buf = bytearray(records)  # the copy that is stamped and written, walked first
        batches = validate_client_batches(buf, self._local.config.max_message_bytes)
        if leader_epoch < 0:
            raise ValueError(f"leader epoch must be >= 0, got {leader_epoch}")
        if leader_epoch < self.epoch_cache.latest_epoch:
            raise StorageError(
                f"[Log {self._name}] refusing a leader append in epoch {leader_epoch}: the log "
                f"already has epoch {self.epoch_cache.latest_epoch} (a deposed leader?)"
            )
        first_offset = self.log_end_offset
        stamped = stamp_batches(buf, batches, first_offset, leader_epoch)
        # Idempotence (KIP-98): checked after offsets are assigned, before any write;
        # raises ProducerStateError. A retried batch is answered, not written.
        check: LeaderAppendCheck | None = None
        if any(header.producer_id >= 0 for _, header in stamped):
            check = self.producer_state.prepare_leader_append(h for _, h in stamped)
            if check.duplicate is not None:
                if len(stamped) > 1:
                    # Answering the set as that duplicate would drop the other batches.
                    dup = check.duplicate
                    raise InvalidRecordError(
                        f"[Log {self._name}] a record set of {len(stamped)} batches holds "
                        f"a retry of a batch already written at offset {dup.first_offset} "
                        "(same producer id and sequences): send a retry alone, one batch "
                        "per partition (as Kafka requires); nothing was written"
                    )
                return duplicate_append(check.duplicate)
        # Normally a no-op: the leader assigned (epoch, LEO) when it took over.
        self.epoch_cache.assign(leader_epoch, first_offset)
        self.epoch_cache.ensure_written()
        self._local.append(memoryview(buf), stamped, current_ms() if now_ms is None else now_ms)
        if check is not None:
            self.producer_state.commit(check, self.log_end_offset)
        else:
            self.producer_state.map_end_offset = self.log_end_offset
        return appended(stamped, len(buf))

    @_touches_disk("leader epoch checkpoint")
    def assign_epoch_at_end(self, epoch: int) -> None:
        """KIP-101: a new leader's epoch starts at the log end offset (written to the
        leader-epoch checkpoint before any batch of the epoch is appended)."""
        self.epoch_cache.assign(epoch, self.log_end_offset, write_now=False)

    def write_epoch_checkpoint_in_background(self, executor: Executor) -> Future[None] | None:
        """Write an unwritten leader-epoch change (a new leader's epoch) on a thread of
        `executor`; the next append settles it (epoch_cache.py). None: nothing to write."""
        return self.epoch_cache.write_in_background(executor)

    def learn_epochs_ahead(
        self,
        records: bytes | bytearray | memoryview,
        executor: Executor,
        *,
        max_epoch: int | None = None,
    ) -> Future[None] | None:
        """A follower's step before `append_as_follower`, when the leader's first batch
        carries an epoch this log's cache does not end with: validate the batches as the
        append will, record their epochs in the cache and write its checkpoint on a
        thread of `executor`, so that the append finds it on disk and no fsync stalls the
        event loop. None when there is nothing to write; invalid batches change nothing
        (the append refuses them)."""
        epoch = first_batch_epoch(records)
        if (
            epoch is None
            or epoch == self.epoch_cache.latest_epoch
            or self._local.closed
            or self._dir_failure.failure is not None
        ):
            return None
        log_end = self.log_end_offset
        try:
            batches = validate_leader_batches(
                self._name, records, log_end, self._local.last_batch_epoch(), max_epoch
            )
        except InvalidAppendError:
            return None
        if self.epoch_cache.latest_epoch > epoch:
            return None  # a truncation of our claims first: written now, by the append
        for _, header in batches:
            self.epoch_cache.learn_from_leader(
                header.partition_leader_epoch, header.base_offset, log_end, write_now=False
            )
        return self.epoch_cache.write_in_background(executor)

    @_touches_disk("append")
    def append_as_follower(
        self,
        records: bytes | bytearray | memoryview,
        *,
        now_ms: int | None = None,
        max_epoch: int | None = None,
    ) -> AppendInfo:
        """Append the leader's batches as they are (offsets and epochs already stamped).

        Raises InvalidAppendError for a corrupt batch, a base offset below the LEO or
        not above the previous batch, leader epochs going backwards, or one above
        `max_epoch` (the epoch of the leader they came from).
        """
        self._check_open()
        if not records:
            return EMPTY_APPEND
        log_end = self.log_end_offset
        batches = validate_leader_batches(
            self._name, records, log_end, self._local.last_batch_epoch(), max_epoch
        )
        for _, header in batches:
            self.epoch_cache.learn_from_leader(
                header.partition_leader_epoch, header.base_offset, log_end
            )
        self.epoch_cache.ensure_written()
        self._local.append(memoryview(records), batches, current_ms() if now_ms is None else now_ms)
        # A new leader must deduplicate the retries of batches it only replicated.
        self.producer_state.apply_replicated(h for _, h in batches)
        return appended(batches, len(records))

    # ------------------------------------------------------------------ rolling

    @_touches_disk("roll")
    def roll(self, *, now_ms: int | None = None) -> LogSegment:
        """Start a new active segment at the LEO (no-op when the active one is empty)."""
        self._check_open()
        return self._local.roll_to(self.log_end_offset, current_ms() if now_ms is None else now_ms)

    @_touches_disk("roll")
    def maybe_roll(self, incoming_bytes: int = 0, *, now_ms: int | None = None) -> LogSegment:
        """Roll when the active segment is non-empty and either `incoming_bytes` more
        would pass segment.bytes or it is older than segment.ms."""
        self._check_open()
        return self._local.maybe_roll(incoming_bytes, current_ms() if now_ms is None else now_ms)

    def _on_roll(self) -> None:
        self._snapshots.take(in_background=True)

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
        return self._local.read(start_offset, max_bytes, max_offset, min_one_batch)

    @_touches_disk("timestamp lookup")
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record at or after the log
        start whose timestamp is >= `timestamp` (found inside its batch, as Kafka
        does), or None. Kafka's sentinels -2
        (earliest) and -1 (latest) answer (log start | LEO, -1, epoch)."""
        if timestamp == EARLIEST_TIMESTAMP:
            start = self._local.log_start_offset
            epoch = self.epoch_cache.epoch_for_offset(start)
            return start, -1, -1 if epoch is None else epoch
        if timestamp == LATEST_TIMESTAMP:
            return self.log_end_offset, -1, self.epoch_cache.latest_epoch
        if timestamp < 0:
            raise ValueError(f"invalid timestamp {timestamp}")
        return self._local.offset_for_timestamp(timestamp)

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
        return self._truncation.truncate_to(offset)

    @_touches_disk("truncation")
    def truncate_fully_and_start_at(self, offset: int, *, now_ms: int | None = None) -> None:
        """Delete everything and restart the log empty at `offset` (a follower whose log
        is entirely below or above the leader's). Clears the epoch cache."""
        self._check_open()
        self._truncation.truncate_fully_and_start_at(offset, now_ms)

    # ------------------------------------------------------------------ retention

    @_touches_disk("retention")
    def delete_old_segments(self, *, high_watermark: int, now_ms: int) -> int:
        """Delete the oldest segments breaching retention.ms or retention.bytes, or
        wholly below the log start offset. Only whole segments entirely below the high
        watermark, never the active one. Returns how many were deleted."""
        self._check_open()
        return self._truncation.delete_old_segments(high_watermark, now_ms)

    @_touches_disk("record deletion")
    def delete_records_before(self, offset: int, *, high_watermark: int | None = None) -> int:
        """Advance the log start offset to `offset` (DeleteRecords), deleting the whole
        segments below it. The log start moves exactly to `offset`, which may be inside
        a batch: reads from it still return that whole batch and consumers skip the
        records below. Returns the new log start offset."""
        self._check_open()
        return self._truncation.delete_records_before(offset, high_watermark, self.roll)

    # ------------------------------------------------------------------ durability

    @_touches_disk("flush")
    def flush(self, up_to: int | None = None, *, now_ms: int | None = None) -> None:
        """fsync the segments holding data below `up_to` (default: the LEO) and advance
        the recovery point. Safe on a worker thread while the event loop appends."""
        self._local.flush(up_to, now_ms)

    def close(self, *, snapshot: bool = True) -> None:
        """Close the segments; with `snapshot` (a clean shutdown) first write the
        producer state at the log end, so the next open replays nothing."""
        segments = self._local.mark_closed()
        if segments is None:
            return
        self.epoch_cache.settle()  # no thread writes its checkpoint past this point
        self._snapshots.wait()
        online = self._dir_failure.failure is None  # else nothing is written any more
        if snapshot and online:
            self._snapshots.take()
        if online:
            try:
                self.epoch_cache.ensure_written()  # a new leader's epoch, never appended to
            except (OSError, StorageError) as exc:
                logger.warning("[Log %s] leader-epoch checkpoint not written: %s", self._name, exc)
        for segment in segments:
            segment.close(final_time_entry=online)

    def delete(self) -> None:
        """Close and remove the whole directory."""
        self.close(snapshot=False)
        shutil.rmtree(self._dir, ignore_errors=False)

    def _check_open(self) -> None:
        if self._local.closed:
            raise StorageError(f"[Log {self._name}] the log is closed")

    def __repr__(self) -> str:
        return (
            f"Log({self._name}, start={self.log_start_offset}, end={self.log_end_offset}, "
            f"segments={len(self._local.segments)})"
        )
