"""Subscription state: the assigned partitions (assign, or subscribe to whole topics),
seeks, positions, pause/resume and the high watermarks seen."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from client.consumer.group_membership import GroupMembership
from client.consumer.group_membership import RebalanceListener
from client.consumer.partition_state import _PartitionState
from client.errors import IllegalStateError
from client.errors import KafkaTimeoutError
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.api import NO_EPOCH


class SubscriptionState:
    """Subscription state: the assigned partitions (assign, or subscribe to whole topics),"""

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing the previous assignment or a
        subscription without a group)."""
        if self._group is not None:
            raise IllegalStateError(
                "this consumer is subscribed as a member of its group: unsubscribe() first"
            )
        self._subscription = None
        wanted = {TopicPartition(*tp) for tp in partitions}
        for tp in list(self._states):
            if tp not in wanted:
                self._forget(tp)
        for tp in wanted:
            self._states.setdefault(tp, _PartitionState())
        self._cluster.add_topics({tp.topic for tp in wanted})

    def subscribe(self, topics: Iterable[str], listener: RebalanceListener | None = None) -> None:
        """Consume `topics`. With a group_id, as a member of the group: the group's
        members share the partitions, rebalanced as members come and go, `listener`
        told of partitions revoked, assigned and lost (client/consumer/group_membership.py).
        Without one, every partition (partitions added later are picked up at the next
        metadata refresh). Replaces any assign()."""
        names = {topics} if isinstance(topics, str) else set(topics)
        if not names:
            raise ValueError("subscribe() needs at least one topic")
        self._subscription = names
        self._cluster.add_topics(names)
        if self.group_id:
            if self._group is None:
                self._group = GroupMembership(
                    self,  # type: ignore[arg-type]
                    names,
                    listener,
                    self.assignors,
                    session_timeout_ms=self.session_timeout_ms,
                    heartbeat_interval_ms=self.heartbeat_interval_ms,
                    max_poll_interval_ms=self.max_poll_interval_ms,
                    commit_on_revoke=self.commit_on_revoke,
                    group_instance_id=self.group_instance_id,
                )
            else:
                self._group.topics, self._group.listener = names, listener
                self._group.needs_rejoin = True
            return
        for tp in list(self._states):
            if tp.topic not in names:
                self._forget(tp)
        self._expand_subscription()

    def subscription(self) -> set[str]:
        """The subscribed topics (empty with manual assignment)."""
        return set(self._subscription or ())

    def unsubscribe(self) -> None:
        """Drop the subscription and every assigned partition (a group member leaves
        its group in the background)."""
        if self._group is not None:
            group, self._group = self._group, None
            task = asyncio.get_running_loop().create_task(group.close(), name="leave-group")
            self._background_tasks.add(task)
            task.add_done_callback(self._background_tasks.discard)
        self._subscription = None
        for tp in list(self._states):
            self._forget(tp)

    def _forget(self, tp: TopicPartition) -> None:
        """Stop consuming `tp`: its state, buffered records and awaited epoch go."""
        del self._states[tp]
        self._buffer.pop(tp, None)
        self._cluster.metadata.stop_awaiting(tp)

    def _expand_subscription(self) -> None:
        if self._subscription is None or self._group is not None:
            return
        meta = self._cluster.metadata
        for topic in self._subscription:
            for p in meta.partitions_for_topic(topic) or ():
                self._states.setdefault(TopicPartition(topic, p), _PartitionState())

    def _apply_group_assignment(self, partitions: set[TopicPartition]) -> None:
        """The group gave this member `partitions`: positions of the ones it keeps stay,
        new ones start from the committed offsets (validated, KIP-320)."""
        for tp in list(self._states):
            if tp not in partitions:
                self._forget(tp)
        for tp in partitions:
            self._states.setdefault(tp, _PartitionState())
        self._cluster.add_topics({tp.topic for tp in partitions})

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads."""
        return set(self._states)

    def _state(self, tp: TopicPartition) -> _PartitionState:
        state = self._states.get(tp)
        if state is None:
            raise IllegalStateError(f"partition {tp} is not assigned to this consumer")
        return state

    def seek(self, partition: TopicPartition, offset: int | OffsetAndMetadata) -> None:
        """Fetch from `offset` next. An OffsetAndMetadata with a leader_epoch (stored
        from an earlier position) arms the truncation check for that epoch."""
        state = self._state(partition)
        if isinstance(offset, OffsetAndMetadata):
            position, epoch = offset.offset, offset.leader_epoch
        else:
            position, epoch = int(offset), NO_EPOCH
        if position < 0:
            raise ValueError(f"offset must be >= 0, not {position}")
        state.set_position(position, epoch, validate=True)
        self._await_epoch_of(partition, epoch)
        self._buffer.pop(partition, None)

    def _await_epoch_of(self, tp: TopicPartition, epoch: int) -> None:
        """A position of leader epoch `epoch` was set from outside the log (a seek, a
        committed offset): no leader older than it may be asked about it, and metadata
        answers older than it are stale (client/epochs.py rule 1). Without an epoch,
        nothing is awaited."""
        if epoch == NO_EPOCH:
            self._cluster.metadata.stop_awaiting(tp)
        else:
            self._cluster.metadata.await_leader_epoch(tp, epoch)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset (resolved lazily at the next poll/position)."""
        self._seek_reset(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the high watermark (resolved lazily at the next poll/position)."""
        self._seek_reset(partitions, "latest")

    def _seek_reset(self, partitions: tuple[TopicPartition, ...], strategy: str) -> None:
        for tp in partitions or tuple(self._states):
            state = self._state(tp)
            state.position = None
            state.position_epoch = NO_EPOCH
            state.reset = strategy
            state.awaiting_validation = False
            self._buffer.pop(tp, None)
            self._cluster.metadata.stop_awaiting(tp)

    async def position(self, partition: TopicPartition) -> int:
        """Offset of the next record poll() returns for this partition."""
        return (await self.position_with_epoch(partition)).offset

    async def position_with_epoch(self, partition: TopicPartition) -> OffsetAndMetadata:
        """The position with the leader epoch of the last consumed record: store both
        and pass them back to seek() to resume safely (KIP-320). Without one yet (after
        a seek to the beginning or end), looked up with ListOffsets, retried through a
        leader change for up to default_api_timeout_ms, as Kafka's position() blocks."""
        self._check()
        state = self._state(partition)
        if state.position is None:
            error = await self._update_positions([partition], self.default_api_timeout_ms)
            if state.position is None:
                raise error or KafkaTimeoutError(f"{partition} has no position yet")
        return OffsetAndMetadata(state.position, "", state.position_epoch)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these partitions (positions are kept)."""
        for tp in partitions:
            self._state(tp).paused = True
            self._buffer.pop(tp, None)

    def resume(self, *partitions: TopicPartition) -> None:
        """Fetch these paused partitions again."""
        for tp in partitions:
            self._state(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        """The paused partitions."""
        return {tp for tp, s in self._states.items() if s.paused}

    def highwater(self, partition: TopicPartition) -> int | None:
        """High watermark from the last fetch of this partition (None: not fetched)."""
        hw = self._state(partition).high_watermark
        return hw if hw >= 0 else None
