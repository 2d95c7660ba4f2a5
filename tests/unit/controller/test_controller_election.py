"""Leader election and ISR rules (controller/election.py)."""

from __future__ import annotations

from controller.election import Election
from controller.election import change_partition
from controller.election import elect_if_leaderless
from controller.election import elect_leader
from controller.election import remove_broker
from protocol.metadata_records import LEADER_RECOVERED
from protocol.metadata_records import LEADER_RECOVERING
from protocol.metadata_records import NO_LEADER
from protocol.metadata_records import PartitionRecord


def part(replicas: list[int], isr: list[int], leader: int, le: int = 5, pe: int = 9):
    return PartitionRecord(
        topic_id="t",
        partition_id=0,
        replicas=replicas,
        isr=isr,
        leader=leader,
        leader_epoch=le,
        partition_epoch=pe,
    )


def usable_set(*ids: int):
    return lambda b: b in ids


def test_elect_first_usable_isr_member_in_replica_order() -> None:
    assert elect_leader([3, 1, 2], [1, 2, 3], usable_set(1, 2), unclean_allowed=False) == Election(
        1, False
    )
    assert elect_leader([3, 1, 2], [2, 1], usable_set(1, 2, 3), unclean_allowed=False).leader == 1


def test_elect_unclean_only_when_allowed() -> None:
    assert elect_leader([1, 2], [1], usable_set(2), unclean_allowed=False) == Election(
        NO_LEADER, False
    )
    assert elect_leader([1, 2], [1], usable_set(2), unclean_allowed=True) == Election(2, True)
    assert elect_leader([1, 2], [1], usable_set(), unclean_allowed=True).leader == NO_LEADER


def test_change_partition_bumps_epochs() -> None:
    p = part([1, 2], [1, 2], 1)
    assert change_partition(p, leader=1, isr=[1, 2]) is None
    isr_only = change_partition(p, isr=[1])
    assert isr_only is not None
    assert (isr_only.leader_epoch, isr_only.partition_epoch) == (5, 10)
    lead = change_partition(p, leader=2, isr=[2])
    assert lead is not None
    assert (lead.leader, lead.leader_epoch, lead.partition_epoch) == (2, 6, 10)
    rec = change_partition(p, leader_recovery_state=LEADER_RECOVERING)
    assert rec is not None and rec.partition_epoch == 10 and rec.leader_epoch == 5


def test_fenced_leader_replaced_by_next_isr_member() -> None:
    p = part([1, 2, 3], [1, 2, 3], 1)
    new = remove_broker(p, 1, usable_set(2, 3), unclean_allowed=False)
    assert new is not None
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch) == (2, [2, 3], 6, 10)


def test_fenced_follower_leaves_isr_leader_kept() -> None:
    p = part([1, 2, 3], [1, 2, 3], 1)
    new = remove_broker(p, 3, usable_set(1, 2), unclean_allowed=False)
    assert new is not None
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch) == (1, [1, 2], 5, 10)


def test_fenced_follower_outside_isr_changes_nothing() -> None:
    p = part([1, 2], [1], 1)
    assert remove_broker(p, 2, usable_set(1), unclean_allowed=False) is None
    assert remove_broker(p, 7, usable_set(1, 2), unclean_allowed=False) is None


def test_last_isr_member_stays_and_partition_goes_leaderless() -> None:
    p = part([1, 2], [1], 1)
    new = remove_broker(p, 1, usable_set(2), unclean_allowed=False)
    assert new is not None
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch) == (NO_LEADER, [1], 6, 10)


def test_nobody_eligible_keeps_fenced_leader_in_isr() -> None:
    # The other ISR member is fenced too: no leader, ISR unchanged.
    p = part([1, 2], [1, 2], 1)
    new = remove_broker(p, 1, usable_set(), unclean_allowed=False)
    assert new is not None
    assert (new.leader, new.isr) == (NO_LEADER, [1, 2])


def test_a_broker_that_lost_its_data_leaves_even_as_the_last_isr_member() -> None:
    # It led: nobody else in the ISR, so the ISR becomes empty and nobody leads.
    new = remove_broker(
        part([1, 2], [1], 1), 1, usable_set(2), unclean_allowed=False, data_lost=True
    )
    assert new is not None
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch) == (NO_LEADER, [], 6, 10)
    # Already leaderless (it was fenced as the last member): the ISR empties.
    p = part([1, 2], [1], NO_LEADER)
    new = remove_broker(p, 1, usable_set(2), unclean_allowed=False, data_lost=True)
    assert new is not None
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch) == (NO_LEADER, [], 5, 10)
    # Nobody else usable in a larger ISR: it leaves, the others stay.
    new = remove_broker(
        part([1, 2], [1, 2], 1), 1, usable_set(), unclean_allowed=False, data_lost=True
    )
    assert new is not None and (new.leader, new.isr) == (NO_LEADER, [2])
    # With unclean elections allowed, an emptied ISR gets one among the usable replicas.
    new = remove_broker(p, 1, usable_set(2), unclean_allowed=True, data_lost=True)
    assert new is not None
    assert (new.leader, new.isr, new.leader_recovery_state) == (2, [2], LEADER_RECOVERING)


def test_an_empty_isr_elects_nobody_cleanly() -> None:
    p = part([1, 2, 3], [], NO_LEADER)
    assert elect_if_leaderless(p, usable_set(1, 2, 3), unclean_allowed=False) == (None, False)
    new, unclean = elect_if_leaderless(p, usable_set(2, 3), unclean_allowed=True)
    assert unclean and new is not None and (new.leader, new.isr) == (2, [2])


def test_an_unclean_election_takes_a_replica_that_lost_its_data_last() -> None:
    everyone = usable_set(1, 2, 3)
    assert elect_leader([1, 2, 3], [], everyone, unclean_allowed=True, last_resort={1, 2}) == (
        Election(3, True)
    )
    assert elect_leader([1, 2, 3], [], usable_set(1), unclean_allowed=True, last_resort={1}) == (
        Election(1, True)
    )
    # A usable ISR member is still elected first, last resort or not.
    assert elect_leader([1, 2], [1], everyone, unclean_allowed=True, last_resort={1}) == (
        Election(1, False)
    )


def test_unclean_election_on_fencing() -> None:
    p = part([1, 2], [1], 1)
    new = remove_broker(p, 1, usable_set(2), unclean_allowed=True)
    assert new is not None
    assert (new.leader, new.isr, new.leader_recovery_state) == (2, [2], LEADER_RECOVERING)
    assert new.leader_epoch == 6


def test_leaderless_partition_elected_when_isr_member_returns() -> None:
    p = part([1, 2], [1], NO_LEADER)
    assert elect_if_leaderless(p, usable_set(2), unclean_allowed=False) == (None, False)
    new, unclean = elect_if_leaderless(p, usable_set(1, 2), unclean_allowed=False)
    assert new is not None and not unclean
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch) == (1, [1], 6, 10)
    assert new.leader_recovery_state == LEADER_RECOVERED


def test_leaderless_partition_unclean_when_allowed() -> None:
    p = part([1, 2], [1], NO_LEADER)
    new, unclean = elect_if_leaderless(p, usable_set(2), unclean_allowed=True)
    assert unclean and new is not None
    assert (new.leader, new.isr, new.leader_recovery_state) == (2, [2], LEADER_RECOVERING)


def test_partition_with_leader_is_not_reelected() -> None:
    assert elect_if_leaderless(part([1], [1], 1), usable_set(1), unclean_allowed=True) == (
        None,
        False,
    )


def test_epochs_never_decrease_over_a_sequence_of_changes() -> None:
    p = part([1, 2, 3], [1, 2, 3], 1, le=0, pe=0)
    alive = {1, 2, 3}
    for broker in (1, 2, 3):
        alive.discard(broker)
        new = remove_broker(p, broker, lambda b: b in alive, unclean_allowed=False)
        if new is not None:
            assert new.leader_epoch >= p.leader_epoch and new.partition_epoch > p.partition_epoch
            p = new
    assert p.leader == NO_LEADER and p.isr == [3]
