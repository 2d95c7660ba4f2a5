"""A subscribed consumer's membership of its group (the classic rebalance protocol, as
Kafka's ConsumerCoordinator and aiokafka's run it): join with the subscription in
Kafka's consumer protocol format, the leader assigns with the protocol the coordinator
chose, everyone syncs, a background task heartbeats, and a rebalance revokes and
reassigns partitions with the listener's callbacks around it.

- Eager rebalancing (range, roundrobin): before rejoining, every owned partition is
  revoked (its consumed positions committed first with `commit_on_revoke`, then
  `on_partitions_revoked`); a member that lost its membership (session expired,
  fenced) calls `on_partitions_lost` instead and commits nothing, its generation being
  gone. Cooperative rebalancing (KIP-429, when every assignor offered is cooperative:
  cooperative-sticky): a member rejoins owning what it owns (told in its subscription
  with its generation), revokes only what the new assignment no longer gives it, then
  rejoins at once so that the next rebalance hands those partitions over;
  `on_partitions_assigned` gets the partitions added.
- Partitions assigned start from the group's committed offsets and their leader
  epochs, validated as after a seek (KIP-320), so truncation detection carries over.
- `max_poll_interval_ms`: a member whose application stops calling poll() for longer
  leaves the group from the heartbeat task (its partitions go to the others), as
  Kafka's consumer does; its next poll() rejoins.
- Every wait is bounded: a JoinGroup by the rebalance timeout, retries by
  default_api_timeout_ms, the heartbeat by the session timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

from client.consumer.assignors import Assignor
from client.errors import KafkaTimeoutError
from client.errors import MinibrokerError
from client.errors import error_for
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.kafka.consumer_protocol import Subscription
from protocol.kafka.consumer_protocol import TopicPartitions
from protocol.kafka.consumer_protocol import decode_assignment
from protocol.kafka.consumer_protocol import decode_subscription
from protocol.kafka.consumer_protocol import encode_assignment
from protocol.kafka.consumer_protocol import encode_subscription
from protocol.messages import HeartbeatRequest
from protocol.messages import HeartbeatResponse
from protocol.messages import JoinGroupRequest
from protocol.messages import JoinGroupRequestProtocol
from protocol.messages import JoinGroupResponse
from protocol.messages import JoinGroupResponseMember
from protocol.messages import LeaveGroupRequest
from protocol.messages import SyncGroupRequest
from protocol.messages import SyncGroupRequestAssignment
from protocol.messages import SyncGroupResponse

if TYPE_CHECKING:
    from client.consumer.async_consumer import AsyncConsumer

log = logging.getLogger("client.consumer.group")

# Errors after which the member looks the coordinator up again.
_COORDINATOR_GONE = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
}
# Errors that end the membership: the member joins again with a new generation.
_MEMBERSHIP_GONE = {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION}


class _Rejoin(Exception):
    """An answer whose remedy is to join again at once (the generation moved on, or
    the member is unknown: then as a new member)."""


# A JoinGroup answer comes when the generation forms: allow the rebalance timeout.
_JOIN_SLACK_MS = 5_000
_MAX_BACKOFF_S = 1.0


class RebalanceListener(Protocol):
    """Called around rebalances, from poll(); methods may be coroutines. Kafka's
    ConsumerRebalanceListener: `on_partitions_lost` defaults to revoked."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> Any: ...

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> Any: ...


class GroupMembership:
    def __init__(
        self,
        consumer: AsyncConsumer,
        topics: set[str],
        listener: RebalanceListener | None,
        assignors: list[Assignor],
        *,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        max_poll_interval_ms: int,
        commit_on_revoke: bool,
        group_instance_id: str | None = None,
    ) -> None:
        if not assignors:
            raise ValueError("partition_assignment_strategy needs at least one assignor")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be below "
                f"session_timeout_ms ({session_timeout_ms})"
            )
        self.consumer = consumer
        self.group_id = consumer._need_group()
        self.topics = topics
        self.listener = listener
        self.assignors = assignors
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.commit_on_revoke = commit_on_revoke
        self.group_instance_id = group_instance_id
        # KIP-429: cooperative when every assignor offered is (else eager, as Kafka's).
        self.cooperative = all(a.cooperative for a in assignors)
        self.member_id = ""
        self.generation = -1
        self.leader = False
        self.owned: set[TopicPartition] = set()
        self.needs_rejoin = True
        self.lost = False  # the membership ended under us: revoke as lost, commit nothing
        self._last_poll = time.monotonic()
        self._join_task: asyncio.Task[set[TopicPartition]] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ from poll()

    async def poll(self, timeout_s: float) -> None:
        """Called by every poll(): (re)join when needed, waiting for the join at most
        `timeout_s` (a join takes as long as the group's rebalance: it goes on in the
        background and a later poll() takes its result, as Kafka's poll(timeout) is
        bounded); notes that the application is polling (max_poll_interval_ms). The
        listener's callbacks run here, inside poll()."""
        self._last_poll = time.monotonic()
        if self._heartbeat_task is not None and self._heartbeat_task.done():
            error = self._heartbeat_task.exception()
            self._heartbeat_task = None
            if error is not None:
                raise error
        if self._join_task is None:
            if not self.needs_rejoin:
                return
            if self.lost or not self.cooperative:
                # Eager: everything goes before joining (a lost membership: as lost).
                await self._revoke(self.owned)
            self._join_task = asyncio.get_running_loop().create_task(
                self._join_and_sync(), name=f"join-{self.group_id}"
            )
        done, _ = await asyncio.wait({self._join_task}, timeout=max(0.0, timeout_s))
        if not done:
            return  # still joining: this poll() returns without records
        task, self._join_task = self._join_task, None
        assigned = task.result()  # the join's error, if it failed
        self.needs_rejoin = self.lost = False
        # Cooperative: what this member owned and was not given again goes now (a
        # follow-up rebalance gives it to its new owner); it keeps the rest.
        revoked = self.owned - assigned
        added = assigned - self.owned
        if revoked:
            await self._revoke(revoked)
            self.needs_rejoin = True
        self.owned = assigned
        self.consumer._apply_group_assignment(assigned)
        log.info(
            "group %s: generation %d, member %s, assigned %s",
            self.group_id,
            self.generation,
            self.member_id,
            sorted(assigned) or "nothing",
        )
        await self._call("on_partitions_assigned", added)
        if self._heartbeat_task is None:
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                self._heartbeat(), name=f"heartbeat-{self.group_id}"
            )

    async def _revoke(self, partitions: set[TopicPartition]) -> None:
        """Give up `partitions` (committing first with commit_on_revoke, unless the
        membership was lost)."""
        if self.lost:
            await self._call("on_partitions_lost", partitions)
        elif partitions:
            if self.commit_on_revoke:
                try:
                    await self.consumer.commit()
                except MinibrokerError as exc:
                    log.warning("group %s: commit on revoke failed: %s", self.group_id, exc)
            await self._call("on_partitions_revoked", partitions)
        self.owned -= partitions
        self.consumer._apply_group_assignment(self.owned)

    async def _call(self, method: str, partitions: set[TopicPartition]) -> None:
        if self.listener is None:
            return
        callback = getattr(self.listener, method, None)
        if callback is None and method == "on_partitions_lost":
            callback = getattr(self.listener, "on_partitions_revoked", None)
        if callback is None:
            return
        result = callback(set(partitions))
        if inspect.isawaitable(result):
            await result

    # ------------------------------------------------------------------ join and sync

    async def _join_and_sync(self) -> set[TopicPartition]:
        consumer = self.consumer
        deadline = time.monotonic() + consumer.default_api_timeout_ms / 1000
        backoff = consumer.retry_backoff_ms / 1000
        rejoins = 0
        while True:
            try:
                node = await consumer._find_coordinator(self.group_id, consumer.request_timeout_ms)
                join = await self._send(node, self._join_request(), self.max_poll_interval_ms)
                assert isinstance(join, JoinGroupResponse)
                code = ErrorCode.of(join.error_code)
                if code == ErrorCode.MEMBER_ID_REQUIRED:
                    self.member_id = join.member_id
                    continue
                self._check(code, "JoinGroup")
                self.member_id, self.generation = join.member_id, join.generation_id
                self.leader = join.leader == join.member_id
                plan = await self._assign(join) if self.leader else {}
                sync = await self._send(node, self._sync_request(plan), 0)
                assert isinstance(sync, SyncGroupResponse)
                self._check(ErrorCode.of(sync.error_code), "SyncGroup")
                return {
                    TopicPartition(tp.topic, p)
                    for tp in decode_assignment(sync.assignment).assigned_partitions
                    for p in tp.partitions
                }
            except _Rejoin as exc:
                rejoins += 1
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError(
                        f"group {self.group_id}: no stable generation within "
                        f"{consumer.default_api_timeout_ms} ms ({rejoins} joins); last: {exc}"
                    ) from exc
                log.info("group %s: %s; joining again", self.group_id, exc)
            except MinibrokerError as exc:
                if not exc.retriable:
                    raise
                consumer._coordinator = None  # unreachable or moved: look it up again
                if time.monotonic() + backoff > deadline:
                    raise KafkaTimeoutError(
                        f"group {self.group_id}: could not join within "
                        f"{consumer.default_api_timeout_ms} ms; last error: {exc}"
                    ) from exc
                log.info("group %s: joining failed: %s; retrying", self.group_id, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _send(self, node: int, request: Any, wait_ms: int) -> Any:
        timeout = self.consumer.request_timeout_ms + wait_ms + _JOIN_SLACK_MS
        return await self.consumer._cluster.send(
            node, request, timeout_ms=timeout, coordinator=True
        )

    def _check(self, code: ErrorCode, what: str) -> None:
        """Raise for an error answer: retriable ones are retried by _join_and_sync
        (rejoining with the same member id, or as a new member)."""
        if code == ErrorCode.NONE:
            return
        if code in _COORDINATOR_GONE:
            self.consumer._coordinator = None
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
        if code in _MEMBERSHIP_GONE or code == ErrorCode.REBALANCE_IN_PROGRESS:
            raise _Rejoin(f"{what} answered {code.name}")
        raise error_for(code, f"{what} of group {self.group_id}")

    def _join_request(self) -> JoinGroupRequest:
        owned: dict[str, list[int]] = {}
        for tp in sorted(self.owned):
            owned.setdefault(tp.topic, []).append(tp.partition)
        subscription = encode_subscription(
            Subscription(
                topics=sorted(self.topics),
                owned_partitions=[TopicPartitions(t, ps) for t, ps in owned.items()],
                generation_id=self.generation,
            ),
            version=2,  # owned partitions with the generation they were owned in
        )
        return JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.max_poll_interval_ms,
            member_id=self.member_id,
            group_instance_id=self.group_instance_id,
            protocol_type="consumer",
            protocols=[
                JoinGroupRequestProtocol(name=a.name, metadata=subscription) for a in self.assignors
            ],
        )

    def _sync_request(self, plan: dict[str, bytes]) -> SyncGroupRequest:
        return SyncGroupRequest(
            group_id=self.group_id,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.group_instance_id,
            assignments=[
                SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in plan.items()
            ],
        )

    async def _assign(self, join: JoinGroupResponse) -> dict[str, bytes]:
        """The leader's plan: every member's subscription (whatever its client) split
        by the assignor the coordinator chose."""
        chosen = next((a for a in self.assignors if a.name == join.protocol_name), None)
        if chosen is None:
            raise error_for(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"the coordinator chose {join.protocol_name!r}, not offered by this member",
            )
        subscriptions = {m.member_id: _subscription_of(m) for m in join.members}
        topics = {t for s in subscriptions.values() for t in s.topics}
        meta = self.consumer._cluster.metadata
        if any(meta.partitions_for_topic(t) is None for t in topics):
            await self.consumer._cluster.refresh_metadata(topics)
        counts = {t: len(ps) for t in topics if (ps := meta.partitions_for_topic(t)) is not None}
        plan = chosen.assign(subscriptions, counts)
        log.info(
            "group %s: leader of generation %d assigns %d partitions of %d topics to %d "
            "members with %s",
            self.group_id,
            join.generation_id,
            sum(counts.values()),
            len(counts),
            len(subscriptions),
            chosen.name,
        )
        return {m: encode_assignment(a) for m, a in plan.items()}

    # ------------------------------------------------------------------ heartbeat

    async def _heartbeat(self) -> None:
        interval = self.heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            if self._join_task is not None or self.needs_rejoin:
                continue
            idle_ms = (time.monotonic() - self._last_poll) * 1000
            if idle_ms > self.max_poll_interval_ms:
                log.warning(
                    "group %s: poll() was not called for %.0f ms (max_poll_interval_ms=%d): "
                    "leaving the group; the next poll() rejoins. Process records faster or "
                    "raise max_poll_interval_ms",
                    self.group_id,
                    idle_ms,
                    self.max_poll_interval_ms,
                )
                await self._leave()
                self.lost = self.needs_rejoin = True
                continue
            await self._beat()

    async def _beat(self) -> None:
        consumer = self.consumer
        request = HeartbeatRequest(
            group_id=self.group_id,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.group_instance_id,
        )
        try:
            node = await consumer._find_coordinator(self.group_id, consumer.request_timeout_ms)
            answer = await consumer._cluster.send(
                node, request, timeout_ms=consumer.request_timeout_ms, coordinator=True
            )
        except MinibrokerError as exc:
            log.info("group %s: heartbeat failed: %s", self.group_id, exc)
            consumer._coordinator = None
            return
        assert isinstance(answer, HeartbeatResponse)
        code = ErrorCode.of(answer.error_code)
        if code == ErrorCode.NONE:
            return
        log.info("group %s: heartbeat answered %s: rejoining", self.group_id, code.name)
        if code in _COORDINATOR_GONE:
            consumer._coordinator = None
            return
        self.needs_rejoin = True
        if code in _MEMBERSHIP_GONE or code == ErrorCode.FENCED_INSTANCE_ID:
            self.lost = True
            if code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""

    # ------------------------------------------------------------------ leaving

    async def _leave(self) -> None:
        if not self.member_id:
            return
        consumer = self.consumer
        try:
            node = await consumer._find_coordinator(self.group_id, consumer.request_timeout_ms)
            await consumer._cluster.send(
                node,
                LeaveGroupRequest(group_id=self.group_id, member_id=self.member_id),
                timeout_ms=consumer.request_timeout_ms,
                coordinator=True,
            )
            log.info("group %s: member %s left", self.group_id, self.member_id)
        except MinibrokerError as exc:
            log.info("group %s: leaving failed (the session will expire): %s", self.group_id, exc)
        self.member_id, self.generation = "", -1

    async def close(self) -> None:
        """Revoke (committing first with commit_on_revoke) and leave the group; a static
        member (group_instance_id) does not leave: back within its session timeout, it
        gets its partitions again without a rebalance (KIP-345)."""
        for task in (self._heartbeat_task, self._join_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._heartbeat_task = self._join_task = None
        if not self.needs_rejoin or self.lost:
            await self._revoke(self.owned)
        if self.group_instance_id is None:
            await self._leave()
        self.needs_rejoin = True

    def commit_fields(self) -> tuple[int, str, str | None]:
        """(generation, member id, group instance id) a commit carries: the current
        generation's, or -1 and "" when not a member (the coordinator then refuses it
        if the group is active)."""
        return self.generation, self.member_id, self.group_instance_id

    def commit_failed(self, code: ErrorCode) -> None:
        """A commit was refused because the membership is gone: rejoin."""
        if code in _MEMBERSHIP_GONE or code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.needs_rejoin = True
            self.lost = code in _MEMBERSHIP_GONE


def _subscription_of(member: JoinGroupResponseMember) -> Subscription:
    return decode_subscription(bytes(member.metadata))
