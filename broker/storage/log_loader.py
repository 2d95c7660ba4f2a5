"""Loading a partition directory: leftovers, segments, recovery, the epoch cache.

A partition directory `<topic>-<partition>/` holds exactly::

    <20 digits>.log, .index, .timeindex     the segments (segment.py)
    leader-epoch-checkpoint                 the epoch cache (epoch_cache.py)
    <20 digits>.snapshot                    producer state (producer_state.py)
    partition.metadata                      the topic id (partition_metadata.py)

plus, after a crash, `*.tmp` (an interrupted atomic write) and `*.deleted` (an
interrupted segment deletion) files, which are removed. Index files without their
`.log` are removed too. Any other file or directory makes the load fail with a
StorageError naming it: the broker does not guess what foreign data means.

Procedure (Kafka's LogLoader):

1. Read `leader-epoch-checkpoint`. A corrupt one is set aside (not trusted).
2. Open every segment. After a clean shutdown each one is sanity-checked (index
   structure, batches after the last index entry); after an unclean one every
   segment from the one holding the recovery point onwards is recovered: each batch
   is validated (length, magic, CRC, contiguous offsets, non-decreasing epochs that
   match the trusted epoch checkpoint) and both indexes are rebuilt. A segment
   failing its sanity check is recovered the same way. Only a torn tail is cut: the
   bytes from the first bad batch to the end of the last segment holding records,
   when no valid batch lies among them. Damage with valid records after it (a valid
   batch further on, later segments with records, or a whole CRC-valid batch out of
   place), and a segment starting inside the previous one, are refused with a
   StorageError naming the file: nothing is cut or deleted on an inference (Kafka
   cuts and deletes the later segments; a replica can then re-fetch, but a lone
   copy would lose acknowledged records).
3. The log start offset is max(checkpointed log start, first segment base offset).
   A checkpointed start past the recovered log end restarts an empty log there; with
   records in the log it is ignored (a damaged checkpoint must not delete them), and
   the log starts at its first segment.
4. The epoch cache drops entries at or past the log end offset and below the log
   start. An unreadable or missing checkpoint with a non-empty log is rebuilt from
   the partition leader epoch stamped in each batch header, with a warning.
5. After recovery every recovered segment is fsynced, so the recovery point becomes
   the log end offset. A data directory loading many logs passes a `DeferredSync`
   instead: the loader notes what it changed and the caller makes all of it durable
   with one syncfs before it checkpoints any recovery point (a fsync per file made a
   10,000-log recovery a third slower).
"""

from __future__ import annotations

import bisect
import logging
import os
import re
from dataclasses import KW_ONLY
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import NamedTuple

from broker.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT
from broker.storage.epoch_cache import EpochEntry
from broker.storage.epoch_cache import LeaderEpochCheckpointFile
from broker.storage.epoch_cache import LeaderEpochFileCache
from broker.storage.errors import CorruptCheckpointError
from broker.storage.errors import CorruptIndexError
from broker.storage.errors import CorruptSegmentError
from broker.storage.errors import StorageError
from broker.storage.file_handles import FileHandleCache
from broker.storage.partition_metadata import PARTITION_METADATA
from broker.storage.producer_state import is_snapshot_file
from broker.storage.segment import DELETED_SUFFIX
from broker.storage.segment import LOG_SUFFIX
from broker.storage.segment import SEGMENT_SUFFIXES
from broker.storage.segment import LogSegment
from runtime.fileio import TMP_SUFFIX
from runtime.fileio import fsync_directory
from runtime.fileio import sync_file_system

logger = logging.getLogger(__name__)

_SEGMENT_FILE = re.compile(
    r"^(?P<base>\d{20})(?P<suffix>"
    + "|".join(re.escape(suffix) for suffix in SEGMENT_SUFFIXES)
    + r")$"
)


class LoadedLog(NamedTuple):
    segments: list[LogSegment]
    epoch_cache: LeaderEpochFileCache
    log_start_offset: int
    recovery_point: int


class DeferredSync:
    """What the logs loaded from one data directory changed, made durable at once:
    one syncfs(2) of its file system in place of a fsync per recovered segment file
    and directory (`can_sync_file_system()` says where that holds)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.pending = 0  # logs whose changes are not durable yet

    def note(self) -> None:
        self.pending += 1

    def run(self) -> None:
        """Make every noted change durable (OSError if the disk failed)."""
        if self.pending:
            sync_file_system(self.data_dir)
            self.pending = 0


@dataclass
class LogLoader:
    """Loads (and if needed recovers) one partition directory; see the module doc."""

    dir: Path
    _: KW_ONLY
    name: str
    index_interval_bytes: int
    recovery_point: int
    log_start_offset: int
    had_clean_shutdown: bool
    now_ms: int
    handles: FileHandleCache | None = None  # None: the process-wide cache
    # None: fsync what recovery changed here and now; else the caller syncs it.
    deferred_sync: DeferredSync | None = None
    # Files were created, removed or cut: fsync the directory.
    _dir_changed: bool = field(default=False, init=False)

    def load(self) -> LoadedLog:
        bases = self._scan_directory()
        checkpoint = LeaderEpochCheckpointFile(self.dir / LEADER_EPOCH_CHECKPOINT)
        cache_problem: str | None = None
        try:
            entries = checkpoint.read()
            if entries is None:
                cache_problem = f"{checkpoint.path} is missing"
        except CorruptCheckpointError as exc:
            entries = None
            cache_problem = str(exc)
        epoch_cache = LeaderEpochFileCache(checkpoint, entries or (), name=self.name)

        segments: list[LogSegment] = []
        try:
            for base in bases:
                segments.append(
                    LogSegment.open(
                        self.dir,
                        base,
                        self.handles,
                        index_interval_bytes=self.index_interval_bytes,
                        now_ms=self.now_ms,
                    )
                )
            log_start = max(self.log_start_offset, segments[0].base_offset if segments else 0)
            recovered = self._load_segments(
                segments, epoch_cache if cache_problem is None else None, log_start
            )
            if not segments:
                segments.append(self._new_segment(log_start))
            log_end = segments[-1].next_offset
            if log_start > log_end and any(not segment.is_empty for segment in segments):
                # A checkpoint entry past the records: a damaged checkpoint, or a crash
                # while a follower restarted its log further on. Its records are not
                # deleted on that word: the log keeps them, from its first segment (a
                # follower whose leader has moved on is then answered out of range and
                # restarts its log itself).
                logger.warning(
                    "[Log %s] the checkpointed log start offset %d is past the log end "
                    "offset %d: ignored, the log keeps its records from offset %d",
                    self.name,
                    log_start,
                    log_end,
                    segments[0].base_offset,
                )
                log_start = segments[0].base_offset
            elif log_start > log_end:
                logger.warning(
                    "[Log %s] log start offset %d is past the log end offset %d of an "
                    "empty log; the log restarts at %d",
                    self.name,
                    log_start,
                    log_end,
                    log_start,
                )
                self._delete_from(segments, 0)
                segments.append(self._new_segment(log_start))
                recovered = []
                log_end = log_start
            if self.deferred_sync is not None:
                if self._dir_changed or recovered:
                    self.deferred_sync.note()
            else:
                for segment in recovered:
                    segment.flush()
                if self._dir_changed or recovered:
                    fsync_directory(self.dir)
            # Older segments hold no descriptor until they are read again.
            for segment in segments[:-1]:
                segment.release_descriptors()
        except BaseException:
            for segment in segments:
                segment.close()
            raise

        if self.had_clean_shutdown:
            recovery_point = min(max(self.recovery_point, log_start), log_end)
        else:
            recovery_point = log_end  # everything was validated and is now fsynced

        if cache_problem is None:
            epoch_cache.truncate_from_end(log_end)
            epoch_cache.truncate_from_start(log_start)
        else:
            epoch_cache = self._rebuild_epoch_cache(
                checkpoint, segments, log_start, log_end, cache_problem
            )
        return LoadedLog(segments, epoch_cache, log_start, recovery_point)

    def _scan_directory(self) -> list[int]:
        """Remove crash leftovers and return the base offsets of the segments."""
        found: dict[int, set[str]] = {}
        for entry in sorted(os.scandir(self.dir), key=lambda e: e.name):
            name = entry.name
            if name.endswith((TMP_SUFFIX, DELETED_SUFFIX)) and entry.is_file():
                logger.info("[Log %s] removing leftover file %s", self.name, entry.path)
                os.unlink(entry.path)
                self._dir_changed = True
                continue
            if name in (LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA) and entry.is_file():
                continue
            if is_snapshot_file(name) and entry.is_file():
                continue  # producer state, loaded by producer_state.py
            match = _SEGMENT_FILE.match(name)
            if match is None or not entry.is_file():
                raise StorageError(
                    f"unexpected {'directory' if entry.is_dir() else 'file'} {entry.path} in "
                    f"log directory {self.dir}: it was not written by minibroker; move it "
                    "out of the directory and restart"
                )
            found.setdefault(int(match["base"]), set()).add(match["suffix"])
        bases = []
        for base, suffixes in sorted(found.items()):
            if LOG_SUFFIX in suffixes:
                bases.append(base)
                continue
            for suffix in suffixes:  # indexes whose segment is gone
                orphan = self.dir / f"{base:020d}{suffix}"
                logger.info("[Log %s] removing orphan index file %s", self.name, orphan)
                orphan.unlink()
                self._dir_changed = True
        return bases

    def _load_segments(
        self,
        segments: list[LogSegment],
        trusted_cache: LeaderEpochFileCache | None,
        log_start: int,
    ) -> list[LogSegment]:
        """Sanity-check or recover each segment; returns the recovered ones."""
        if self.had_clean_shutdown or not segments:
            first_unflushed = len(segments)
        else:
            bases = [segment.base_offset for segment in segments]
            first_unflushed = max(0, bisect.bisect_right(bases, self.recovery_point) - 1)
            logger.info(
                "[Log %s] unclean shutdown: recovering %d segment(s) from offset %d",
                self.name,
                len(segments) - first_unflushed,
                segments[first_unflushed].base_offset,
            )
        recovered: list[LogSegment] = []
        previous_epoch = -1
        previous_end = -1
        for index, segment in enumerate(segments):
            if segment.base_offset < previous_end:
                previous = segments[index - 1].log_path
                raise StorageError(
                    f"segment {segment.log_path} starts at offset {segment.base_offset}, "
                    f"inside {previous} (which ends at {previous_end}): two copies of the "
                    "same records? Nothing was deleted; move the one that does not belong "
                    f"(with its .index and .timeindex) out of {self.dir} and restart"
                )
            cut = 0
            if index >= first_unflushed or not self._passes_sanity_check(segment):
                cut = segment.recover(
                    epoch_cache=trusted_cache,
                    log_start_offset=log_start,
                    previous_epoch=previous_epoch,
                    later_records=any(not later.is_empty for later in segments[index + 1 :]),
                )
                recovered.append(segment)
            if not segment.is_empty:
                previous_epoch = segment.last_epoch
            previous_end = segment.next_offset
            if cut and index + 1 < len(segments):
                # Only empty segments follow a cut (recover refuses otherwise).
                logger.warning(
                    "[Log %s] deleting %d empty segment(s) after the cut in %s",
                    self.name,
                    len(segments) - index - 1,
                    segment.log_path,
                )
                self._delete_from(segments, index + 1)
                break
        return recovered

    def _passes_sanity_check(self, segment: LogSegment) -> bool:
        try:
            segment.sanity_check()
        except CorruptIndexError as exc:
            logger.warning("[Log %s] %s; recovering the segment", self.name, exc)
            return False
        except CorruptSegmentError as exc:
            logger.warning(
                "[Log %s] segment %s is torn or corrupt at position %d (%s); recovering it",
                self.name,
                exc.path,
                exc.position,
                exc.problem,
            )
            return False
        return True

    def _delete_from(self, segments: list[LogSegment], index: int) -> None:
        for segment in reversed(segments[index:]):
            segment.delete()
        del segments[index:]
        self._dir_changed = True

    def _new_segment(self, base_offset: int) -> LogSegment:
        self._dir_changed = True
        return LogSegment.create(
            self.dir,
            base_offset,
            self.handles,
            index_interval_bytes=self.index_interval_bytes,
            now_ms=self.now_ms,
        )

    def _rebuild_epoch_cache(
        self,
        checkpoint: LeaderEpochCheckpointFile,
        segments: list[LogSegment],
        log_start: int,
        log_end: int,
        problem: str,
    ) -> LeaderEpochFileCache:
        """Entries from the partition leader epoch stamped in every batch header."""
        entries: list[EpochEntry] = []
        if log_end > log_start:
            for segment in segments:
                for _, header in segment.iter_batches():
                    epoch = header.partition_leader_epoch
                    if header.next_offset <= log_start or epoch < 0:
                        continue
                    if not entries or epoch > entries[-1].epoch:
                        entries.append(EpochEntry(epoch, max(header.base_offset, log_start)))
            logger.warning(
                "[Log %s] %s; rebuilt the leader epoch cache from the log's batch headers: %s",
                self.name,
                problem,
                ", ".join(f"epoch {e.epoch} from offset {e.start_offset}" for e in entries),
            )
        elif checkpoint.path.exists():
            logger.warning(
                "[Log %s] %s; the log is empty, starting an empty cache", self.name, problem
            )
        cache = LeaderEpochFileCache(checkpoint, entries, name=self.name)
        if entries or checkpoint.path.exists():
            cache.flush()
        # else a new, empty log: an absent checkpoint reads as the empty cache it is,
        # and the first epoch assigned writes the file before any batch (two fsyncs
        # saved per replica created).
        return cache
