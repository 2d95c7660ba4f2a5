"""Idempotent-producer state of one partition replica (Kafka's ProducerStateManager,
KIP-98 without transactions).

Per producer id it keeps the producer epoch and the metadata of its last
`BATCHES_PER_PRODUCER` batches (first/last sequence, first/last offset, max
timestamp). The leader checks every batch carrying a producer id against it before
the append (`prepare_leader_append`): a retried batch is found in the cache and
answered with its original offsets instead of being written twice. Followers feed
the same state from the batches they replicate (`apply_replicated`), so a new leader
deduplicates too. The state is derived from the batch headers alone (producer id,
epoch, base sequence, last offset delta): it is rebuilt from the log, never from
decoded records.

Snapshot files, `<20-digit offset>.snapshot` in the partition directory, hold the
state of every producer whose batches lie below `offset` (the log end offset when it
was taken: at each segment roll and at clean shutdown), written atomically
(temp file, fsync, rename, fsync the directory)::

    offset  size  field
         0     4  magic b"MBPS"
         4     2  version (1), big-endian
         6     4  CRC-32C of the body, big-endian
        10     -  body: JSON {"offset": int, "producers": [[producer_id, epoch,
                  last_timestamp, [[first_seq, last_seq, first_offset, last_offset,
                  timestamp], ...]], ...]}  (batches oldest first)

On open the latest snapshot at or below the log end is loaded and the batch headers
past its offset are replayed; snapshots past the log end (a torn tail was cut) are
deleted; a corrupt snapshot is logged at WARNING, deleted, and an older one (or the
log start) is used instead. Truncation reloads the same way at the new log end.

Sequence rules (client appends only; Kafka 2.x's ProducerAppendInfo): an epoch older
than the producer's is INVALID_PRODUCER_EPOCH; a batch whose sequence range equals
one of the cached batches (same epoch) is a duplicate; a new epoch must start at
sequence 0 (OUT_OF_ORDER_SEQUENCE_NUMBER otherwise, UNKNOWN_PRODUCER_ID when the
producer is not known at all); within an epoch the first sequence must follow the
last one (wrapping from 2**31-1 to 0). Replicated batches are never refused.

Producers idle for longer than producer.id.expiration.ms are dropped
(`remove_expired`), and at most `max_producers` are kept (the least recently
written one goes first).
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections import deque
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import NamedTuple

import crc32c
import msgspec

from protocol.errors import ErrorCode
from protocol.record_batch import NO_PRODUCER_EPOCH
from protocol.record_batch import NO_SEQUENCE
from protocol.record_batch import BatchHeader
from runtime.fileio import atomic_write

logger = logging.getLogger(__name__)

SNAPSHOT_SUFFIX = ".snapshot"
BATCHES_PER_PRODUCER = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 60 * 60 * 1000  # producer.id.expiration.ms
DEFAULT_MAX_PRODUCERS = 10_000
INT32_MAX = 2**31 - 1

_MAGIC = b"MBPS"
_VERSION = 1
_HEADER = struct.Struct(">4sHI")
_SNAPSHOT_FILE = re.compile(r"^(\d{20})\.snapshot$")


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


def is_snapshot_file(name: str) -> bool:
    return _SNAPSHOT_FILE.match(name) is not None


class ProducerStateError(Exception):
    """A client batch breaks the idempotence rules; `error_code` is the Produce error."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class CorruptSnapshotError(Exception):
    pass


class BatchMetadata(NamedTuple):
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass
class ProducerEntry:
    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    last_timestamp: int = -1
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=BATCHES_PER_PRODUCER)
    )

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def copy(self) -> ProducerEntry:
        return ProducerEntry(
            self.producer_id,
            self.epoch,
            self.last_timestamp,
            deque(self.batches, maxlen=BATCHES_PER_PRODUCER),
        )

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        if header.producer_epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == header.base_sequence and batch.last_seq == header.last_sequence:
                return batch
        return None

    def add(self, header: BatchHeader) -> None:
        """Record an appended batch (its base offset already assigned)."""
        if header.producer_epoch != self.epoch:
            self.epoch = header.producer_epoch
            self.batches.clear()  # sequences restart with a new epoch
        self.batches.append(
            BatchMetadata(
                header.base_sequence,
                header.last_sequence,
                header.base_offset,
                header.last_offset,
                header.max_timestamp,
            )
        )
        self.last_timestamp = max(self.last_timestamp, header.max_timestamp)


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class LeaderAppendCheck(NamedTuple):
    """What `prepare_leader_append` decided: the entries to install after the write,
    or the cached batch a retried batch duplicates (nothing is written then)."""

    updates: dict[int, ProducerEntry]
    duplicate: BatchMetadata | None


class ProducerStateManager:
    def __init__(
        self,
        dir: Path,
        *,
        name: str,
        expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
    ) -> None:
        self.dir = Path(dir)
        self.name = name
        self.expiration_ms = expiration_ms
        self.max_producers = max_producers
        # Insertion order = least recently written first (an update re-inserts).
        self.producers: dict[int, ProducerEntry] = {}
        # The state covers every batch below this offset.
        self.map_end_offset = 0

    # ------------------------------------------------------------------ queries

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self.producers.get(producer_id)

    def snapshot_offsets(self) -> list[int]:
        offsets = []
        for name in os.listdir(self.dir):
            match = _SNAPSHOT_FILE.match(name)
            if match is not None:
                offsets.append(int(match[1]))
        return sorted(offsets)

    # ------------------------------------------------------------------ appends

    def prepare_leader_append(self, headers: Iterable[BatchHeader]) -> LeaderAppendCheck:
        """Check client batches (base offsets already assigned). Raises
        ProducerStateError; changes nothing (commit with `commit`)."""
        updates: dict[int, ProducerEntry] = {}
        for header in headers:
            pid = header.producer_id
            if pid < 0:
                continue
            current = self.producers.get(pid)
            entry = updates.get(pid)
            if entry is None:
                if current is not None:
                    duplicate = current.find_duplicate(header)
                    if duplicate is not None:
                        return LeaderAppendCheck({}, duplicate)
                entry = current.copy() if current is not None else ProducerEntry(pid)
            self._check(entry, header)
            entry.add(header)
            updates[pid] = entry
        return LeaderAppendCheck(updates, None)

    def _check(self, entry: ProducerEntry, header: BatchHeader) -> None:
        pid, epoch, seq = header.producer_id, header.producer_epoch, header.base_sequence
        where = f"partition {self.name}, offset {header.base_offset}"
        if seq == NO_SEQUENCE or epoch < 0:
            raise ProducerStateError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid} batch without a sequence or epoch ({epoch}, {seq}) at {where}",
            )
        if epoch < entry.epoch:
            raise ProducerStateError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {pid} epoch {epoch} is older than its current epoch "
                f"{entry.epoch} ({where})",
            )
        if epoch != entry.epoch:
            if seq != 0:
                if entry.epoch != NO_PRODUCER_EPOCH:
                    raise ProducerStateError(
                        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                        f"producer {pid} new epoch {epoch} must start at sequence 0, got "
                        f"{seq} (current epoch {entry.epoch}, {where})",
                    )
                raise ProducerStateError(
                    ErrorCode.UNKNOWN_PRODUCER_ID,
                    f"producer {pid} is unknown here and its first sequence is {seq}, not 0 "
                    f"({where}): its state expired or its batches were deleted",
                )
        elif entry.batches and not in_sequence(entry.last_seq, seq):
            raise ProducerStateError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid} epoch {epoch}: sequence {seq} does not follow "
                f"{entry.last_seq} ({where})",
            )

    def commit(self, check: LeaderAppendCheck, end_offset: int) -> None:
        """Install what `prepare_leader_append` computed, once the batches are written."""
        for pid, entry in check.updates.items():
            self._install(pid, entry)
        self.map_end_offset = max(self.map_end_offset, end_offset)

    def apply_replicated(self, headers: Iterable[BatchHeader]) -> None:
        """Batches appended by a follower (or replayed from the log): never refused."""
        end = self.map_end_offset
        for header in headers:
            end = max(end, header.next_offset)
            pid = header.producer_id
            if pid < 0 or header.base_sequence == NO_SEQUENCE:
                continue
            current = self.producers.get(pid)
            if current is not None and header.producer_epoch < current.epoch:
                logger.warning(
                    "[ProducerState %s] replicated batch at offset %d has producer %d epoch "
                    "%d, older than %d; keeping the newer epoch",
                    self.name,
                    header.base_offset,
                    pid,
                    header.producer_epoch,
                    current.epoch,
                )
                continue
            entry = current if current is not None else ProducerEntry(pid)
            entry.add(header)
            self._install(pid, entry)
        self.map_end_offset = end

    def _install(self, pid: int, entry: ProducerEntry) -> None:
        self.producers.pop(pid, None)
        self.producers[pid] = entry
        while len(self.producers) > self.max_producers:
            evicted = next(iter(self.producers))
            del self.producers[evicted]
            logger.info(
                "[ProducerState %s] evicted producer %d (more than %d producers)",
                self.name,
                evicted,
                self.max_producers,
            )

    def remove_expired(self, now_ms: int) -> int:
        """Forget producers idle for longer than the expiration; returns how many."""
        doomed = [
            pid
            for pid, entry in self.producers.items()
            if now_ms - entry.last_timestamp > self.expiration_ms
        ]
        for pid in doomed:
            del self.producers[pid]
        if doomed:
            logger.info("[ProducerState %s] expired %d producer id(s)", self.name, len(doomed))
        return len(doomed)

    # ------------------------------------------------------------------ snapshots

    def take_snapshot(self) -> Path:
        """Write the state as `<map_end_offset>.snapshot` (replacing one at that offset)."""
        path, data = self.encode_snapshot()
        atomic_write(path, data)
        return path

    def encode_snapshot(self) -> tuple[Path, bytes]:
        """The snapshot `take_snapshot` writes, as (path, bytes) for a writer thread."""
        body = msgspec.json.encode(
            {
                "offset": self.map_end_offset,
                "producers": [
                    [e.producer_id, e.epoch, e.last_timestamp, [list(b) for b in e.batches]]
                    for e in self.producers.values()
                ],
            }
        )
        path = self.dir / snapshot_file_name(self.map_end_offset)
        return path, _HEADER.pack(_MAGIC, _VERSION, crc32c.crc32c(body)) + body

    @staticmethod
    def read_snapshot(path: Path) -> tuple[int, list[ProducerEntry]]:
        data = Path(path).read_bytes()
        if len(data) < _HEADER.size:
            raise CorruptSnapshotError(f"{path}: {len(data)} bytes, shorter than the header")
        magic, version, crc = _HEADER.unpack_from(data)
        body = data[_HEADER.size :]
        if magic != _MAGIC or version != _VERSION:
            raise CorruptSnapshotError(f"{path}: bad magic {magic!r} or version {version}")
        if crc32c.crc32c(body) != crc:
            raise CorruptSnapshotError(f"{path}: CRC mismatch")
        try:
            doc = msgspec.json.decode(body)
            offset = int(doc["offset"])
            entries = []
            for pid, epoch, last_ts, batches in doc["producers"]:
                entry = ProducerEntry(int(pid), int(epoch), int(last_ts))
                for b in batches:
                    entry.batches.append(BatchMetadata(*(int(x) for x in b)))
                entries.append(entry)
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptSnapshotError(f"{path}: bad body: {exc}") from exc
        return offset, entries

    def load(
        self,
        log_start_offset: int,
        log_end_offset: int,
        replay: Callable[[int], Iterable[BatchHeader]],
    ) -> None:
        """Rebuild the state as of `log_end_offset`: the latest readable snapshot in
        [log start, log end] (later ones are deleted), then the headers `replay(offset)`
        yields from its offset (or from the log start without one)."""
        self.delete_snapshots_after(log_end_offset)
        self.producers = {}
        self.map_end_offset = log_start_offset
        for offset in reversed(self.snapshot_offsets()):
            if offset < log_start_offset:
                break
            path = self.dir / snapshot_file_name(offset)
            try:
                snap_offset, entries = self.read_snapshot(path)
                if snap_offset != offset:
                    raise CorruptSnapshotError(f"{path}: holds offset {snap_offset}")
            except (CorruptSnapshotError, OSError) as exc:
                logger.warning(
                    "[ProducerState %s] ignoring corrupt producer snapshot (%s); deleting it "
                    "and rebuilding from the log",
                    self.name,
                    exc,
                )
                path.unlink(missing_ok=True)
                continue
            self.producers = {e.producer_id: e for e in entries}
            self.map_end_offset = offset
            break
        start = self.map_end_offset
        self.apply_replicated(h for h in replay(start) if h.base_offset >= start)
        self.map_end_offset = max(self.map_end_offset, log_end_offset)
        logger.info(
            "[ProducerState %s] loaded %d producer(s): snapshot at %d, replayed to %d",
            self.name,
            len(self.producers),
            start,
            log_end_offset,
        )

    def delete_snapshots_after(self, offset: int) -> None:
        for snap in self.snapshot_offsets():
            if snap > offset:
                (self.dir / snapshot_file_name(snap)).unlink(missing_ok=True)

    def delete_snapshots_before(self, offset: int) -> None:
        for snap in self.snapshot_offsets():
            if snap < offset:
                (self.dir / snapshot_file_name(snap)).unlink(missing_ok=True)

    def clear(self, start_offset: int) -> None:
        """The log restarted empty at `start_offset`."""
        self.producers = {}
        self.map_end_offset = start_offset
        for snap in self.snapshot_offsets():
            (self.dir / snapshot_file_name(snap)).unlink(missing_ok=True)
