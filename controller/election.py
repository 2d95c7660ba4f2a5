"""Leader election and ISR changes, as pure functions over PartitionRecords.

Each function takes a partition's current state and returns its next state (a new
PartitionRecord with the epochs bumped) or None when nothing changes. Rules:

- the epochs move as controller/epochs.py says (`change_partition`);
- a clean election picks the first replica, in replica order, that is in the ISR and
  usable (registered, unfenced, not shutting down);
- an unclean election (only when the topic allows it and no clean candidate exists)
  picks the first usable replica outside the ISR; the ISR becomes just that replica
  and the leader is RECOVERING (KIP-704);
- a preferred election (ElectLeaders PREFERRED, the controller's leader rebalance)
  gives the leadership back to the first replica listed, only when it is in the ISR
  and usable;
- a broker that goes away (fenced, shutting down, replaced by a new incarnation)
  leaves every ISR except where it is the last member (KIP-903's exception: there is
  no better replica to keep), and if it led the partition a new leader is elected;
  when nobody can lead, the leader is NO_LEADER and the ISR is unchanged. (Test-only
  `keep_in_isr`: the broker stays in every ISR and only its leaderships move, as a
  restarted ZooKeeper-era replica did; KIP-101 scenario 1 needs it.)
- a broker whose data is gone (`data_lost`: it registered again with an empty data
  directory) leaves every ISR, the last member included: an empty replica is never
  in sync. The ISR may become empty; then no election is clean, and the partition
  stays leaderless (its records kept on the out-of-sync replicas) until an unclean
  election is allowed (the topic's config, or an operator's ElectLeaders), which picks
  a usable replica outside the ISR, one known to have lost its data last.

A replica that restarted after an unclean shutdown with its data is not treated so:
as the last ISR member it stays and leads again. A crashed process loses nothing that
reached the page cache (the recovery cuts only a torn tail); only a host crash can
lose an unflushed tail, and no other replica is known to hold every acknowledged
record (KIP-966's eligible leader replicas would know; not built here). Emptying the
ISR on every unclean restart would leave the partition offline after every SIGKILL.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Container
from typing import NamedTuple

from controller.epochs import change_partition
from protocol.metadata_records import LEADER_RECOVERING
from protocol.metadata_records import NO_LEADER
from protocol.metadata_records import PartitionRecord

__all__ = [
    "Election",
    "IsUsable",
    "change_partition",
    "elect_if_leaderless",
    "elect_leader",
    "elect_preferred",
    "remove_broker",
]

IsUsable = Callable[[int], bool]


class Election(NamedTuple):
    leader: int
    unclean: bool


def elect_leader(
    replicas: list[int],
    isr: list[int],
    is_usable: IsUsable,
    *,
    unclean_allowed: bool,
    last_resort: Container[int] = (),
) -> Election:
    """`last_resort`: brokers known to have lost their data (registered with an empty
    data directory); an unclean election takes them only when nobody else is usable."""
    for broker in replicas:
        if broker in isr and is_usable(broker):
            return Election(broker, False)
    if unclean_allowed:
        outside = [b for b in replicas if b not in isr and is_usable(b)]
        if outside:  # the first in replica order, the last resort after the others
            return Election(min(outside, key=lambda b: b in last_resort), True)
    return Election(NO_LEADER, False)


def elect_preferred(partition: PartitionRecord, is_usable: IsUsable) -> PartitionRecord | None:
    """The partition led by its preferred replica (the first listed) when that replica
    is in sync, usable and not leading already; None otherwise. A partition recovering
    from an unclean election keeps its leader until it has recovered."""
    preferred = partition.replicas[0] if partition.replicas else NO_LEADER
    if (
        preferred == NO_LEADER
        or partition.leader == preferred
        or preferred not in partition.isr
        or not is_usable(preferred)
        or partition.leader_recovery_state == LEADER_RECOVERING
    ):
        return None
    return change_partition(partition, leader=preferred)


def remove_broker(
    partition: PartitionRecord,
    broker_id: int,
    is_usable: IsUsable,
    *,
    unclean_allowed: bool,
    keep_in_isr: bool = False,
    data_lost: bool = False,
    last_resort: Container[int] = (),
) -> PartitionRecord | None:
    """`broker_id` is going away (fenced, shutting down, or its incarnation replaced):
    take it out of the ISR (unless it is the last member, or `keep_in_isr`, test only)
    and elect another leader if it led. With `data_lost` (its new incarnation has an
    empty data directory) it leaves the ISR even as the last member, and a partition
    it leaves leaderless with an empty ISR gets an unclean election if allowed.
    `is_usable` must already answer False for `broker_id`."""
    if broker_id not in partition.replicas:
        return None
    others = [b for b in partition.isr if b != broker_id]
    drop = data_lost and not keep_in_isr and broker_id in partition.isr
    emptied_leaderless = drop and not others and partition.leader == NO_LEADER
    if partition.leader == broker_id or emptied_leaderless:
        election = elect_leader(
            partition.replicas,
            others,
            is_usable,
            unclean_allowed=unclean_allowed,
            last_resort=last_resort,
        )
        if election.leader == NO_LEADER:
            # Nobody can lead: keep the ISR (the broker may well be its last member)
            # so the partition comes back with it, not with an out-of-sync replica;
            # unless its data is gone: then it comes back with nobody cleanly.
            return change_partition(partition, leader=NO_LEADER, isr=others if drop else None)
        if election.unclean:
            return change_partition(
                partition,
                leader=election.leader,
                isr=[election.leader],
                leader_recovery_state=LEADER_RECOVERING,
            )
        isr = partition.isr if keep_in_isr else others
        return change_partition(partition, leader=election.leader, isr=isr)
    if keep_in_isr:
        return None
    if broker_id in partition.isr and (others or drop):
        return change_partition(partition, isr=others)
    return None


def elect_if_leaderless(
    partition: PartitionRecord,
    is_usable: IsUsable,
    *,
    unclean_allowed: bool,
    last_resort: Container[int] = (),
) -> tuple[PartitionRecord | None, bool]:
    """Elect a leader for a partition that has none (after a broker came back); with an
    empty ISR only an unclean election can. Returns (new state or None, whether the
    election was unclean)."""
    if partition.leader != NO_LEADER:
        return None, False
    election = elect_leader(
        partition.replicas,
        partition.isr,
        is_usable,
        unclean_allowed=unclean_allowed,
        last_resort=last_resort,
    )
    if election.leader == NO_LEADER:
        return None, False
    if election.unclean:
        changed = change_partition(
            partition,
            leader=election.leader,
            isr=[election.leader],
            leader_recovery_state=LEADER_RECOVERING,
        )
        return changed, True
    return change_partition(partition, leader=election.leader), False
