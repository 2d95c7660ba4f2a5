"""Truncation detection (KIP-320): a position is validated with OffsetsForLeaderEpoch
after a leader change, a diverging epoch in a Fetch answer is checked the same way,
and a truncated position raises LogTruncationError or resets per the policy."""

from __future__ import annotations

import time

from client.consumer.partition_state import _EPOCH_WAIT_MAX_BACKOFF_S
from client.consumer.partition_state import _PartitionState
from client.consumer.partition_state import log
from client.epochs import EpochEndOffset
from client.epochs import ask_leader
from client.errors import KafkaTimeoutError
from client.errors import LeaderEpochBehindError
from client.errors import LogTruncationError
from client.errors import MinibrokerError
from client.errors import OffsetOutOfRangeError
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.api import NO_EPOCH


class TruncationValidation:
    """Truncation detection (KIP-320): a position is validated with OffsetsForLeaderEpoch"""

    def _note_leader_epoch(self, tp: TopicPartition, state: _PartitionState, epoch: int) -> None:
        """The partition's leader epoch differs from the one we fetched with last (a
        leader change, or the first fetch). After a leader change the new leader may
        hold a different lineage (unclean election): validate the position against it
        with OffsetsForLeaderEpoch before fetching (KIP-320). Without the epoch of the
        last consumed record there is nothing to validate against (Kafka skips too)."""
        if state.leader_epoch_seen != NO_EPOCH:
            log.info(
                "%s: leader epoch changed %d -> %d at position %s (epoch %d)%s",
                tp,
                state.leader_epoch_seen,
                epoch,
                state.position,
                state.position_epoch,
                "; validating it" if state.position_epoch != NO_EPOCH else "",
            )
            if state.position_epoch != NO_EPOCH:
                state.awaiting_validation = True
        state.leader_epoch_seen = epoch

    def _notice_leader_changes(self) -> None:
        """Kafka's maybeValidatePositionForCurrentLeader, before anything is handed
        out: a partition whose leader epoch in the metadata changed (whatever refreshed
        it: a fetch error, end_offsets(), a background refresh) awaits validation, and
        its buffered records, fetched from the old leader, are dropped (Kafka's fetch
        collector drops completed fetches of a partition that is not FETCHING): after
        an unclean election they belong to a lineage that may be gone."""
        meta = self._cluster.metadata
        for tp, state in self._states.items():
            if state.position is None:
                continue
            partition = meta.partition(tp)
            if partition is None or partition.leader_epoch == state.leader_epoch_seen:
                continue
            self._note_leader_epoch(tp, state, partition.leader_epoch)
            if state.awaiting_validation and self._buffer.pop(tp, None) is not None:
                log.info(
                    "%s: dropped the records buffered from the previous leader; position %d "
                    "(leader epoch %d) is validated first",
                    tp,
                    state.position,
                    state.position_epoch,
                )

    def _wait_for_leader_epoch(
        self, tp: TopicPartition, state: _PartitionState, why: LeaderEpochBehindError
    ) -> None:
        """The position's epoch is newer than the leader the metadata shows, or that
        leader answered "unknown" for it (client/epochs.py rules 1 and 2): refresh
        metadata and try again later, backing off exponentially up to 1 s; poll()
        returns nothing for this partition meanwhile, the others go on. After
        default_api_timeout_ms of waiting poll() raises KafkaTimeoutError (the position
        is kept and the wait starts over)."""
        now = time.monotonic()
        if not state.epoch_wait_since:
            state.epoch_wait_since = now
            log.info("%s: position %s waits for its leader epoch: %s", tp, state.position, why)
        elif now - state.epoch_wait_since >= self.default_api_timeout_ms / 1000:
            state.epoch_wait_since = now
            error = KafkaTimeoutError(
                f"{tp}: the position {state.position} (leader epoch {state.position_epoch}) "
                f"could not be validated within default_api_timeout_ms="
                f"{self.default_api_timeout_ms}: no broker showed a leader at that epoch "
                f"({why}). The consumer keeps the position and goes on waiting; if the "
                "topic was deleted and created again, the epoch belongs to the old topic: "
                "seek() to an offset without an epoch to go on"
            )
            error.__cause__ = why
            self._pending_error = error
        backoff = self.retry_backoff_ms / 1000 * 2 ** min(state.epoch_waits, 10)
        cap = max(_EPOCH_WAIT_MAX_BACKOFF_S, self.retry_backoff_ms / 1000)
        state.epoch_waits += 1
        state.backoff_until = now + min(backoff, cap)
        self._cluster.request_refresh()

    async def _validate(self, node: int, parts: list[tuple[TopicPartition, int, int, int]]) -> None:
        """OffsetsForLeaderEpoch(current_leader_epoch, leader_epoch = epoch of the last
        consumed record) for each partition awaiting validation on leader `node`."""
        asked = {tp: (epoch, last_epoch) for tp, _, epoch, last_epoch in parts}
        sent = {tp: (offset, last_epoch) for tp, offset, _, last_epoch in parts}
        with self._background("validation with", node, self._validating):
            try:
                outcomes = await ask_leader(
                    self._cluster, node, asked, timeout_ms=self.request_timeout_ms
                )
            except MinibrokerError as exc:  # ask_leader reports most errors per partition
                outcomes = dict.fromkeys(asked, exc)
            for tp, outcome in outcomes.items():
                self._handle_validation(tp, sent[tp], outcome)

    def _handle_validation(
        self, tp: TopicPartition, sent: tuple[int, int], outcome: EpochEndOffset | MinibrokerError
    ) -> None:
        state = self._states.get(tp)
        if state is None or (state.position, state.position_epoch) != sent:
            return  # unassigned or seeked while the request was out
        if not state.awaiting_validation:
            return
        if isinstance(outcome, LeaderEpochBehindError):
            self._wait_for_leader_epoch(tp, state, outcome)
            return
        if isinstance(outcome, MinibrokerError):
            if not outcome.retriable:
                self._pending_error = outcome
                return
            log.info("%s: cannot validate the position yet: %s", tp, outcome)
            state.backoff_until = time.monotonic() + self.retry_backoff_ms / 1000
            if outcome.invalid_metadata:
                self._cluster.request_refresh()
            return
        position, epoch = sent
        state.awaiting_validation = False
        state.epoch_wait_since = 0.0
        state.epoch_waits = 0
        diverged = outcome.diverges_at(position, epoch, state.position_epoch_start)
        if diverged is not None:
            self._truncated(tp, state, outcome.leader_epoch, diverged)
            return
        log.debug(
            "%s: position %d (epoch %d) is valid: epoch %d ends at %d",
            tp,
            position,
            epoch,
            outcome.leader_epoch,
            outcome.end_offset,
        )

    def _handle_diverging(
        self, tp: TopicPartition, state: _PartitionState, epoch: int, end_offset: int
    ) -> None:
        """The leader's log diverges from ours after `end_offset` for `epoch` (a Fetch
        answer's diverging epoch): the same rules as a validation's answer (rule 3,
        and rule 4: a leader that never had our epoch lacks what we read in it)."""
        position = state.position
        assert position is not None
        ours = state.position_epoch
        diverged = EpochEndOffset(epoch, end_offset).diverges_at(
            position, ours, state.position_epoch_start
        )
        if diverged is not None:
            self._truncated(tp, state, epoch, diverged)
        elif ours == NO_EPOCH or epoch < ours:
            # Our lineage is intact up to the position, which the leader knows under an
            # older epoch (ours was unknown to it): fetch on under that one.
            state.position_epoch = epoch
            state.position_epoch_start = -1
        else:
            # A leader answers an epoch at most the one asked: a newer one is no news
            # to act on (adopting it would wait for metadata of an epoch never seen).
            log.warning(
                "%s: the leader answered diverging epoch %d (ending at %d) for a position "
                "of epoch %d; ignored",
                tp,
                epoch,
                end_offset,
                ours,
            )

    def _truncated(
        self, tp: TopicPartition, state: _PartitionState, epoch: int, end_offset: int
    ) -> None:
        """The current leader's lineage ends at `end_offset` for our `epoch`, below our
        position: records we returned are gone (unclean election). Policy 'none' raises
        LogTruncationError; 'earliest'/'latest' resume at the divergence point (Kafka)."""
        position = state.position
        assert position is not None
        if self.auto_offset_reset == "none":
            self._pending_error = LogTruncationError(
                f"log truncation detected on {tp}: the consumer's position {position} "
                f"(leader epoch {state.position_epoch}) is past the end of the current log "
                f"lineage, which diverges at offset {end_offset} (leader epoch {epoch}); "
                f"records from {end_offset} to {position - 1} that were consumed are gone. "
                f"seek({tp.topic!r}, {tp.partition}) to {end_offset} to go on",
                {tp: OffsetAndMetadata(end_offset, "", epoch)},
                {tp: position},
            )
            return
        log.warning(
            "log truncation detected on %s: position %d (leader epoch %d) is past the "
            "divergence offset %d (leader epoch %d); resuming from %d",
            tp,
            position,
            state.position_epoch,
            end_offset,
            epoch,
            end_offset,
        )
        self._buffer.pop(tp, None)
        state.set_position(end_offset, epoch)
        if self.on_truncation is not None:
            self.on_truncation(tp, position, OffsetAndMetadata(end_offset, "", epoch))

    def _out_of_range(
        self, tp: TopicPartition, state: _PartitionState, offset: int, why: str
    ) -> None:
        if self.auto_offset_reset == "none":
            self._pending_error = OffsetOutOfRangeError(
                f"offset {offset} is out of range ({why}) and auto_offset_reset='none'",
                offsets={tp: offset},
                topic=tp.topic,
                partition=tp.partition,
            )
            return
        log.warning(
            "%s: offset %d is out of range (%s); resetting to %s",
            tp,
            offset,
            why,
            self.auto_offset_reset,
        )
        state.position = None
        state.position_epoch = NO_EPOCH
        state.awaiting_validation = False
        state.reset = self.auto_offset_reset
        self._cluster.metadata.stop_awaiting(tp)
