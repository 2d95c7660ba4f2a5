"""The replicated metadata log as the quorum sees it, in memory: the latest snapshot
(what every entry below the log start added up to), the entries after it, and their
epoch lineage (runtime/epoch_lineage.py, the rules the brokers' partition logs use).

Sans-I/O: nothing here touches a file. Every change is also noted in `journal`
(("append", entries), ("truncate", offset), ("install", snapshot), ("compact",
snapshot)), which the driver replays on the disk's log in order. What is durable is
tracked by `flushed_end`: the driver reports each completed write with `flushed(point)`;
a voter fetches (and so tells the leader what it holds) only up to what is durable, and
the leader counts itself only that far.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any

from protocol.invariants import InvariantError
from protocol.messages.quorum_apis import MetadataEntry
from protocol.messages.quorum_apis import SnapshotId
from protocol.messages.quorum_apis import through_change_end
from runtime.epoch_lineage import EpochEntry
from runtime.epoch_lineage import EpochLineage


@dataclass(frozen=True)
class Snapshot:
    """Every entry below `end_offset` applied; the last of them had quorum `epoch`
    (-1 for the empty snapshot at offset 0). `records` is the applied state."""

    end_offset: int = 0
    epoch: int = -1
    records: tuple[Any, ...] = field(default=())

    @property
    def id(self) -> SnapshotId:
        return SnapshotId(end_offset=self.end_offset, epoch=self.epoch)


class QuorumLog:
    def __init__(self, snapshot: Snapshot | None = None, entries: list[MetadataEntry] = ()) -> None:  # type: ignore[assignment]
        self.snapshot = snapshot or Snapshot()
        self.journal: list[tuple[str, Any]] = []
        self.entries: list[MetadataEntry] = []
        self.lineage = EpochLineage()
        if self.snapshot.end_offset > 0:
            self.lineage.assign(max(self.snapshot.epoch, 0), self.snapshot.end_offset)
        self.append(list(entries))
        self.journal.clear()  # read back from the disk: nothing to write
        self.flushed_end = self.end_offset  # what was read back from disk is durable
        self._rewrites = 0  # truncations and installs: a flush started before one is stale

    # ------------------------------------------------------------------ reads

    @property
    def start_offset(self) -> int:
        return self.snapshot.end_offset

    @property
    def end_offset(self) -> int:
        return self.snapshot.end_offset + len(self.entries)

    @property
    def last_epoch(self) -> int:
        """Epoch of the last entry (or of the snapshot's last entry); -1 when empty."""
        if self.entries:
            return self.entries[-1].epoch
        return self.snapshot.epoch

    def epoch_at(self, offset: int) -> int:
        """Epoch of the entry at `offset` (in the log, or the snapshot's last one)."""
        if offset == self.start_offset - 1:
            return self.snapshot.epoch
        return self.entry(offset).epoch

    def entry(self, offset: int) -> MetadataEntry:
        if not self.start_offset <= offset < self.end_offset:
            raise InvariantError(
                f"offset {offset} outside the log [{self.start_offset}, {self.end_offset})"
            )
        return self.entries[offset - self.start_offset]

    def read(self, offset: int, max_entries: int, stop: int | None = None) -> list[MetadataEntry]:
        """About `max_entries` from `offset`, below offset `stop` (default: the log end),
        whole changes only (see MetadataEntry)."""
        i = offset - self.start_offset
        last = None if stop is None else stop - self.start_offset
        return self.entries[i : through_change_end(self.entries, i, max_entries, last)]

    def epochs(self) -> list[EpochEntry]:
        return self.lineage.entries

    # ------------------------------------------------------------------ changes

    def append(self, entries: list[MetadataEntry]) -> None:
        """Entries continuing the log (dense offsets, epochs never going back)."""
        for e in entries:
            if e.offset != self.end_offset:
                raise InvariantError(f"entry at {e.offset} appended at log end {self.end_offset}")
            if e.epoch < self.last_epoch:
                raise InvariantError(f"entry of epoch {e.epoch} after epoch {self.last_epoch}")
            self.lineage.assign(e.epoch, e.offset)
            self.entries.append(e)
        if entries:
            self.journal.append(("append", list(entries)))

    def truncate_to(self, offset: int) -> None:
        """Drop the entries at `offset` and after (a diverging suffix)."""
        if offset < self.start_offset:
            raise InvariantError(f"truncation to {offset} below the snapshot {self.start_offset}")
        if offset >= self.end_offset:
            return
        del self.entries[offset - self.start_offset :]
        self.lineage.truncate_from_end(offset)
        self.flushed_end = min(self.flushed_end, offset)
        self._rewrites += 1
        self.journal.append(("truncate", offset))

    def compact(self, snapshot: Snapshot) -> None:
        """The applied state as of `snapshot.end_offset` (within the log) replaces the
        entries below it."""
        end = snapshot.end_offset
        if not self.start_offset <= end <= self.end_offset:
            raise InvariantError(
                f"snapshot at {end} outside the log [{self.start_offset}, {self.end_offset}]"
            )
        if end > 0 and snapshot.epoch != self.epoch_at(end - 1):
            raise InvariantError(f"snapshot at {end} says epoch {snapshot.epoch}")
        del self.entries[: end - self.start_offset]
        self.snapshot = snapshot
        self.journal.append(("compact", snapshot))
        if end > 0:
            self.lineage.truncate_from_start(end)
            if not len(self.lineage):
                self.lineage.assign(snapshot.epoch, end)

    def install(self, snapshot: Snapshot) -> None:
        """A snapshot fetched from the leader replaces the whole log."""
        self.entries.clear()
        self.lineage.clear()
        self.snapshot = snapshot
        if snapshot.end_offset > 0:
            self.lineage.assign(max(snapshot.epoch, 0), snapshot.end_offset)
        self.flushed_end = 0  # nothing of it is durable until the driver says so
        self._rewrites += 1
        self.journal.append(("install", snapshot))

    def flush_point(self) -> tuple[int, int]:
        """What a flush that starts now will make durable; hand it to `flushed`."""
        return self.end_offset, self._rewrites

    def flushed(self, point: tuple[int, int]) -> None:
        """The flush that started at `point` completed. One that started before a
        truncation or an install says nothing about what replaced the old entries."""
        end, rewrites = point
        if rewrites == self._rewrites:
            self.flushed_end = max(self.flushed_end, min(end, self.end_offset))
