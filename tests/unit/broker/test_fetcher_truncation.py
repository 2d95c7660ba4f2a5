"""The follower's truncation decision, case by case as Kafka's
AbstractFetcherThread.getOffsetTruncationState, and the KIP-101 / KIP-279 iteration
to the largest common epoch over real epoch caches."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.storage.epoch_cache import EpochEntry
from broker.storage.epoch_cache import LeaderEpochFileCache
from runtime.epoch_lineage import TruncationState
from runtime.epoch_lineage import offset_truncation_state


def cache(tmp_path: Path, name: str, *entries: tuple[int, int]) -> LeaderEpochFileCache:
    c = LeaderEpochFileCache.load(tmp_path / name / "leader-epoch-checkpoint")
    (tmp_path / name).mkdir(exist_ok=True)
    for epoch, start in entries:
        c.assign(epoch, start)
    return c


def decide(
    follower: LeaderEpochFileCache, leo: int, leader_epoch: int, leader_end: int
) -> TruncationState:
    return offset_truncation_state(
        leader_epoch,
        leader_end,
        follower_end_offset_for=lambda e: follower.end_offset_for(e, leo),
        follower_leo=leo,
        fetch_offset=leo,
    )


@pytest.fixture
def follower(tmp_path: Path) -> LeaderEpochFileCache:
    # epoch 0 at 0, epoch 2 at 5, epoch 4 at 8; LEO 10 in the tests.
    return cache(tmp_path, "f", (0, 0), (2, 5), (4, 8))


def test_leader_knows_our_latest_epoch_and_has_more(follower) -> None:
    # KIP-101 scenario 1: the leader's end of our epoch is past our LEO: keep it all
    # (never the high watermark).
    assert decide(follower, 10, 4, 15) == TruncationState(10, True)


def test_leader_knows_our_latest_epoch_and_has_less(follower) -> None:
    # KIP-101 scenario 2: our tail of the epoch is not on the leader.
    assert decide(follower, 10, 4, 9) == TruncationState(9, True)


def test_leader_answers_an_older_epoch_we_have(follower) -> None:
    # Epoch 4 is unknown to the leader; its epoch 2 ends at 7, ours at 8: cut to 7.
    assert decide(follower, 10, 2, 7) == TruncationState(7, True)
    # ... and where the leader's epoch 2 ends past ours, our end of it wins.
    assert decide(follower, 10, 2, 9) == TruncationState(8, True)


def test_leader_answers_an_epoch_we_do_not_have(follower) -> None:
    # The leader's largest epoch <= 4 is 3, which we never saw: drop our epochs above
    # 3 (epoch 4 starts at 8) and ask again with epoch 2 (KIP-279).
    assert decide(follower, 10, 3, 9) == TruncationState(8, False)
    assert decide(follower, 10, 1, 9) == TruncationState(5, False)


def test_leader_answers_an_epoch_below_all_ours(tmp_path: Path) -> None:
    f = cache(tmp_path, "f", (3, 10), (5, 20))
    # Our cache answers (1, 10) for epoch 1: the same epoch, so min(10, 4) = 4.
    assert decide(f, 25, 1, 4) == TruncationState(4, True)


def test_undefined_answers(follower) -> None:
    # No end offset: keep the log, fetch from the LEO (Kafka's fallback).
    assert decide(follower, 10, -1, -1) == TruncationState(10, True)
    # An end offset without an epoch: it is all there is.
    assert decide(follower, 10, -1, 6) == TruncationState(6, True)
    assert decide(follower, 10, -1, 60) == TruncationState(10, True)


def test_follower_without_epochs(tmp_path: Path) -> None:
    empty = cache(tmp_path, "e")
    assert decide(empty, 7, 2, 5) == TruncationState(5, True)
    assert decide(empty, 7, 2, 50) == TruncationState(7, True)


def _reconcile(
    tmp_path: Path,
    leader: list[tuple[int, int]],
    leader_leo: int,
    follower: list[tuple[int, int]],
    follower_leo: int,
) -> tuple[int, list[EpochEntry], int]:
    """Run the OffsetsForLeaderEpoch loop; (final LEO, follower entries, rounds)."""
    lc = cache(tmp_path, "leader", *leader)
    fc = cache(tmp_path, "follower", *follower)
    leo = follower_leo
    for rounds in range(1, 20):
        epoch, end = lc.end_offset_for(fc.latest_epoch, leader_leo)
        decision = decide(fc, leo, epoch, end)
        leo = min(leo, decision.offset)
        fc.truncate_from_end(decision.offset)
        if decision.completed:
            return leo, fc.entries, rounds
    raise AssertionError("did not converge")


def test_iterates_to_the_largest_common_epoch(tmp_path: Path) -> None:
    # Leader: epochs 0 (0-4), 1 (5-6), 3 (7-11). Follower: 0 (0-4), 2 (5-8): epoch 2
    # was a leader that never replicated. Ask 2 -> leader (1, 7): we lack epoch 1, cut
    # to our end of epoch 0 (5) and ask 0 -> (0, 5): done at 5.
    leo, entries, rounds = _reconcile(tmp_path, [(0, 0), (1, 5), (3, 7)], 12, [(0, 0), (2, 5)], 9)
    assert (leo, entries, rounds) == (5, [EpochEntry(0, 0)], 2)


def test_common_latest_epoch_needs_one_round(tmp_path: Path) -> None:
    leo, entries, rounds = _reconcile(tmp_path, [(0, 0), (2, 5)], 12, [(0, 0), (2, 5)], 9)
    assert (leo, entries, rounds) == (9, [EpochEntry(0, 0), EpochEntry(2, 5)], 1)


def test_empty_epoch_claim_is_dropped(tmp_path: Path) -> None:
    # We led epoch 3 without writing (entry at our LEO); the new leader never had it.
    leo, entries, _ = _reconcile(tmp_path, [(0, 0), (4, 6)], 9, [(0, 0), (3, 6)], 6)
    assert leo == 6 and entries == [EpochEntry(0, 0)]
