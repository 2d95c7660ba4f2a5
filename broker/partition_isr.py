"""A leader's ISR decisions for one partition: which followers fell out of sync, which
may join, the pending AlterPartition change (its members count in the high watermark
until the controller answers, as Kafka's maximal ISR), and what an answer does."""

from __future__ import annotations

import logging

from broker.isr import EXPAND
from broker.isr import SHRINK
from broker.isr import PendingIsr
from broker.isr import caught_up_for_expand
from broker.isr import out_of_sync_replicas
from broker.partition_role import Role
from protocol.invariants import invariant

log = logging.getLogger("broker.partition")


class PartitionIsr:
    """A leader's ISR decisions for one partition: which followers fell out of sync, which"""

    def out_of_sync_replicas(self, now_ms: int, lag_ms: int) -> list[int]:
        return out_of_sync_replicas(
            self.isr, self.node_id, self.replica_states, self.log.log_end_offset, now_ms, lag_ms
        )

    def wants_to_add(self, replica_id: int) -> bool:
        """`replica_id`, outside the ISR, has caught up enough to join it (eligibility
        by broker epoch and fencing is the caller's check, against the image)."""
        if self.role is not Role.LEADER or replica_id in self.isr:
            return False
        if replica_id not in self.replicas or replica_id == self.node_id:
            return False
        state = self.replica_states.get(replica_id)
        return state is not None and caught_up_for_expand(
            state,
            leader_epoch=self.leader_epoch,
            high_watermark=self.high_watermark,
            epoch_start_offset=self.leader_epoch_start_offset,
        )

    def propose_isr(self, kind: str, new_isr: tuple[int, ...], now_ms: int) -> PendingIsr:
        """Record an ISR change about to be sent (one at a time)."""
        invariant(
            self.role is Role.LEADER and self.pending_isr is None,
            lambda: (
                f"{self.name}: only a leader proposes an ISR change, one at a time "
                f"(role {self.role.value}, pending {self.pending_isr})"
            ),
        )
        invariant(kind in (EXPAND, SHRINK), lambda: f"{self.name}: unknown ISR change {kind!r}")
        invariant(
            self.node_id in new_isr,
            lambda: (
                f"{self.name}: a proposed ISR {list(new_isr)} must contain its leader "
                f"{self.node_id}"
            ),
        )
        pending = PendingIsr(
            kind=kind,
            isr=tuple(new_isr),
            committed_isr=self.isr,
            leader_epoch=self.leader_epoch,
            partition_epoch=self.partition_epoch,
            created_ms=now_ms,
        )
        self.pending_isr = pending
        log.info(
            "%s: %s ISR %s -> %s (leader epoch %d, partition epoch %d)",
            self.name,
            "expanding" if kind == EXPAND else "shrinking",
            list(self.isr),
            list(new_isr),
            self.leader_epoch,
            self.partition_epoch,
        )
        return pending

    def isr_change_committed(
        self, pending: PendingIsr, *, isr: tuple[int, ...], leader_epoch: int, partition_epoch: int
    ) -> bool:
        """The controller accepted `pending`: adopt its ISR and partition epoch (the
        metadata log will bring the same state later: a no-op then). Returns True when
        the high watermark moved. A stale answer is ignored."""
        if self.pending_isr is not pending or self.role is not Role.LEADER:
            return False
        if pending.refused_ms is not None:
            return False  # already answered (refused): a duplicate answer changes nothing
        if leader_epoch != self.leader_epoch or partition_epoch < self.partition_epoch:
            log.info(
                "%s: ignoring an AlterPartition answer for leader epoch %d, partition epoch "
                "%d (we are at %d, %d)",
                self.name,
                leader_epoch,
                partition_epoch,
                self.leader_epoch,
                self.partition_epoch,
            )
            return False
        self.pending_isr = None
        old = self.isr
        self.isr = tuple(isr)
        self.partition_epoch = partition_epoch
        log.info(
            "%s: ISR %s -> %s committed (partition epoch %d)%s",
            self.name,
            list(old),
            list(self.isr),
            partition_epoch,
            " (under min ISR)" if len(self.isr) < self.min_insync_replicas else "",
        )
        return self.maybe_increment_high_watermark()

    def isr_change_failed(self, pending: PendingIsr, *, await_metadata: bool, now_ms: int) -> bool:
        """The controller refused `pending` (or it was abandoned). With
        `await_metadata` its members keep counting in the high watermark until the
        metadata log brings the partition's state; otherwise the partition goes back
        to the committed ISR. Returns True when the high watermark moved."""
        if self.pending_isr is not pending:
            return False
        if await_metadata:
            pending.refused_ms = now_ms
            return False
        self.pending_isr = None
        return self.maybe_increment_high_watermark()

    def abandon_refused_isr_change(self, now_ms: int, timeout_ms: int) -> bool:
        """A refused change whose metadata never came: give up on it after `timeout_ms`
        (bounded wait). True when the high watermark moved."""
        pending = self.pending_isr
        if pending is None or pending.refused_ms is None:
            return False
        if now_ms - pending.refused_ms < timeout_ms:
            return False
        log.warning(
            "%s: no metadata superseded the refused ISR change %s -> %s within %d ms; dropping it",
            self.name,
            list(pending.committed_isr),
            list(pending.isr),
            timeout_ms,
        )
        return self.isr_change_failed(pending, await_metadata=False, now_ms=now_ms)
