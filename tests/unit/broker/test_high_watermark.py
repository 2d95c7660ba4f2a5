"""High-watermark rules on a Partition over a real log: min LEO over the maximal ISR,
only once every member fetched in the leader's current epoch, never backwards;
pending ISR changes counted until answered or superseded; the follower side."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_harness import partition_state

from broker.isr import EXPAND
from broker.isr import SHRINK
from broker.isr import PendingIsr
from broker.partition import Partition
from broker.partition import Role
from broker.storage.log import Log
from broker.storage.log import LogConfig
from protocol.record_batch import encode_batch


def one() -> bytes:
    return encode_batch([(None, b"v")])


@pytest.fixture
def p(tmp_path: Path) -> Iterator[Partition]:
    log = Log.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    yield Partition("t", 0, "T", log, node_id=1)
    log.close()


def leader_with(p: Partition, records: int, **kw) -> None:
    p.make_leader(partition_state(1, 0, **kw), now_ms=0)
    for _ in range(records):
        p.append_as_leader(one())


def test_min_leo_over_the_isr(p: Partition) -> None:
    leader_with(p, 5)
    assert p.high_watermark == 0
    assert not p.update_follower_fetch_state(2, 102, 4, now_ms=1)  # 3 not heard from
    assert p.update_follower_fetch_state(3, 103, 2, now_ms=1)
    assert p.high_watermark == 2
    p.update_follower_fetch_state(3, 103, 5, now_ms=2)
    assert p.high_watermark == 4


def test_never_moves_back(p: Partition) -> None:
    leader_with(p, 3, isr=(1, 2))
    p.update_follower_fetch_state(2, 102, 3, now_ms=1)
    assert p.high_watermark == 3
    assert not p.update_follower_fetch_state(2, 102, 1, now_ms=2)
    assert p.high_watermark == 3
    with pytest.raises(AssertionError):
        p._set_high_watermark(2)
    with pytest.raises(AssertionError):
        p._set_high_watermark(4)  # past the LEO


def test_waits_for_every_isr_member_in_the_new_epoch(p: Partition) -> None:
    leader_with(p, 4, isr=(1, 2))
    p.update_follower_fetch_state(2, 102, 2, now_ms=1)
    assert p.high_watermark == 2
    # New term (epoch 1): follower 2's LEO is unknown again until it fetches in it.
    p.make_leader(partition_state(1, 1, isr=(1, 2)), now_ms=2)
    p.append_as_leader(one())
    assert p.replica_states[2].fetch_epoch == -1
    assert p.high_watermark == 2
    assert p.update_follower_fetch_state(2, 102, 5, now_ms=3)
    assert p.high_watermark == 5 and p.replica_states[2].fetch_epoch == 1


def test_replicas_outside_the_isr_do_not_hold_it(p: Partition) -> None:
    leader_with(p, 3, isr=(1, 2))
    p.update_follower_fetch_state(3, 103, 0, now_ms=1)
    p.update_follower_fetch_state(2, 102, 3, now_ms=1)
    assert p.high_watermark == 3


def test_isr_of_the_leader_alone(p: Partition) -> None:
    leader_with(p, 3, isr=(1,))
    assert p.high_watermark == 3


def leader_proposing(
    p: Partition,
    kind: str,
    new_isr: tuple[int, ...],
    *,
    fetched: dict[int, int],
    hw: int,
    isr: tuple[int, ...] = (1, 2, 3),
) -> PendingIsr:
    """Leader of 4 records with ISR `isr`; each follower (broker epoch 100 + its id) has
    fetched up to `fetched[broker]`, which makes the high watermark `hw`; then the ISR
    change `kind` to `new_isr`, proposed and pending."""
    leader_with(p, 4, isr=isr)
    for broker, offset in fetched.items():
        p.update_follower_fetch_state(broker, 100 + broker, offset, now_ms=1)
    assert p.high_watermark == hw
    return p.propose_isr(kind, new_isr, now_ms=2)


def test_pending_expand_counts_the_new_member(p: Partition) -> None:
    pending = leader_proposing(p, EXPAND, (1, 2, 3), isr=(1, 2), fetched={2: 4, 3: 4}, hw=4)
    assert p.maximal_isr == (1, 2, 3) and p.isr == (1, 2)
    p.append_as_leader(one())
    p.update_follower_fetch_state(2, 102, 5, now_ms=3)
    assert p.high_watermark == 4  # 3 (pending) has not fetched offset 4 yet
    p.update_follower_fetch_state(3, 103, 5, now_ms=3)
    assert p.high_watermark == 5
    assert not p.isr_change_committed(pending, isr=(1, 2, 3), leader_epoch=0, partition_epoch=1)
    assert (p.isr, p.partition_epoch, p.pending_isr) == ((1, 2, 3), 1, None)


def test_pending_shrink_still_counts_the_removed_member(p: Partition) -> None:
    pending = leader_proposing(p, SHRINK, (1, 2), fetched={2: 4, 3: 1}, hw=1)
    assert p.maximal_isr == (1, 2, 3)
    p.update_follower_fetch_state(2, 102, 4, now_ms=3)
    assert p.high_watermark == 1  # 3 still counts while the shrink is pending
    assert p.isr_change_committed(pending, isr=(1, 2), leader_epoch=0, partition_epoch=1)
    assert p.high_watermark == 4


def test_refused_change_counts_until_the_metadata_supersedes_it(p: Partition) -> None:
    pending = leader_proposing(p, SHRINK, (1, 2), fetched={2: 4, 3: 1}, hw=1)
    # INVALID_UPDATE_VERSION: our view is stale; keep the maximal ISR meanwhile.
    assert not p.isr_change_failed(pending, await_metadata=True, now_ms=3)
    assert p.pending_isr is pending and p.high_watermark == 1
    # A second answer for it changes nothing.
    assert not p.isr_change_committed(pending, isr=(1, 2), leader_epoch=0, partition_epoch=0)
    # The metadata log brings the partition's newer state: the proposal is moot.
    p.make_leader(partition_state(1, 0, isr=(1, 2), pe=2), now_ms=4)
    assert p.pending_isr is None and p.isr == (1, 2) and p.high_watermark == 4


def test_refused_change_is_abandoned_after_a_timeout(p: Partition) -> None:
    pending = leader_proposing(p, SHRINK, (1, 2), fetched={2: 4, 3: 1}, hw=1)
    p.isr_change_failed(pending, await_metadata=True, now_ms=10)
    assert not p.abandon_refused_isr_change(now_ms=100, timeout_ms=1000)
    assert not p.abandon_refused_isr_change(now_ms=2000, timeout_ms=1000)  # ISR unchanged
    assert p.pending_isr is None and p.isr == (1, 2, 3) and p.high_watermark == 1


def test_ineligible_reverts_to_the_committed_isr(p: Partition) -> None:
    pending = leader_proposing(p, EXPAND, (1, 2, 3), isr=(1, 2), fetched={2: 2, 3: 4}, hw=2)
    p.isr_change_failed(pending, await_metadata=False, now_ms=3)
    assert p.pending_isr is None and p.maximal_isr == (1, 2)


def test_metadata_with_an_older_partition_epoch_is_ignored(p: Partition) -> None:
    leader_with(p, 1)
    pending = p.propose_isr(SHRINK, (1, 2), now_ms=1)
    p.isr_change_committed(pending, isr=(1, 2), leader_epoch=0, partition_epoch=1)
    pending = p.propose_isr(SHRINK, (1,), now_ms=2)
    p.isr_change_committed(pending, isr=(1,), leader_epoch=0, partition_epoch=2)
    # The metadata log catches up through epoch 1 first: nothing moves back.
    p.make_leader(partition_state(1, 0, isr=(1, 2), pe=1), now_ms=3)
    assert (p.isr, p.partition_epoch) == ((1,), 2)


def test_follower_applies_min_of_leader_hw_and_its_leo(p: Partition) -> None:
    p.make_follower(partition_state(2, 0))
    p.log.append_as_leader(one(), 0)  # as if fetched: offsets 0..1
    p.log.append_as_leader(one(), 0)
    assert p.update_follower_high_watermark(10)
    assert p.high_watermark == 2  # never beyond our LEO
    assert not p.update_follower_high_watermark(1)  # never backwards
    assert p.high_watermark == 2


def test_follower_truncation_below_hw_is_logged(
    p: Partition, caplog: pytest.LogCaptureFixture
) -> None:
    p.make_follower(partition_state(2, 0))
    for _ in range(3):
        p.log.append_as_leader(one(), 0)
    p.update_follower_high_watermark(3)
    p.truncate_to(3, reason="test")  # not below: nothing happens
    assert p.high_watermark == 3
    with caplog.at_level(logging.WARNING):
        p.truncate_to(1, reason="test")
    assert p.high_watermark == 1 and "committed records were lost" in caplog.text


def test_a_leader_never_truncates(p: Partition) -> None:
    leader_with(p, 2)
    with pytest.raises(AssertionError):
        p.truncate_to(0, reason="test")
    assert p.role is Role.LEADER
