"""One partition replica on this broker: its role, epochs, replica set, ISR, high
watermark, and the replication rules that do not need the network.

All leader-epoch checks of Produce / Fetch / ListOffsets / OffsetsForLeaderEpoch go
through `check_leader_epoch`, so the KIP-320/KIP-359 rule lives in one place.

Leader side: followers' progress (`ReplicaState`, from their Fetch requests), the
high watermark (the minimum LEO over the maximal ISR, counted only once every member
fetched in this leader epoch; it never moves back), the ISR shrink/expand decisions
(broker/isr.py) and the pending AlterPartition (`pending_isr`), which counts in the
high watermark until the controller answers or the metadata log supersedes it.

Follower side (driven by broker/fetcher.py): truncation, appends of the leader's
batches, and the leader's high watermark applied as min(leader HW, our LEO), only
after truncation and never backwards. The single exception: a truncation below the
high watermark (only possible after an unclean election or with an unsafe test
switch) lowers it to the new log end, with a warning.

Invariants asserted here: the high watermark never moves back (except that logged
truncation) and never passes the LEO; leader and partition epochs never decrease.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.isr import PendingIsr
from broker.isr import ReplicaState
from broker.isr import high_watermark_candidate
from broker.partition_isr import PartitionIsr
from broker.partition_role import Role
from broker.storage.errors import StorageError
from protocol.api import NO_EPOCH
from protocol.errors import CorruptRecordError
from protocol.errors import ErrorCode
from protocol.invariants import invariant
from protocol.messages import LeaderIdAndEpoch
from protocol.metadata_records import LEADER_RECOVERED
from protocol.metadata_records import NO_LEADER
from protocol.record_batch import parse_header
from runtime import hop_trace

if TYPE_CHECKING:
    from broker.metadata_image import PartitionState
    from broker.storage.log import AppendInfo
    from broker.storage.log import Log

log = logging.getLogger(__name__)

MIN_INSYNC_REPLICAS = "min.insync.replicas"

__all__ = ["MIN_INSYNC_REPLICAS", "Partition", "PendingIsr", "ReplicaState", "Role"]

_warned_ignore_epoch = False


class Partition(PartitionIsr):
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
        ignore_leader_epoch: bool = False,
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
        # Test-only switch (unsafe_ignore_leader_epoch): skip the KIP-320 comparison.
        self.ignore_leader_epoch = ignore_leader_epoch
        # Leader side: followers' progress keyed by broker id, the offset where this
        # leader epoch started, and the ISR change in flight.
        self.replica_states: dict[int, ReplicaState] = {}
        self.leader_epoch_start_offset = -1
        self.pending_isr: PendingIsr | None = None
        # Counts the times this replica took leadership from another role: a waiting
        # acks=all produce is answered only by the leadership that appended it.
        self.leader_generation = 0
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

    @property
    def high_watermark_behind_epoch_start(self) -> bool:
        """A leader whose high watermark has not reached the offset where its epoch
        started (KIP-207; Kafka's Partition.fetchOffsetForTimestamp): it took over with
        records its predecessor may have acknowledged, and learns they are committed
        only once every ISR member fetched in its epoch. Until then it cannot say where
        the committed log ends: consumers' ListOffsets answer OFFSET_NOT_AVAILABLE."""
        return self.is_leader and self.leader_epoch_start_offset > self.high_watermark

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus the members a pending change would add: what the
        high watermark and acks=all count (a pending shrink still counts the member
        it removes)."""
        pending = self.pending_isr
        return self.isr if pending is None else pending.maximal_isr

    # ------------------------------------------------------------------ epoch checks

    def check_leader_epoch(
        self, current_leader_epoch: int, *, require_leader: bool = True
    ) -> ErrorCode:
        """KIP-320 / KIP-359: -1 skips the comparison; an older epoch than ours is
        FENCED_LEADER_EPOCH (the client's metadata is stale), a newer one
        UNKNOWN_LEADER_EPOCH (ours is). Then, when `require_leader`, a replica that is
        not the leader answers NOT_LEADER_OR_FOLLOWER.

        With the test-only `ignore_leader_epoch` the comparison is skipped (as before
        KIP-320); the role check stays, as pre-KIP-320 brokers had it."""
        if self.role is Role.STOPPED:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch != NO_EPOCH:
            if self.ignore_leader_epoch:
                _warn_ignore_epoch_once(self.name)
            elif current_leader_epoch < self.leader_epoch:
                return ErrorCode.FENCED_LEADER_EPOCH
            elif current_leader_epoch > self.leader_epoch:
                return ErrorCode.UNKNOWN_LEADER_EPOCH
        if require_leader and self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    # ------------------------------------------------------------------ role changes

    def _accept_state(self, state: PartitionState) -> None:
        # The controller never lowers an epoch; if it did, fencing would be unsound.
        invariant(
            state.leader_epoch >= self.leader_epoch,
            lambda: (
                f"{self.name}: leader epoch went back {self.leader_epoch} -> {state.leader_epoch}"
            ),
        )
        invariant(
            state.partition_epoch >= self.partition_epoch,
            lambda: (
                f"{self.name}: partition epoch went back "
                f"{self.partition_epoch} -> {state.partition_epoch}"
            ),
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
        invariant(state.leader == self.node_id, "state.leader == self.node_id")
        new_term = self.role is not Role.LEADER or state.leader_epoch != self.leader_epoch
        if not new_term and state.partition_epoch < self.partition_epoch:
            # An AlterPartition answer already gave us a newer state of this term.
            return False
        self._accept_state(state)
        if self.role is not Role.LEADER:
            self.leader_generation += 1
        self.role = Role.LEADER
        pending = self.pending_isr
        if new_term or (pending is not None and state.partition_epoch > pending.partition_epoch):
            # The metadata log has the partition's newer state: the proposal is moot
            # (it was committed, and this is it, or it will be refused).
            self.pending_isr = None
        if new_term:
            # KIP-101: the new epoch starts at our log end offset; every batch we
            # append from now on is stamped with it.
            try:
                self.log.assign_epoch_at_end(self.leader_epoch)
            except StorageError as exc:
                # The cache holds the epoch; its checkpoint is written again before the
                # first append (which fails with KAFKA_STORAGE_ERROR until it can be).
                # The metadata handler goes on with the other partitions.
                log.error("%s: leader epoch checkpoint not written: %s", self.name, exc)
            self.leader_epoch_start_offset = self.log.log_end_offset
            # Every follower's LEO is unknown until it fetches in this epoch, so the
            # high watermark waits for all of them (KIP-320's fencing argument).
            self.replica_states = {
                r: ReplicaState(r, last_caught_up_time_ms=now_ms if r in self.isr else 0)
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
        """Follow `state.leader`. Returns True on a leader or epoch change (the fetcher
        must then reconcile with OffsetsForLeaderEpoch before fetching)."""
        invariant(
            state.leader != self.node_id and state.leader != NO_LEADER,
            "state.leader != self.node_id and state.leader != NO_LEADER",
        )
        changed = (
            self.role is not Role.FOLLOWER
            or state.leader != self.leader_id
            or state.leader_epoch != self.leader_epoch
        )
        self._step_down(
            state,
            Role.FOLLOWER,
            f"became follower of broker {state.leader} at leader epoch {state.leader_epoch}"
            if changed
            else None,
        )
        return changed

    def make_offline(self, state: PartitionState) -> None:
        """The partition has no leader; this replica keeps its data and waits."""
        changed = self.role is not Role.OFFLINE or state.leader_epoch != self.leader_epoch
        self._step_down(
            state,
            Role.OFFLINE,
            f"no leader (leader epoch {state.leader_epoch}); replica kept" if changed else None,
        )

    def _step_down(self, state: PartitionState, role: Role, change: str | None) -> None:
        """Take `state` in a role other than leader; log `change` (a role or epoch
        change, None when there is none) with the log end offset and high watermark."""
        self._accept_state(state)
        self.role = role
        self._drop_leader_state()
        if change is not None:
            log.info(
                "%s: %s (LEO %d, HW %d)",
                self.name,
                change,
                self.log.log_end_offset,
                self.high_watermark,
            )

    def stop(self) -> None:
        self.role = Role.STOPPED
        self._drop_leader_state()

    def _drop_leader_state(self) -> None:
        self.replica_states = {}
        self.pending_isr = None
        self.leader_epoch_start_offset = -1

    # ------------------------------------------------------------------ leader work

    def append_as_leader(
        self, records: bytes | bytearray | memoryview, *, in_place: bool = False
    ) -> AppendInfo:
        """Append a Produce payload stamped with our epoch. The caller has checked the
        epoch and the role. Storage validates the batches and the idempotent-producer
        sequences (ProducerStateError) and may raise; a duplicate is answered with the
        original offsets (`info.duplicate`). `in_place`: Log.append_as_leader."""
        invariant(self.role is Role.LEADER, "self.role is Role.LEADER")
        before = self.log.log_end_offset
        info = self.log.append_as_leader(records, self.leader_epoch, in_place=in_place)
        if info.duplicate:
            return info  # an idempotent retry: nothing written, the original offsets
        invariant(
            info.first_offset == before and info.last_offset >= before,
            lambda: f"{self.name}: appended offsets must strictly increase ({before} -> {info})",
        )
        self.appended_bytes += info.valid_bytes
        self.maybe_increment_high_watermark()
        return info

    def update_follower_fetch_state(
        self, replica_id: int, broker_epoch: int, fetch_offset: int, now_ms: int
    ) -> bool:
        """A follower fetched from `fetch_offset` (it holds everything before it) in
        our current epoch (the fetch passed the epoch check). Returns True when the
        high watermark moved."""
        state = self.replica_states.get(replica_id)
        if state is None or self.role is not Role.LEADER:
            return False
        state.update(
            broker_epoch=broker_epoch,
            fetch_offset=fetch_offset,
            leader_epoch=self.leader_epoch,
            leader_leo=self.log.log_end_offset,
            now_ms=now_ms,
        )
        return self.maybe_increment_high_watermark()

    def follower_still_caught_up(self, replica_id: int, now_ms: int) -> None:
        """A fetch session of `replica_id` that began at `now_ms` had nothing new for
        it: it was at our LEO then, in this epoch."""
        state = self.replica_states.get(replica_id)
        if (
            state is not None
            and self.role is Role.LEADER
            and state.fetch_epoch == self.leader_epoch
        ):
            state.still_caught_up(now_ms)

    def maybe_increment_high_watermark(self) -> bool:
        """HW = min LEO over the maximal ISR once every member fetched in this epoch;
        moves only forward. True when it moved."""
        if self.role is not Role.LEADER:
            return False
        new_hw = high_watermark_candidate(
            self.log.log_end_offset,
            self.maximal_isr,
            self.node_id,
            self.replica_states,
            self.leader_epoch,
        )
        if new_hw is not None and new_hw > self.high_watermark:
            self._set_high_watermark(new_hw)
            return True
        return False

    def _set_high_watermark(self, new_hw: int) -> None:
        invariant(
            new_hw >= self.high_watermark,
            lambda: f"{self.name}: high watermark would go back {self.high_watermark} -> {new_hw}",
        )
        invariant(
            new_hw <= self.log.log_end_offset,
            lambda: (
                f"{self.name}: high watermark {new_hw} past the log end {self.log.log_end_offset}"
            ),
        )
        tracer = hop_trace.TRACER
        if tracer is not None and new_hw > self.high_watermark:
            hop = "leader.hw" if self.role is Role.LEADER else "follower.hw"
            tracer.stamp(hop, self.topic, self.index, self.high_watermark, new_hw - 1)
        self.high_watermark = new_hw

    def on_log_start_moved(self) -> None:
        """Retention moved the log start past the HW (a follower far behind)."""
        if self.high_watermark < self.log.log_start_offset:
            self.high_watermark = self.log.log_start_offset

    # ------------------------------------------------------------------ ISR decisions

    # ------------------------------------------------------------------ follower work

    def append_as_follower(self, records: bytes) -> AppendInfo:
        """Append the leader's batches as they are (fetcher, after truncation)."""
        invariant(self.role is Role.FOLLOWER, "self.role is Role.FOLLOWER")
        self._restart_empty_log_at_the_leaders_batch(records)
        before = self.log.log_end_offset
        # The fetch was answered by the leader at our leader epoch (KIP-320 fences any
        # other): none of its batches can be of a later one.
        max_epoch = None if self.ignore_leader_epoch else self.leader_epoch
        info = self.log.append_as_follower(records, max_epoch=max_epoch)
        if info.batch_count:
            invariant(
                info.first_offset >= before and info.last_offset >= info.first_offset,
                lambda: (
                    f"{self.name}: appended offsets must strictly increase ({before} -> {info})"
                ),
            )
        self.appended_bytes += info.valid_bytes
        return info

    def _restart_empty_log_at_the_leaders_batch(self, records: bytes) -> None:
        """Kafka's UnexpectedAppendOffsetException case: our log is empty and restarted
        at the leader's log start, which lies inside the leader's first batch (a log
        start moved into a batch), so that whole batch comes, starting below our log
        end. Restart the empty log at the batch's base offset (nothing is lost: it is
        empty) rather than refusing the batch at every fetch."""
        data = self.log
        end = data.log_end_offset
        if end != data.log_start_offset or not records:
            return
        try:
            first = parse_header(records)
        except CorruptRecordError:
            return  # the append refuses it, with the reason
        if first.base_offset < end <= first.last_offset:
            self.truncate_fully_and_start_at(
                first.base_offset,
                reason=f"the leader's first batch {first.base_offset}-{first.last_offset} "
                f"holds our empty log's start {end}",
            )

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """Apply the leader's high watermark: min(leader HW, our LEO), never backwards.
        Only after truncation (the fetcher's FETCHING phase). True when it moved."""
        invariant(self.role is Role.FOLLOWER, "self.role is Role.FOLLOWER")
        new_hw = min(leader_high_watermark, self.log.log_end_offset)
        if new_hw <= self.high_watermark:
            return False
        self._set_high_watermark(new_hw)
        return True

    def truncate_to(self, offset: int, *, reason: str) -> None:
        """Follower truncation (by epoch, or the leader's LEO after an out-of-range)."""
        invariant(self.role is not Role.LEADER, lambda: f"{self.name}: a leader never truncates")
        before = self.log.log_end_offset
        self.log.truncate_to(offset)
        after = self.log.log_end_offset
        if after != before:
            log.info(
                "%s: truncated log %d -> %d (%s); latest epoch now %d",
                self.name,
                before,
                after,
                reason,
                self.log.latest_epoch,
            )
        self._hw_after_truncation()

    def truncate_fully_and_start_at(self, offset: int, *, reason: str) -> None:
        invariant(self.role is not Role.LEADER, lambda: f"{self.name}: a leader never truncates")
        before = (self.log.log_start_offset, self.log.log_end_offset)
        self.log.truncate_fully_and_start_at(offset)
        log.info(
            "%s: log [%d, %d) dropped, restarting empty at %d (%s)",
            self.name,
            before[0],
            before[1],
            offset,
            reason,
        )
        self._hw_after_truncation()
        if self.high_watermark < self.log.log_start_offset:
            self.high_watermark = self.log.log_start_offset

    def _hw_after_truncation(self) -> None:
        leo = self.log.log_end_offset
        if self.high_watermark > leo:
            # Data below the high watermark was committed: only an unclean election or
            # an unsafe test switch gets here.
            log.warning(
                "%s: truncated below the high watermark %d to %d: committed records were "
                "lost (unclean leader election?)",
                self.name,
                self.high_watermark,
                leo,
            )
            self.high_watermark = max(self.log.log_start_offset, leo)


def _warn_ignore_epoch_once(name: str) -> None:
    global _warned_ignore_epoch
    if not _warned_ignore_epoch:
        _warned_ignore_epoch = True
        log.warning(
            "UNSAFE TEST SWITCH: current_leader_epoch is NOT checked (first seen on %s); "
            "stale leaders and zombie replicas are not fenced",
            name,
        )
