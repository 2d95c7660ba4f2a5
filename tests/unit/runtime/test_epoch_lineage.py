"""runtime/epoch_lineage.py: the leader-epoch rules every replicated log shares.

Invariants protected: a leader answers a fetch whose log is a prefix of its own with
nothing to truncate, one it cannot place (unknown epoch, offset below its log start)
with OUT_OF_RANGE, and a diverging one with where the fetcher's epoch ends here; and
`assign` keeps epochs strictly increasing by removing exactly the entries it would
contradict, reporting them (None when nothing changed).
"""

from __future__ import annotations

import pytest

from protocol.invariants import InvariantError
from runtime.epoch_lineage import OUT_OF_RANGE
from runtime.epoch_lineage import Divergence
from runtime.epoch_lineage import EpochEntry
from runtime.epoch_lineage import EpochLineage
from runtime.epoch_lineage import diverging_epoch


def lineage(*pairs: tuple[int, int]) -> EpochLineage:
    return EpochLineage(EpochEntry(e, o) for e, o in pairs)


# The leader's log in the diverging_epoch tests: epoch 1 at 0, epoch 3 at 5, epoch 5
# at 9, log start 2, log end 12.
LEADER = lineage((1, 0), (3, 5), (5, 9))
LOG_START, LEO = 2, 12


def check(last_fetched_epoch: int, fetch_offset: int) -> Divergence | None:
    return diverging_epoch(LEADER, LOG_START, LEO, last_fetched_epoch, fetch_offset)


# ---------------------------------------------------------------- diverging_epoch


def test_a_prefix_of_the_leaders_log_fetches_on() -> None:
    """Fetcher's epoch known here and ending at or past its fetch offset: None."""
    assert check(5, 12) is None  # the latest epoch ends at the log end
    assert check(5, 10) is None
    assert check(3, 9) is None  # epoch 3 ends exactly where the fetcher stands
    assert check(1, 4) is None


def test_no_last_fetched_epoch_is_not_checked() -> None:
    """NO_EPOCH (or any negative epoch): nothing to compare, None whatever the offset."""
    assert check(-1, 0) is None
    assert check(-1, 100) is None


def test_an_epoch_the_leader_cannot_place_is_out_of_range() -> None:
    """An epoch newer than the leader's latest (or an empty lineage): OUT_OF_RANGE."""
    assert check(6, 12) == OUT_OF_RANGE
    assert diverging_epoch(EpochLineage(), 0, 0, 2, 0) == OUT_OF_RANGE


def test_an_offset_below_the_log_start_is_out_of_range() -> None:
    """Kafka's order: below the log start is out of range even for a matching epoch."""
    assert check(1, 1) == OUT_OF_RANGE
    assert check(5, 1) == OUT_OF_RANGE


def test_an_epoch_the_leader_skipped_diverges_at_its_end_here() -> None:
    """The fetcher's epoch 4 is unknown here: the largest smaller epoch (3) and where
    it ends (9) are the answer."""
    assert check(4, 10) == Divergence(epoch=3, end_offset=9)
    assert check(4, 3) == Divergence(epoch=3, end_offset=9)  # smaller epoch suffices


def test_an_epoch_ending_before_the_fetch_offset_diverges() -> None:
    """The fetcher has more of epoch 3 than the leader wrote: truncate to its end."""
    assert check(3, 11) == Divergence(epoch=3, end_offset=9)
    assert check(1, 6) == Divergence(epoch=1, end_offset=5)


# ---------------------------------------------------------------- assign


def test_assign_same_epoch_at_or_after_its_start_changes_nothing() -> None:
    """None: the latest epoch already covers the offset."""
    epochs = lineage((2, 6))
    assert epochs.assign(2, 6) is None
    assert epochs.assign(2, 9) is None
    assert epochs.entries == [EpochEntry(2, 6)]


def test_assign_a_new_epoch_removes_nothing() -> None:
    """A larger epoch at a larger offset appends: a change with no entry removed."""
    epochs = lineage((2, 6))
    assert epochs.assign(3, 8) == []
    assert epochs.entries == [EpochEntry(2, 6), EpochEntry(3, 8)]
    assert epochs.latest_epoch == 3


def test_assign_removes_the_entries_it_contradicts_oldest_first() -> None:
    """Entries with epoch >= the new one or start >= the new start go, reported in
    order; older ones stay."""
    epochs = lineage((1, 0), (2, 5), (4, 8), (6, 10))
    assert epochs.assign(3, 7) == [EpochEntry(4, 8), EpochEntry(6, 10)]
    assert epochs.entries == [EpochEntry(1, 0), EpochEntry(2, 5), EpochEntry(3, 7)]


def test_assign_same_epoch_earlier_offset_replaces_it() -> None:
    """The latest epoch starting earlier replaces its entry and any later claim."""
    epochs = lineage((5, 11), (6, 12), (7, 13))
    assert epochs.assign(7, 12) == [EpochEntry(6, 12), EpochEntry(7, 13)]
    assert epochs.entries == [EpochEntry(5, 11), EpochEntry(7, 12)]


def test_assign_refuses_negative_values_and_bad_lineages() -> None:
    """Negative epochs or offsets are refused; a decreasing lineage never loads."""
    with pytest.raises(ValueError):
        EpochLineage().assign(-1, 0)
    with pytest.raises(ValueError):
        EpochLineage().assign(0, -1)
    with pytest.raises(InvariantError, match="strictly increase"):
        lineage((3, 0), (2, 5))
    with pytest.raises(InvariantError, match="must not decrease"):
        lineage((1, 5), (2, 3))
