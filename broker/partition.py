"""One partition replica on this broker: its role, epochs, replica set, ISR, high
watermark, and the leader-side rules that do not need the network.

All leader-epoch checks of Produce / Fetch / ListOffsets / OffsetsForLeaderEpoch go
through `check_leader_epoch`, so the KIP-320/KIP-359 rule lives in one place.

The high watermark only moves forward (asserted): it is the minimum log end offset
over the ISR, computed by the leader. With replication factor 1 the ISR is the leader
alone, so it is the log end offset after every append. Followers' progress
(`ReplicaState`) is recorded by the leader from their Fetch requests; issue 3 adds
the ISR shrink/expand decisions on top of it.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.api import NO_EPOCH
from protocol.errors import ErrorCode
from protocol.messages import LeaderIdAndEpoch
from protocol.metadata_records import LEADER_RECOVERED, NO_LEADER

if TYPE_CHECKING:
    from broker.metadata_image import PartitionState
    from broker.storage.log import AppendInfo, Log

log = logging.getLogger(__name__)

MIN_INSYNC_REPLICAS = "min.insync.replicas"


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    OFFLINE = "offline"  # a replica here, but the partition has no leader
    STOPPED = "stopped"  # removed from this broker; in-flight requests must give up


@dataclass
class ReplicaState:
    """A follower's progress as the leader sees it (filled from its Fetch requests)."""

    broker_id: int
    broker_epoch: int = -1
    log_end_offset: int = -1  # -1: unknown since this broker became leader
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0


class Partition:
    def __init__(
        self,
        topic: str,
        index: int,
        topic_id: str,
        log_: Log,
        *,
        node_id: int,
        high_watermark: int = 0,
        min_insync_replicas: int = 1,
    ) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.log = log_
        self.node_id = node_id
        self.role = Role.OFFLINE
        self.leader_id = NO_LEADER
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.leader_recovery_state = LEADER_RECOVERED
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self.min_insync_replicas = min_insync_replicas
        # Followers' progress, keyed by broker id (leader side only).
        self.replica_states: dict[int, ReplicaState] = {}
        # Bytes appended since this object exists: lets a waiting fetch estimate how
        # much became available without reading.
        self.appended_bytes = 0
        # The checkpoint may be ahead of a log cut short by an unclean shutdown.
        self.high_watermark = max(log_.log_start_offset, min(high_watermark, log_.log_end_offset))

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.index)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def current_leader(self) -> LeaderIdAndEpoch:
        return LeaderIdAndEpoch(leader_id=self.leader_id, leader_epoch=self.leader_epoch)

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    # ------------------------------------------------------------------ epoch checks

    def check_leader_epoch(
        self, current_leader_epoch: int, *, require_leader: bool = True
    ) -> ErrorCode:
        """KIP-320 / KIP-359: -1 skips the comparison; an older epoch than ours is
        FENCED_LEADER_EPOCH (the client's metadata is stale), a newer one
        UNKNOWN_LEADER_EPOCH (ours is). Then, when `require_leader`, a replica that is
        not the leader answers NOT_LEADER_OR_FOLLOWER."""
        if self.role is Role.STOPPED:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch != NO_EPOCH:
            if current_leader_epoch < self.leader_epoch:
                return ErrorCode.FENCED_LEADER_EPOCH
            if current_leader_epoch > self.leader_epoch:
                return ErrorCode.UNKNOWN_LEADER_EPOCH
        if require_leader and self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    # ------------------------------------------------------------------ role changes

    def _accept_state(self, state: PartitionState) -> None:
        # The controller never lowers an epoch; if it did, fencing would be unsound.
        assert state.leader_epoch >= self.leader_epoch, (
            f"{self.name}: leader epoch went back {self.leader_epoch} -> {state.leader_epoch}"
        )
        assert state.partition_epoch >= self.partition_epoch, (
            f"{self.name}: partition epoch went back "
            f"{self.partition_epoch} -> {state.partition_epoch}"
        )
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.leader_recovery_state = state.leader_recovery_state
        self.replicas = state.replicas
        self.isr = state.isr

    def make_leader(self, state: PartitionState, now_ms: int) -> bool:
        """Take (or keep) leadership at `state.leader_epoch`. Returns True when this is
        a new leadership or a new epoch (the epoch cache got an entry)."""
        assert state.leader == self.node_id
        new_term = self.role is not Role.LEADER or state.leader_epoch != self.leader_epoch
        self._accept_state(state)
        self.role = Role.LEADER
        if new_term:
            # KIP-101: the new epoch starts at our log end offset; every batch we
            # append from now on is stamped with it.
            self.log.epoch_cache.assign(self.leader_epoch, self.log.log_end_offset)
            self.replica_states = {
                r: ReplicaState(r, last_caught_up_time_ms=now_ms)
                for r in self.replicas
                if r != self.node_id
            }
            log.info(
                "%s: became leader at leader epoch %d (partition epoch %d, LEO %d, HW %d, ISR %s)",
                self.name,
                self.leader_epoch,
                self.partition_epoch,
                self.log.log_end_offset,
                self.high_watermark,
                list(self.isr),
            )
        else:
            for r in self.replicas:
                if r != self.node_id and r not in self.replica_states:
                    self.replica_states[r] = ReplicaState(r, last_caught_up_time_ms=now_ms)
            for r in list(self.replica_states):
                if r not in self.replicas:
                    del self.replica_states[r]
        self.maybe_increment_high_watermark()
        return new_term

    def make_follower(self, state: PartitionState) -> bool:
        """Follow `state.leader`. Returns True on a leader or epoch change (issue 3:
        the fetcher must then reconcile with OffsetsForLeaderEpoch before fetching)."""
        assert state.leader != self.node_id and state.leader != NO_LEADER
        changed = (
            self.role is not Role.FOLLOWER
            or state.leader != self.leader_id
            or state.leader_epoch != self.leader_epoch
        )
        self._accept_state(state)
        self.role = Role.FOLLOWER
        self.replica_states = {}
        if changed:
            log.info(
                "%s: became follower of broker %d at leader epoch %d (LEO %d, HW %d)",
                self.name,
                self.leader_id,
                self.leader_epoch,
                self.log.log_end_offset,
                self.high_watermark,
            )
        return changed

    def make_offline(self, state: PartitionState) -> None:
        """The partition has no leader; this replica keeps its data and waits."""
        changed = self.role is not Role.OFFLINE or state.leader_epoch != self.leader_epoch
        self._accept_state(state)
        self.role = Role.OFFLINE
        self.replica_states = {}
        if changed:
            log.info(
                "%s: no leader (leader epoch %d); replica kept (LEO %d, HW %d)",
                self.name,
                self.leader_epoch,
                self.log.log_end_offset,
                self.high_watermark,
            )

    def stop(self) -> None:
        self.role = Role.STOPPED
        self.replica_states = {}

    # ------------------------------------------------------------------ leader work

    def append_as_leader(self, records: bytes | bytearray) -> AppendInfo:
        """Append a Produce payload stamped with our epoch. The caller has checked the
        epoch and the role. Storage validates the batches and may raise."""
        assert self.role is Role.LEADER
        info = self.log.append_as_leader(records, self.leader_epoch)
        self.appended_bytes += info.valid_bytes
        self.maybe_increment_high_watermark()
        return info

    def update_follower_fetch_state(
        self, replica_id: int, broker_epoch: int, fetch_offset: int, now_ms: int
    ) -> bool:
        """A follower fetched from `fetch_offset`: it holds everything before it.
        Returns True when the high watermark moved."""
        state = self.replica_states.get(replica_id)
        if state is None:
            return False
        state.broker_epoch = broker_epoch
        state.log_end_offset = fetch_offset
        state.last_fetch_time_ms = now_ms
        if fetch_offset >= self.log.log_end_offset:
            state.last_caught_up_time_ms = now_ms
        return self.maybe_increment_high_watermark()

    def maybe_increment_high_watermark(self) -> bool:
        """HW = min LEO over the ISR; moves only forward. True when it moved."""
        if self.role is not Role.LEADER:
            return False
        new_hw = self.log.log_end_offset
        for replica in self.isr:
            if replica == self.node_id:
                continue
            state = self.replica_states.get(replica)
            if state is None or state.log_end_offset < 0:
                return False  # an ISR member we have not heard from in this epoch
            new_hw = min(new_hw, state.log_end_offset)
        if new_hw > self.high_watermark:
            self._set_high_watermark(new_hw)
            return True
        return False

    def _set_high_watermark(self, new_hw: int) -> None:
        assert new_hw >= self.high_watermark, (
            f"{self.name}: high watermark would go back {self.high_watermark} -> {new_hw}"
        )
        assert new_hw <= self.log.log_end_offset, (
            f"{self.name}: high watermark {new_hw} past the log end {self.log.log_end_offset}"
        )
        self.high_watermark = new_hw

    def on_log_start_moved(self) -> None:
        """Retention moved the log start past the HW (a follower far behind)."""
        if self.high_watermark < self.log.log_start_offset:
            self.high_watermark = self.log.log_start_offset
