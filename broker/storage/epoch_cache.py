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
past the log end offset) but never behind it. The one change written later: a new
leader's epoch at its log end (`assign(..., write_now=False)`), written by the first
append of the epoch or the log's close; lost in a crash before either, it had
described no record. When a write fails (say, no file
descriptor left) the change stays in memory and the next append writes the file
again before any batch (`ensure_written`), failing while it cannot.

Off the event loop: a change may be written by a worker thread instead
(`write_in_background`: the first produce of a new leader's epoch, a follower
fetching the first batches of new epochs), from a copy of the entries. The cache is
still used from the event loop only, and never has two writers of its file: every
write on the loop (`flush`, `ensure_written`) first settles the background one,
taking it back if no thread has started it, else waiting for it (one write at most).
A background write settles only the change it copied; a failed one leaves the
change unwritten, so the next append writes it and reports the error. A file that
does not parse raises CorruptCheckpointError naming the file and line; `Log.open`
then rebuilds the cache from the partition leader epoch stamped in every batch header.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Executor
from concurrent.futures import Future
from pathlib import Path

from broker.storage.checkpoints import CheckpointFile
from runtime.epoch_lineage import UNDEFINED_EPOCH
from runtime.epoch_lineage import UNDEFINED_EPOCH_OFFSET
from runtime.epoch_lineage import EpochEntry
from runtime.epoch_lineage import EpochLineage

logger = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

# Re-exported: the broker's modules and tests import them from here.
__all__ = [
    "LEADER_EPOCH_CHECKPOINT",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCheckpointFile",
    "LeaderEpochFileCache",
]


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

    The rules are those of Kafka's LeaderEpochFileCache, kept once in
    runtime/epoch_lineage.py (`EpochLineage`); this class adds the checkpoint file and
    the log lines. Not thread-safe: it is used from the event-loop thread only.
    """

    def __init__(
        self,
        checkpoint: LeaderEpochCheckpointFile,
        entries: Iterable[EpochEntry] = (),
        *,
        name: str = "",
    ) -> None:
        self._checkpoint = checkpoint
        self._name = name or str(checkpoint.path.parent.name)
        self._lineage = EpochLineage(entries)
        # A change whose checkpoint write failed (e.g. no file descriptor left): the
        # file is behind the cache until a write succeeds, so no batch may be
        # appended before `ensure_written`.
        self._unwritten = False
        # Bumped by every change: a background write settles only the one it copied.
        self._version = 0
        # (version written, its future): a worker thread's write of the file.
        self._background: tuple[int, Future[None]] | None = None

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
    def lineage(self) -> EpochLineage:
        """The entries' rules, to read (e.g. `diverging_epoch`); change them through
        this cache, which writes the checkpoint."""
        return self._lineage

    @property
    def entries(self) -> list[EpochEntry]:
        return self._lineage.entries

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._lineage.latest_entry

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._lineage.earliest_entry

    @property
    def latest_epoch(self) -> int:
        return self._lineage.latest_epoch

    def __len__(self) -> int:
        return len(self._lineage)

    def assign(self, epoch: int, start_offset: int, *, write_now: bool = True) -> bool:
        """Record that `epoch` starts at `start_offset`; returns whether anything changed.

        A no-op when the latest entry has this epoch and starts at or before the
        offset. Otherwise every entry that would break monotonicity (epoch >= the new
        epoch, or start offset >= the new start offset) is removed first.

        `write_now=False` (a new leader's epoch at its log end) leaves the file to
        `ensure_written()`, which every append calls first, and to the log's close: an
        epoch that has written nothing yet tells a reader nothing the log does not, and
        a broker taking over thousands of partitions at once must not spend an fsync
        pair on each of them on its event loop (its heartbeats would stop).
        """
        removed = self._lineage.assign(epoch, start_offset)
        if removed is None:
            return False
        if removed:
            # Same start offset: the removed epoch wrote nothing, only its claim goes.
            wrote_nothing = len(removed) == 1 and removed[0].start_offset == start_offset
            logger.warning(
                "[LeaderEpochCache %s] new entry %s removed conflicting entries %s%s",
                self._name,
                _fmt(EpochEntry(epoch, start_offset)),
                ", ".join(_fmt(e) for e in removed),
                " (which had no data)" if wrote_nothing else "",
            )
        self._changed(write_now=write_now)
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetsForLeaderEpoch, exactly as Kafka answers
        (EpochLineage.end_offset_for)."""
        return self._lineage.end_offset_for(requested_epoch, log_end_offset)

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote `offset`, or None when it lies before the first entry."""
        return self._lineage.epoch_for_offset(offset)

    def learn_from_leader(
        self, epoch: int, base_offset: int, log_end_offset: int, *, write_now: bool = True
    ) -> None:
        """A follower's batch of `epoch` at `base_offset` is about to land at the log
        end: record its epoch first (the checkpoint is never behind the log).
        `write_now=False`: the caller writes the checkpoint before the append."""
        if epoch < self.latest_epoch:
            if self._lineage.epoch_for_offset(base_offset) == epoch:
                # Learnt ahead of this append with the batches after it (the fetcher
                # writes a whole answer's epochs first): the newer entries are theirs.
                return
            # Our newer entries start at or past the LEO: claims of epochs in which this
            # replica wrote nothing. The leader's lineage replaces them.
            self.truncate_from_end(log_end_offset)
        if epoch >= self.latest_epoch:
            self.assign(epoch, base_offset, write_now=write_now)

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove the entries whose start offset is >= end_offset (log truncated there)."""
        removed = self._lineage.truncate_from_end(end_offset)
        if not removed:
            return
        logger.info(
            "[LeaderEpochCache %s] removed %s after truncating to end offset %d",
            self._name,
            ", ".join(_fmt(e) for e in removed),
            end_offset,
        )
        self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop entries wholly below the new log start; the entry covering it is kept
        with its start moved up to `start_offset`. truncate_from_start(6) keeps (e, 6).
        """
        if not self._lineage.truncate_from_start(start_offset):
            return
        covering = self._lineage.earliest_entry
        assert covering is not None  # the entry covering start_offset
        logger.debug(
            "[LeaderEpochCache %s] truncated to start offset %d, first entry now %s",
            self._name,
            start_offset,
            _fmt(covering),
        )
        self._changed()

    def clear(self) -> None:
        """Remove every entry (the log was truncated fully)."""
        self._lineage.clear()
        self._changed()

    def flush(self) -> None:
        """Write the checkpoint file now (the cache writes it itself on every change)."""
        self.settle()
        self._checkpoint.write(self._lineage.entries)
        self._unwritten = False

    def ensure_written(self) -> None:
        """Write the checkpoint if a change is not on disk yet (a deferred assign, or
        a write that failed; raises if it fails): called before batches are appended,
        so the file on disk is never behind the log."""
        self.settle()
        if self._unwritten:
            self.flush()

    @property
    def unwritten(self) -> bool:
        """A change is not on disk yet (a background write of it may be under way)."""
        return self._unwritten

    def write_in_background(self, executor: Executor) -> Future[None] | None:
        """Start writing the unwritten change on a thread of `executor` (the caller
        goes on; `ensure_written` before the next append settles it). None when
        nothing is unwritten; the write already under way when there is one."""
        if not self._unwritten:
            return None
        if self._background is not None:
            return self._background[1]  # one writer at a time; the append catches up
        entries = list(self._lineage.entries)
        try:
            future = executor.submit(self._checkpoint.write, entries)
        except RuntimeError:  # the executor shut down (the broker stops): written later
            return None
        self._background = (self._version, future)
        return future

    def settle(self) -> None:
        """Finish with the background write, if any: taken back when no thread has
        started it, else waited for. What it wrote is on disk when it succeeded; an
        error leaves the change unwritten for the write that follows to report."""
        background, self._background = self._background, None
        if background is None:
            return
        version, future = background
        if future.cancel():
            return  # queued behind other writes: the caller writes it now
        try:
            future.result()
        except Exception as exc:  # raised again by the synchronous write that follows
            logger.debug("[LeaderEpochCache %s] background write failed: %s", self._name, exc)
            return
        if version == self._version:
            self._unwritten = False

    def _changed(self, *, write_now: bool = True) -> None:
        self._check_invariants()
        self._version += 1
        self._unwritten = True
        if write_now:
            self.flush()

    def _check_invariants(self) -> None:
        # Kept under python -O (item 7 of issue 14): epochs never decrease.
        self._lineage.check_invariants()


def _fmt(entry: EpochEntry) -> str:
    return f"(epoch={entry.epoch}, start_offset={entry.start_offset})"
