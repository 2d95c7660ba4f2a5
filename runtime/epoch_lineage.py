"""The leader-epoch rules of a replicated log, written once for every log that has them:
a partition's log on the brokers (KIP-101, KIP-320) and the controllers' metadata log
(the quorum of issue 17, KIP-595 replicates it with the very same rules).

- `EpochLineage`: which epoch started at which offset, in memory, with its invariants
  (epochs strictly increase, start offsets never decrease). The broker's
  `LeaderEpochFileCache` keeps one and writes its checkpoint file on every change.
- `diverging_epoch`: the leader's side of a Fetch carrying the fetcher's last fetched
  epoch (Kafka's Partition.readRecords): does the fetcher's log diverge from ours, and
  where does its epoch end here?
- `offset_truncation_state`: the follower's side (Kafka's
  AbstractFetcherThread.getOffsetTruncationState): given the leader's answer, where to
  truncate (the largest common epoch).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from collections.abc import Iterable
from typing import NamedTuple

from protocol.invariants import InvariantError

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    """Leader `epoch` wrote its first entry at `start_offset`."""

    epoch: int
    start_offset: int


def _epoch_of(entry: EpochEntry) -> int:
    return entry.epoch


def _start_of(entry: EpochEntry) -> int:
    return entry.start_offset


class EpochLineage:
    """The epoch entries of one log, oldest first. Every method that changes them
    returns the entries it removed (for the caller's log line) or whether it changed."""

    def __init__(self, entries: Iterable[EpochEntry] = ()) -> None:
        self._entries: list[EpochEntry] = [EpochEntry(*e) for e in entries]
        self.check_invariants()

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

    def assign(self, epoch: int, start_offset: int) -> list[EpochEntry] | None:
        """Record that `epoch` starts at `start_offset`. None when nothing changed (the
        latest entry has this epoch and starts at or before the offset); else the
        entries removed because they would break monotonicity (epoch >= the new epoch,
        or start offset >= the new start offset), possibly none."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry (epoch={epoch}, start={start_offset})")
        latest = self.latest_entry
        if latest is not None and latest.epoch == epoch and start_offset >= latest.start_offset:
            return None
        removed: list[EpochEntry] = []
        while self._entries and (
            self._entries[-1].epoch >= epoch or self._entries[-1].start_offset >= start_offset
        ):
            removed.append(self._entries.pop())
        removed.reverse()
        self._entries.append(EpochEntry(epoch, start_offset))
        self.check_invariants()
        return removed

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

    def truncate_from_end(self, end_offset: int) -> list[EpochEntry]:
        """Remove the entries whose start offset is >= end_offset (log truncated
        there); the removed ones, oldest first."""
        removed: list[EpochEntry] = []
        if end_offset < 0:
            return removed
        while self._entries and self._entries[-1].start_offset >= end_offset:
            removed.append(self._entries.pop())
        removed.reverse()
        return removed

    def truncate_from_start(self, start_offset: int) -> bool:
        """Drop entries wholly below the new log start; the entry covering it is kept
        with its start moved up to `start_offset`. truncate_from_start(6) keeps (e, 6).
        Whether anything changed."""
        index = bisect.bisect_right(self._entries, start_offset, key=_start_of)
        if index == 0:
            return False
        covering = EpochEntry(self._entries[index - 1].epoch, start_offset)
        if index == 1 and self._entries[0] == covering:
            return False
        self._entries[:index] = [covering]
        return True

    def clear(self) -> None:
        self._entries.clear()

    def check_invariants(self) -> None:
        # Kept under python -O: epochs never decrease, start offsets never go back.
        for prev, entry in itertools.pairwise(self._entries):
            if entry.epoch <= prev.epoch:
                raise InvariantError(f"epochs must strictly increase: {self._entries}")
            if entry.start_offset < prev.start_offset:
                raise InvariantError(f"start offsets must not decrease: {self._entries}")
        if not all(e.epoch >= 0 and e.start_offset >= 0 for e in self._entries):
            raise InvariantError(f"negative epoch or start offset: {self._entries}")


class Divergence(NamedTuple):
    """A leader's answer to a fetch from a diverging log: the fetcher's epoch ends at
    `end_offset` here (`epoch` being the largest epoch <= it that we have)."""

    epoch: int
    end_offset: int


OUT_OF_RANGE = Divergence(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def diverging_epoch(
    lineage: EpochLineage,
    log_start_offset: int,
    log_end_offset: int,
    last_fetched_epoch: int,
    fetch_offset: int,
) -> Divergence | None:
    """The leader's check of a fetch that says which epoch its previous entry had
    (KIP-320 / KIP-595, Kafka's order in Partition.readRecords): None when the
    fetcher's log is a prefix of ours up to `fetch_offset`; OUT_OF_RANGE when its
    epoch cannot be placed or the offset is below our log start; else where its epoch
    ends here, for it to truncate to before fetching again."""
    if last_fetched_epoch < 0:
        return None
    epoch, end_offset = lineage.end_offset_for(last_fetched_epoch, log_end_offset)
    if epoch == UNDEFINED_EPOCH or end_offset < 0 or fetch_offset < log_start_offset:
        return OUT_OF_RANGE
    if epoch < last_fetched_epoch or end_offset < fetch_offset:
        return Divergence(epoch, end_offset)
    return None


class TruncationState(NamedTuple):
    """Where to truncate, and whether the reconciliation is complete (False: ask the
    leader again with our new latest epoch)."""

    offset: int
    completed: bool


def impossible_epoch_answer(leader_epoch: int, leader_end_offset: int) -> str | None:
    """Why a leader's (epoch, end offset) answer (OffsetsForLeaderEpoch, or a Fetch's
    diverging epoch) can be no leader's, or None: -1 is "undefined", anything below
    it is nonsense a follower must not truncate by (a bad answer for one partition is
    that partition's error, never its truncation)."""
    if leader_epoch < UNDEFINED_EPOCH or leader_end_offset < UNDEFINED_EPOCH_OFFSET:
        return f"the leader answered epoch {leader_epoch} ending at {leader_end_offset}"
    return None


def offset_truncation_state(
    leader_epoch: int,
    leader_end_offset: int,
    *,
    follower_end_offset_for: Callable[[int], tuple[int, int]],
    follower_leo: int,
    fetch_offset: int,
) -> TruncationState:
    """Kafka's AbstractFetcherThread.getOffsetTruncationState, case for case.

    (`leader_epoch`, `leader_end_offset`) is the leader's OffsetsForLeaderEpoch answer
    (or a Fetch diverging_epoch); `follower_end_offset_for(epoch)` is our own epoch
    lineage's answer to the same question: (largest epoch <= it, its end offset)."""
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        # The leader cannot say: keep our log and fetch from where we are.
        return TruncationState(fetch_offset, True)
    if leader_epoch == UNDEFINED_EPOCH:
        # An answer without an epoch: its end offset is all we have.
        return TruncationState(min(leader_end_offset, follower_leo), True)
    follower_epoch, follower_end = follower_end_offset_for(leader_epoch)
    if follower_end == UNDEFINED_EPOCH_OFFSET:
        # We know no epoch <= the leader's (we were not tracking then): the leader's
        # end offset it is.
        return TruncationState(min(leader_end_offset, follower_leo), True)
    if follower_epoch != leader_epoch:
        # We do not have the epoch the leader answered with: cut our epochs above it
        # and ask again with the largest epoch below it that we have.
        return TruncationState(min(follower_end, follower_leo), False)
    return TruncationState(min(follower_end, leader_end_offset, follower_leo), True)
