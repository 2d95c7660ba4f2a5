"""Committed offsets at the group coordinator: commit and fetch them with their leader
epochs (KIP-320), and start positions from them."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Mapping

from client.consumer.partition_state import _COORDINATOR_MAX_BACKOFF_S
from client.consumer.partition_state import _COORDINATOR_MOVED
from client.consumer.partition_state import _answer_errors
from client.consumer.partition_state import log
from client.errors import BrokerResponseError
from client.errors import IllegalStateError
from client.errors import KafkaTimeoutError
from client.errors import MinibrokerError
from client.errors import error_for
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import Message
from protocol.messages import OffsetCommitPartition
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetCommitTopic
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from protocol.messages import OffsetFetchTopic


def commit_topics(
    offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
) -> list[OffsetCommitTopic]:
    """OffsetCommit's topics for `offsets` (a bare offset: no leader epoch)."""
    by_topic: dict[str, list[OffsetCommitPartition]] = defaultdict(list)
    for tp, om in offsets.items():
        om = om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om))
        by_topic[tp.topic].append(
            OffsetCommitPartition(
                partition_index=tp.partition,
                committed_offset=om.offset,
                committed_leader_epoch=om.leader_epoch,
                committed_metadata=om.metadata,
            )
        )
    return [OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()]


class CommittedOffsets:
    """Committed offsets at the group coordinator: commit and fetch them with their leader"""

    def _need_group(self) -> str:
        if not self.group_id:
            raise IllegalStateError("commit()/committed() need a group_id")
        return self.group_id

    async def _coordinator_call(
        self, request: Message, *, what: str, timeout_ms: int | None
    ) -> Message:
        """Send to the group coordinator (FindCoordinator first) and check the answer,
        whole-response and per-partition error codes alike. Retriable errors (the
        coordinator moved, is loading, unreachable, timed out) are retried with an
        exponential backoff and a new FindCoordinator when the coordinator may have
        moved, as Kafka's commitSync does, until `timeout_ms` (default
        default_api_timeout_ms) runs out: then KafkaTimeoutError, carrying the last
        error. A non-retriable error is raised at once."""
        group = self._need_group()
        budget_ms = self.default_api_timeout_ms if timeout_ms is None else timeout_ms
        if budget_ms <= 0:
            raise ValueError(f"timeout_ms must be > 0, not {budget_ms}")
        deadline = time.monotonic() + budget_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        attempts = 0
        while True:
            attempts += 1
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                node = await self._find_coordinator(group, remaining_ms)
                response = await self._cluster.send(
                    node,
                    request,
                    timeout_ms=min(self.request_timeout_ms, remaining_ms),
                    coordinator=True,
                )
                assert response is not None
                errors = _answer_errors(response, group)
                for error in errors:
                    if not error.retriable:
                        raise error
                if not errors:
                    return response
                last: MinibrokerError = errors[0]
                if any(e.error_code in _COORDINATOR_MOVED for e in errors):
                    self._coordinator = None
            except MinibrokerError as exc:
                if not exc.retriable:
                    raise
                last = exc
                self._coordinator = None  # unreachable or timed out: look it up again
            if time.monotonic() + backoff >= deadline:
                raise KafkaTimeoutError(
                    f"{what} for group {group!r} did not succeed within {budget_ms} ms "
                    f"({attempts} attempts); last error: {last}. Is the cluster up? "
                    "Pass a larger timeout_ms to wait longer"
                ) from last
            log.info(
                "group %s: %s failed: %s; retrying in %.0f ms", group, what, last, backoff * 1000
            )
            await asyncio.sleep(backoff * random.uniform(0.8, 1.0))
            backoff = min(backoff * 2, _COORDINATOR_MAX_BACKOFF_S)

    async def _find_coordinator(self, group: str, timeout_ms: int) -> int:
        """The coordinator's node id (cached until it fails us)."""
        if self._coordinator is None:
            found = await self._cluster.send_any(
                FindCoordinatorRequest(key=group),
                timeout_ms=min(self.request_timeout_ms, timeout_ms),
            )
            assert isinstance(found, FindCoordinatorResponse)
            if found.error_code != ErrorCode.NONE:
                raise error_for(found.error_code, found.error_message)
            self._coordinator = found.node_id
        return self._coordinator

    async def commit(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Store `offsets` (default: the current positions of every assigned partition,
        with the leader epoch of the last consumed record) for group_id. Retriable
        errors (coordinator moved, loading or unreachable) are retried until
        `timeout_ms` (default default_api_timeout_ms), then KafkaTimeoutError;
        others (e.g. INVALID_COMMIT_OFFSET_SIZE) raise at once."""
        self._check()
        if offsets is None:
            offsets = {
                tp: OffsetAndMetadata(s.position, "", s.position_epoch)
                for tp, s in self._states.items()
                if s.position is not None
            }
        if not offsets:
            return
        # A member commits in its generation: the coordinator refuses a zombie's.
        fields = self._group.commit_fields() if self._group else (-1, "", None)
        generation, member_id, instance_id = fields
        try:
            response = await self._coordinator_call(
                OffsetCommitRequest(
                    group_id=self._need_group(),
                    generation_id=generation,
                    member_id=member_id,
                    group_instance_id=instance_id,
                    topics=commit_topics(offsets),
                ),
                what="OffsetCommit",
                timeout_ms=timeout_ms,
            )
        except BrokerResponseError as exc:
            if self._group is not None:
                self._group.commit_failed(exc.error_code)
            raise
        assert isinstance(response, OffsetCommitResponse)

    async def committed(
        self, partition: TopicPartition, *, timeout_ms: int | None = None
    ) -> OffsetAndMetadata | None:
        """The offset committed for group_id (with its leader epoch), or None.
        Retried like commit() within `timeout_ms` (default default_api_timeout_ms)."""
        self._check()
        return (await self._fetch_committed([partition], timeout_ms=timeout_ms)).get(partition)

    async def _fetch_committed(
        self, partitions: Iterable[TopicPartition], *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append(tp.partition)
        response = await self._coordinator_call(
            OffsetFetchRequest(
                group_id=self._need_group(),
                topics=[
                    OffsetFetchTopic(name=t, partition_indexes=ps) for t, ps in by_topic.items()
                ],
            ),
            what="OffsetFetch",
            timeout_ms=timeout_ms,
        )
        assert isinstance(response, OffsetFetchResponse)
        out: dict[TopicPartition, OffsetAndMetadata] = {}
        for topic in response.topics:
            for p in topic.partitions:
                if p.committed_offset >= 0:
                    out[TopicPartition(topic.name, p.partition_index)] = OffsetAndMetadata(
                        p.committed_offset, p.metadata or "", p.committed_leader_epoch
                    )
        return out

    async def _positions_from_committed(self, partitions: list[TopicPartition]) -> None:
        """Partitions without a position and no explicit reset start from the group's
        committed offset, validated like a seek with its epoch (KIP-320)."""
        if not self.group_id:
            return
        todo = [
            tp
            for tp in partitions
            if (s := self._states.get(tp)) is not None and s.position is None and s.reset is None
        ]
        if not todo:
            return
        for tp, om in (await self._fetch_committed(todo)).items():
            state = self._states.get(tp)
            if state is not None and state.position is None:
                log.info(
                    "%s: starting from the committed offset %d (leader epoch %d)",
                    tp,
                    om.offset,
                    om.leader_epoch,
                )
                state.set_position(om.offset, om.leader_epoch, validate=True)
                self._await_epoch_of(tp, om.leader_epoch)
