"""ISR maintenance: expand on a follower's fetch, shrink on the periodic lag check, each
change proposed to the controller as AlterPartition (KIP-903) and applied from its
answer."""

from __future__ import annotations

from broker.alter_partition import IsrChange
from broker.controller_channel import ControllerChannel
from broker.delayed_requests import _AWAIT_METADATA
from broker.delayed_requests import log
from broker.delayed_requests import mono_ms
from broker.isr import EXPAND
from broker.isr import SHRINK
from broker.isr import PendingIsr
from broker.isr import ineligibility
from broker.isr import isr_with_epochs
from broker.partition import Partition
from broker.partition import Role
from protocol.errors import ErrorCode
from protocol.messages import AlterPartitionPartitionResult
from protocol.messages import AlterPartitionRequest
from protocol.messages import AlterPartitionResponse
from protocol.messages import FetchPartition
from protocol.metadata_records import LEADER_RECOVERED


class IsrMaintenance:
    """ISR maintenance: expand on a follower's fetch, shrink on the periodic lag check, each"""

    async def _send_alter_partition(self, request: AlterPartitionRequest) -> AlterPartitionResponse:
        channel = self._controller
        if channel is None:
            if self._own_channel is None:
                self._own_channel = ControllerChannel(
                    self.config,
                    incarnation_id=f"broker-{self.node_id}-isr",
                    metadata_offset=lambda: self.image.offset,
                )
            channel = self._own_channel
        return await channel.alter_partition(request)

    def _record_follower_fetch(
        self, p: Partition, replica_id: int, broker_epoch: int, fp: FetchPartition, ts: int
    ) -> None:
        """A follower's fetch passed the checks: its progress may move the high
        watermark (waking delayed produces) and let it join the ISR."""
        if p.update_follower_fetch_state(replica_id, broker_epoch, fp.fetch_offset, ts):
            # The high watermark moved: acks=all produces and consumers' fetches are
            # answered; followers' waiting fetches learn it with their next answer.
            self._notify(p.tp, wake_sessions=False)
        self._maybe_expand_isr(p, replica_id, ts)

    def _maybe_expand_isr(self, p: Partition, replica_id: int, ts: int) -> None:
        if p.pending_isr is not None or self.node_id not in p.isr:
            return
        if not p.wants_to_add(replica_id):
            return
        if ts < self._isr_retry_after.get(p.tp, 0):
            return
        state = p.replica_states[replica_id]
        why = ineligibility(replica_id, state.broker_epoch, self.image.brokers.get(replica_id))
        if why is not None:
            log.debug(
                "%s: broker %d caught up but may not join the ISR: %s", p.name, replica_id, why
            )
            return
        new_isr = tuple(r for r in p.replicas if r in p.isr or r == replica_id)
        self._propose(p, EXPAND, new_isr, ts)

    def _check_isr(self) -> None:
        """Periodic (every replica.lag.time.max.ms / 2): shrink the ISR of the
        partitions we lead by the followers that lag; give up on refused changes the
        metadata log never superseded."""
        ts = mono_ms()
        lag_ms = self.config.replica_lag_time_max_ms
        for p in list(self.partitions.values()):
            if p.role is not Role.LEADER or self.node_id not in p.isr:
                continue
            if p.abandon_refused_isr_change(ts, self._refused_isr_timeout_ms):
                self._notify(p.tp)
            if p.pending_isr is not None or ts < self._isr_retry_after.get(p.tp, 0):
                continue
            lagging = p.out_of_sync_replicas(ts, lag_ms)
            if not lagging:
                continue
            for r in lagging:
                st = p.replica_states.get(r)
                log.info(
                    "%s: follower %d is out of sync (LEO %s, leader LEO %d, last caught up "
                    "%s ms ago, lag limit %d ms)",
                    p.name,
                    r,
                    st.log_end_offset if st is not None else "unknown",
                    p.log_end_offset,
                    ts - st.last_caught_up_time_ms if st is not None else "never",
                    lag_ms,
                )
            new_isr = tuple(r for r in p.isr if r not in lagging)
            self._propose(p, SHRINK, new_isr, ts)

    def _propose(self, p: Partition, kind: str, new_isr: tuple[int, ...], ts: int) -> None:
        pending = p.propose_isr(kind, new_isr, ts)
        # Growing the ISR ends an unclean leader's recovery (KIP-704: the controller
        # refuses a larger ISR while RECOVERING); a shrink keeps the current state.
        recovery = LEADER_RECOVERED if kind == EXPAND else p.leader_recovery_state
        change = IsrChange(
            tp=p.tp,
            leader_epoch=pending.leader_epoch,
            partition_epoch=pending.partition_epoch,
            new_isr_with_epochs=isr_with_epochs(
                new_isr, self.node_id, self.broker_epoch(), p.replica_states
            ),
            leader_recovery_state=recovery,
            on_result=lambda error, result: self._on_isr_result(p, pending, error, result),
            is_current=lambda: p.pending_isr is pending and p.role is Role.LEADER,
        )
        if not self.alter_partitions.submit(change):
            # Only when the manager is closed (or a stale change for this partition is
            # still in flight): forget the proposal.
            p.isr_change_failed(pending, await_metadata=False, now_ms=ts)
        # A pending expand counts the new member at once (maximal ISR).
        self._notify(p.tp)

    def _on_isr_result(
        self,
        p: Partition,
        pending: PendingIsr,
        error: ErrorCode,
        result: AlterPartitionPartitionResult | None,
    ) -> None:
        ts = mono_ms()
        if error == ErrorCode.NONE and result is not None:
            moved = p.isr_change_committed(
                pending,
                isr=tuple(result.isr),
                leader_epoch=result.leader_epoch,
                partition_epoch=result.partition_epoch,
            )
        else:
            await_metadata = error in _AWAIT_METADATA
            if p.pending_isr is pending:
                log.info(
                    "%s: ISR change %s -> %s refused: %s%s",
                    p.name,
                    list(pending.committed_isr),
                    list(pending.isr),
                    error.name,
                    "; waiting for the metadata log" if await_metadata else "; will retry later",
                )
            moved = p.isr_change_failed(pending, await_metadata=await_metadata, now_ms=ts)
            if not await_metadata:
                # INELIGIBLE_REPLICA (KIP-903) or an unexpected answer: back to the
                # committed ISR; a later fetch or check may propose again.
                self._isr_retry_after[p.tp] = ts + self._isr_retry_ms
        if moved or p.pending_isr is None:
            self._notify(p.tp)
