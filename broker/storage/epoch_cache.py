"""The leader epoch cache (KIP-101): which leader epoch started at which offset.

File `leader-epoch-checkpoint` in the partition directory, text, Kafka's layout::

    0                   line 1: format version, always 0
    3                   line 2: number of entries
    0 0                 one `epoch start_offset` line per entry, oldest first:
    2 150               epoch 2 wrote its first batch at offset 150,
    5 420               epoch 5 at offset 420
                        (the file ends with a newline)

Invariants, checked on load and after every change (kept under python -O): epochs strictly
increase, start offsets never decrease, both are >= 0.

The file is replaced atomically on every change (temp file, fsync, rename, fsync the
directory), and every change happens BEFORE the batches it describes are appended,
so after a crash the file may be ahead of the log (the loader drops entries at or
past the log end offset) but never behind it. A file that does not parse raises
CorruptCheckpointError naming the file and line; `Log.open` then rebuilds the cache
from the partition leader epoch stamped in every batch header.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from broker.storage.checkpoints import CheckpointFile
from protocol.invariants import InvariantError

logger = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    """Leader `epoch` wrote its first batch at `start_offset`."""

    epoch: int
    start_offset: int


class LeaderEpochCheckpointFile:
    """The `leader-epoch-checkpoint` file of one partition (format in the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = CheckpointFile(
            self.path,
            fields=2,
            hint=(
                "the broker rebuilds it from the leader epochs stamped in the log's batches; "
                "if it keeps failing, move the file away"
            ),
        )

    def read(self) -> list[EpochEntry] | None:
        """The entries, or None when the file does not exist."""
        lines = self._file.read_lines()
        if lines is None:
            return None
        entries: list[EpochEntry] = []
        for number, (epoch_text, offset_text) in lines:
            entry = EpochEntry(
                self._file.parse_int(epoch_text, number, "epoch"),
                self._file.parse_int(offset_text, number, "start offset"),
            )
            if entries and entry.epoch <= entries[-1].epoch:
                raise self._file.corrupt(
                    number, f"epoch {entry.epoch} does not increase (previous {entries[-1].epoch})"
                )
            if entries and entry.start_offset < entries[-1].start_offset:
                raise self._file.corrupt(
                    number,
                    f"start offset {entry.start_offset} goes backwards "
                    f"(previous {entries[-1].start_offset})",
                )
            entries.append(entry)
        return entries

    def write(self, entries: Iterable[EpochEntry]) -> None:
        self._file.write_lines(entries)


class LeaderEpochFileCache:
    """In-memory (epoch -> start offset) entries of one replica, persisted on change.

    The rules are those of Kafka's LeaderEpochFileCache. Not thread-safe: it is used
    from the event-loop thread only.
    """

    def __init__(
        self,
        checkpoint: LeaderEpochCheckpointFile,
        entries: Iterable[EpochEntry] = (),
        *,
        name: str = "",
    ) -> None:
        self._checkpoint = checkpoint
        self._entries: list[EpochEntry] = list(entries)
        self._name = name or str(checkpoint.path.parent.name)
        self._check_invariants()

    @classmethod
    def load(cls, path: Path, *, name: str = "") -> LeaderEpochFileCache:
        """Open the checkpoint at `path` (a missing file is an empty cache).

        Raises CorruptCheckpointError when the file does not parse.
        """
        checkpoint = LeaderEpochCheckpointFile(path)
        return cls(checkpoint, checkpoint.read() or (), name=name)

    @property
    def path(self) -> Path:
        return self._checkpoint.path

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def __len__(self) -> int:
        return len(self._entries)

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; returns whether anything changed.

        A no-op when the latest entry has this epoch and starts at or before the
        offset. Otherwise every entry that would break monotonicity (epoch >= the new
        epoch, or start offset >= the new start offset) is removed first.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry (epoch={epoch}, start={start_offset})")
        latest = self.latest_entry
        if latest is not None and latest.epoch == epoch and start_offset >= latest.start_offset:
            return False
        new = EpochEntry(epoch, start_offset)
        removed: list[EpochEntry] = []
        while self._entries and (
            self._entries[-1].epoch >= epoch or self._entries[-1].start_offset >= start_offset
        ):
            removed.append(self._entries.pop())
        if removed:
            removed.reverse()
            # Same start offset: the removed epoch wrote nothing, only its claim goes.
            wrote_nothing = len(removed) == 1 and removed[0].start_offset == start_offset
            logger.warning(
                "[LeaderEpochCache %s] new entry %s removed conflicting entries %s%s",
                self._name,
                _fmt(new),
                ", ".join(_fmt(e) for e in removed),
                " (which had no data)" if wrote_nothing else "",
            )
        self._entries.append(new)
        self._changed()
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetsForLeaderEpoch, exactly as Kafka answers.

        The epoch is the largest known epoch <= the requested one; the end offset is
        the start offset of the first larger epoch, or the log end offset when the
        requested epoch is the latest. (-1, -1) when nothing can be said.
        """
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if self._entries and requested_epoch == self._entries[-1].epoch:
            return requested_epoch, log_end_offset
        higher = bisect.bisect_right(self._entries, requested_epoch, key=_epoch_of)
        if higher == len(self._entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        higher_start = self._entries[higher].start_offset
        if higher == 0:
            # Older than anything known: the data before `higher_start` is gone, so the
            # follower may keep nothing past it.
            return requested_epoch, higher_start
        return self._entries[higher - 1].epoch, higher_start

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote `offset`, or None when it lies before the first entry."""
        index = bisect.bisect_right(self._entries, offset, key=_start_of)
        return self._entries[index - 1].epoch if index else None

    def learn_from_leader(self, epoch: int, base_offset: int, log_end_offset: int) -> None:
        """A follower's batch of `epoch` at `base_offset` is about to land at the log
        end: record its epoch first (the checkpoint is never behind the log)."""
        if epoch < self.latest_epoch:
            # Our newer entries start at or past the LEO: claims of epochs in which this
            # replica wrote nothing. The leader's lineage replaces them.
            self.truncate_from_end(log_end_offset)
        if epoch >= self.latest_epoch:
            self.assign(epoch, base_offset)

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove the entries whose start offset is >= end_offset (log truncated there)."""
        if end_offset < 0 or not self._entries or self._entries[-1].start_offset < end_offset:
            return
        removed = []
        while self._entries and self._entries[-1].start_offset >= end_offset:
            removed.append(self._entries.pop())
        logger.info(
            "[LeaderEpochCache %s] removed %s after truncating to end offset %d",
            self._name,
            ", ".join(_fmt(e) for e in reversed(removed)),
            end_offset,
        )
        self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop entries wholly below the new log start; the entry covering it is kept
        with its start moved up to `start_offset`. truncate_from_start(6) keeps (e, 6).
        """
        index = bisect.bisect_right(self._entries, start_offset, key=_start_of)
        if index == 0:
            return
        covering = EpochEntry(self._entries[index - 1].epoch, start_offset)
        if index == 1 and self._entries[0] == covering:
            return
        self._entries[:index] = [covering]
        logger.debug(
            "[LeaderEpochCache %s] truncated to start offset %d, first entry now %s",
            self._name,
            start_offset,
            _fmt(covering),
        )
        self._changed()

    def clear(self) -> None:
        """Remove every entry (the log was truncated fully)."""
        self._entries.clear()
        self._changed()

    def flush(self) -> None:
        """Write the checkpoint file now (the cache writes it itself on every change)."""
        self._checkpoint.write(self._entries)

    def _changed(self) -> None:
        self._check_invariants()
        self.flush()

    def _check_invariants(self) -> None:
        # Kept under python -O (item 7 of issue 14): epochs never decrease.
        for prev, entry in itertools.pairwise(self._entries):
            if entry.epoch <= prev.epoch:
                raise InvariantError(f"epochs must strictly increase: {self._entries}")
            if entry.start_offset < prev.start_offset:
                raise InvariantError(f"start offsets must not decrease: {self._entries}")
        if not all(e.epoch >= 0 and e.start_offset >= 0 for e in self._entries):
            raise InvariantError(f"negative epoch or start offset: {self._entries}")


def _epoch_of(entry: EpochEntry) -> int:
    return entry.epoch


def _start_of(entry: EpochEntry) -> int:
    return entry.start_offset


def _fmt(entry: EpochEntry) -> str:
    return f"(epoch={entry.epoch}, start_offset={entry.start_offset})"
