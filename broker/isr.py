"""The in-sync replica set as the leader sees it: per-follower progress, the pending
(proposed but not yet answered) ISR change, and the rules that decide shrink, expand
and the high watermark. Pure functions over plain data; the I/O lives in
alter_partition.py (AlterPartition to the controller) and replica_manager.py.

Rules (Kafka's Partition / Replica, KIP-903):

- A follower is *caught up* when it fetched up to the leader's log end offset as it
  was at that moment; `last_caught_up_time_ms` remembers when (Kafka's
  Replica.updateFetchState: a fetch that reaches the LEO the leader had at the
  previous fetch also counts, as of the previous fetch's time).
- Shrink: an ISR follower whose LEO differs from the leader's and who has not been
  caught up for `replica.lag.time.max.ms` leaves the ISR.
- Expand: a follower outside the ISR joins when it fetched in the leader's current
  epoch, its LEO has reached the high watermark AND the high watermark has reached
  the start offset of the leader's current epoch (DESIGN section 7), and it is
  eligible: registered, not fenced, and the broker epoch it sent in Fetch equals the
  one in the metadata image (KIP-903; an unknown epoch is not eligible).
- High watermark: the minimum LEO over the *maximal* ISR (the committed ISR plus the
  members of a pending change: Kafka's PendingExpandIsr / PendingShrinkIsr), counted
  only once every one of them has fetched in the leader's current epoch.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.messages import BrokerState

if TYPE_CHECKING:
    from broker.metadata_image import BrokerInfo

EXPAND = "expand"
SHRINK = "shrink"


@dataclass
class ReplicaState:
    """A follower's progress as the leader sees it (filled from its Fetch requests)."""

    broker_id: int
    broker_epoch: int = -1  # from the follower's Fetch (KIP-903), -1 until it fetched
    log_end_offset: int = -1  # its fetch offset; -1: unknown in this leader term
    fetch_epoch: int = -1  # the leader epoch in which it last fetched
    last_fetch_time_ms: int = 0
    last_fetch_leader_leo: int = -1  # the leader's LEO at its last fetch
    last_caught_up_time_ms: int = 0

    def update(
        self,
        *,
        broker_epoch: int,
        fetch_offset: int,
        leader_epoch: int,
        leader_leo: int,
        now_ms: int,
    ) -> None:
        """Kafka's Replica.updateFetchState."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_leo >= 0:
            # It holds everything the leader had at its previous fetch.
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.broker_epoch = broker_epoch
        self.log_end_offset = fetch_offset
        self.fetch_epoch = leader_epoch
        self.last_fetch_leader_leo = leader_leo
        self.last_fetch_time_ms = now_ms

    def still_caught_up(self, now_ms: int) -> None:
        """It fetched again at `now_ms` from the same offset, which was the leader's
        LEO then (what `update` records for such a fetch, given by a fetch session
        that found nothing new for it: broker/fetch_sessions.py)."""
        self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        if now_ms > self.last_fetch_time_ms:
            self.last_fetch_time_ms = now_ms
            self.last_fetch_leader_leo = self.log_end_offset

    def is_caught_up(self, leader_leo: int, now_ms: int, lag_ms: int) -> bool:
        return self.log_end_offset == leader_leo or now_ms - self.last_caught_up_time_ms <= lag_ms


@dataclass
class PendingIsr:
    """An AlterPartition sent (or queued) and not answered yet. `refused_ms` is set
    when the controller refused it with an error that means "your view is stale"
    (FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION, STALE_BROKER_EPOCH...): it is never
    retried, but its members still count in the high watermark until the metadata log
    brings the partition's new state (or the abandon timeout passes)."""

    kind: str  # EXPAND or SHRINK
    isr: tuple[int, ...]  # the proposed ISR
    committed_isr: tuple[int, ...]  # the ISR it was based on
    leader_epoch: int
    partition_epoch: int
    created_ms: int
    refused_ms: int | None = None

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus any member this change adds."""
        return self.committed_isr + tuple(r for r in self.isr if r not in self.committed_isr)


def out_of_sync_replicas(
    isr: Iterable[int],
    leader_id: int,
    states: Mapping[int, ReplicaState],
    leader_leo: int,
    now_ms: int,
    lag_ms: int,
) -> list[int]:
    """ISR followers that have not caught up for `lag_ms` (Kafka's getOutOfSyncReplicas)."""
    out = []
    for replica in isr:
        if replica == leader_id:
            continue
        state = states.get(replica)
        if state is None or not state.is_caught_up(leader_leo, now_ms, lag_ms):
            out.append(replica)
    return out


def caught_up_for_expand(
    state: ReplicaState, *, leader_epoch: int, high_watermark: int, epoch_start_offset: int
) -> bool:
    """A follower outside the ISR may join: it fetched in this leader epoch, reached the
    high watermark, and the high watermark reached the start of this epoch."""
    return (
        state.fetch_epoch == leader_epoch
        and state.log_end_offset >= high_watermark
        and high_watermark >= epoch_start_offset >= 0
    )


def ineligibility(
    replica_id: int, fetch_broker_epoch: int, broker: BrokerInfo | None
) -> str | None:
    """Why `replica_id` may not join the ISR now (None: it may). KIP-903: the broker
    epoch it fetched with must be the one the metadata image knows."""
    if broker is None:
        return f"broker {replica_id} is not registered"
    if broker.fenced:
        return f"broker {replica_id} is fenced"
    if fetch_broker_epoch < 0:
        return f"broker {replica_id} has not sent its broker epoch"
    if fetch_broker_epoch != broker.broker_epoch:
        return (
            f"broker {replica_id} fetched with broker epoch {fetch_broker_epoch}, the metadata "
            f"says {broker.broker_epoch}"
        )
    return None


def isr_with_epochs(
    isr: Iterable[int], local_id: int, local_epoch: int, states: Mapping[int, ReplicaState]
) -> list[BrokerState]:
    """new_isr_with_epochs: our own epoch for us, each follower's Fetch epoch for it
    (-1, which skips the controller's check, when the leader has none: Kafka's rule for
    existing members it has not heard from in this term)."""
    out = []
    for replica in isr:
        if replica == local_id:
            epoch = local_epoch
        else:
            state = states.get(replica)
            epoch = state.broker_epoch if state is not None else -1
        out.append(BrokerState(broker_id=replica, broker_epoch=epoch))
    return out


def high_watermark_candidate(
    leader_leo: int,
    maximal_isr: Iterable[int],
    local_id: int,
    states: Mapping[int, ReplicaState],
    leader_epoch: int,
) -> int | None:
    """min LEO over the maximal ISR, or None while a member has not fetched in
    `leader_epoch` (its LEO in this term is unknown)."""
    new_hw = leader_leo
    for replica in maximal_isr:
        if replica == local_id:
            continue
        state = states.get(replica)
        if state is None or state.fetch_epoch != leader_epoch or state.log_end_offset < 0:
            return None
        new_hw = min(new_hw, state.log_end_offset)
    return new_hw
