"""Kafka's GroupCoordinator: FindCoordinator, group membership (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup: the classic rebalance protocol of broker/groups/membership.py),
the group tools' APIs (DescribeGroups, ListGroups, DeleteGroups), and OffsetCommit /
OffsetFetch, over the internal, replicated topic `__consumer_offsets` (its records:
broker/groups/records.py).

- A group belongs to partition `abs(java String.hashCode(group)) % N` of
  `__consumer_offsets` (Kafka's rule, `Utils.abs`: Integer.MIN_VALUE -> 0), N being the
  topic's partition count in the metadata image. Its coordinator is that partition's
  leader.
- The topic is created on first need (a FindCoordinator, OffsetCommit or OffsetFetch
  that finds no topic) through the controller, like a forwarded CreateTopics:
  `--offsets-topic-num-partitions` partitions (default 10; Kafka's is 50),
  replication factor `--offsets-topic-replication-factor` (default 3) lowered to the
  number of live brokers with a WARNING, min.insync.replicas = min(2, RF). Until it
  exists and its partition has a leader, FindCoordinator answers
  COORDINATOR_NOT_AVAILABLE (retriable).
- OffsetCommit (coordinator only, NOT_COORDINATOR elsewhere): one record batch, one
  record per partition, appended with acks=all through the normal leader path
  (ReplicaManager.produce, with our leader epoch as current_leader_epoch); the answer
  comes once the high watermark passed it, then the in-memory cache takes it.
- OffsetFetch answers from the cache: (offset, leader_epoch, metadata), -1 when none.
- Becoming leader of a `__consumer_offsets` partition (ReplicaManager leadership
  listener) loads its cache: once the high watermark reached the start offset of our
  leader epoch (everything the previous leaders acknowledged is then committed), read
  the log from its start up to the high watermark. Meanwhile OffsetCommit and
  OffsetFetch answer COORDINATOR_LOAD_IN_PROGRESS. Losing leadership drops the cache.
  These internal records are the only records the broker ever decodes.

- Group metadata (a generation's members and assignments) is a record of the same
  partition, written when the leader's SyncGroup completes a generation and when the
  group becomes empty; loading rebuilds the groups from it, so a coordinator that
  moves keeps its groups and their committed offsets (members get a fresh session
  and at most rejoin). Members' sessions are checked every SESSION_CHECK_S.
- DeleteGroups (an empty group only) writes tombstones of its metadata and offsets.
- A partition whose topic is deleted (Kafka's onPartitionsDeleted): the committed
  offsets of it in every shard we lead get tombstones, so that OffsetFetch no longer
  answers them and a topic created again under the name starts without them (a
  consumer would otherwise resume the new topic at the old topic's offsets and skip
  its first records). A shard still loading then is cleaned once it has loaded.
The log is not compacted (Kafka compacts this topic).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field

from broker.config import BrokerConfig
from broker.controller_channel import ControllerChannel
from broker.groups.group import Group
from broker.groups.group import GroupState
from broker.groups.membership import Membership
from broker.groups.membership import MembershipSettings
from broker.groups.membership import describe
from broker.groups.records import GROUP_KEY_VERSION
from broker.groups.records import GROUP_VALUE_VERSION
from broker.groups.records import OFFSET_KEY_VERSION
from broker.groups.records import OFFSET_VALUE_VERSION
from broker.groups.records import OFFSETS_TOPIC
from broker.groups.records import GroupKey
from broker.groups.records import GroupValue
from broker.groups.records import MemberRecord
from broker.groups.records import OffsetKey
from broker.groups.records import OffsetValue
from broker.groups.records import encode_key
from broker.groups.records import encode_value
from broker.groups.shard_cache import ShardCache
from broker.groups.shard_cache import load_cache
from broker.metadata_image import MetadataImage
from broker.partition import MIN_INSYNC_REPLICAS
from broker.partition import Partition
from broker.partition import Role
from broker.replica_manager import ReplicaManager
from broker.storage.errors import StorageError
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeletableGroupResult
from protocol.messages import DeleteGroupsRequest
from protocol.messages import DeleteGroupsResponse
from protocol.messages import DescribedGroup
from protocol.messages import DescribeGroupsRequest
from protocol.messages import DescribeGroupsResponse
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import HeartbeatRequest
from protocol.messages import HeartbeatResponse
from protocol.messages import JoinGroupRequest
from protocol.messages import JoinGroupResponse
from protocol.messages import LeaveGroupRequest
from protocol.messages import LeaveGroupResponse
from protocol.messages import ListedGroup
from protocol.messages import ListGroupsRequest
from protocol.messages import ListGroupsResponse
from protocol.messages import OffsetCommitPartitionResponse
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetCommitTopicResponse
from protocol.messages import OffsetFetchPartitionResponse
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from protocol.messages import OffsetFetchTopicResponse
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceTopic
from protocol.messages import SyncGroupRequest
from protocol.messages import SyncGroupResponse
from protocol.metadata_records import NO_LEADER
from protocol.record_batch import BatchBuilder
from runtime.peer_rpc import RpcError
from runtime.peer_rpc import RpcErrorResponse
from runtime.server import RequestContext

log = logging.getLogger(__name__)

# Kafka's offset.metadata.max.bytes and offsets.commit.timeout.ms.
MAX_METADATA_BYTES = 4096
COMMIT_TIMEOUT_MS = 5_000
# Load: the poll interval while waiting for the high watermark to reach the start of
# our epoch.
LOAD_POLL_S = 0.02
# How long a load may wait for the high watermark before it says so (it keeps waiting:
# the wait ends with the leadership at the latest).
LOAD_SLOW_WARNING_S = 30.0
# How often members' sessions are checked (a dead member is noticed this much late).
SESSION_CHECK_S = 0.1
# Tombstones per record batch when the offsets of deleted partitions are removed.
TOMBSTONES_PER_BATCH = 1000


# ---------------------------------------------------------------------- hashing


def java_string_hash(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, int32."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group: str, num_partitions: int) -> int:
    """Kafka's GroupMetadataManager.partitionFor: Utils.abs(hashCode) % partitions."""
    h = java_string_hash(group)
    h = 0 if h == -(1 << 31) else abs(h)
    return h % num_partitions


# ---------------------------------------------------------------------- coordinator


@dataclass
class _Shard:
    """Our coordinator state for one __consumer_offsets partition we lead."""

    index: int
    leader_epoch: int
    cache: ShardCache | None = None  # None while loading
    groups: dict[str, Group] = field(default_factory=dict)
    failed: bool = False
    task: asyncio.Task[None] | None = None
    # Partitions deleted while the shard was loading: their offsets are removed after.
    deleted_while_loading: set[tuple[str, int]] = field(default_factory=set)


# Produce errors -> commit errors, as Kafka's GroupMetadataManager maps them.
_COMMIT_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.FENCED_LEADER_EPOCH: ErrorCode.NOT_COORDINATOR,
    ErrorCode.UNKNOWN_LEADER_EPOCH: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}
# And group metadata's (Kafka's storeGroup): a record too large for the topic is no
# commit, so not INVALID_COMMIT_OFFSET_SIZE but UNKNOWN_SERVER_ERROR, and a timeout
# makes the members rejoin.
_GROUP_ERRORS = {
    **_COMMIT_ERRORS,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
}

Record = tuple[OffsetKey | GroupKey, OffsetValue | GroupValue | None]


class GroupCoordinator:
    def __init__(
        self,
        *,
        config: BrokerConfig,
        image: MetadataImage,
        replica_manager: ReplicaManager,
        controller: ControllerChannel,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.node_id = config.node_id
        self.num_partitions = config.offsets_topic_num_partitions
        self.replication_factor = config.offsets_topic_replication_factor
        self.create_timeout_s = config.request_timeout_ms / 1000
        self.image = image
        self.replicas = replica_manager
        self.controller = controller
        self.now_ms = now_ms
        self.membership = Membership(
            MembershipSettings(
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                max_size=config.group_max_size,
            ),
            self._store_group,
            now_ms,
        )
        self._shards: dict[int, _Shard] = {}
        self._create_task: asyncio.Task[None] | None = None
        self._sessions_task: asyncio.Task[None] | None = None
        self._cleanups: set[asyncio.Task[None]] = set()
        replica_manager.leadership_listeners.append(self.on_leadership)

    # ------------------------------------------------------------------ leadership

    def on_leadership(self, p: Partition, is_leader: bool) -> None:
        if p.topic != OFFSETS_TOPIC:
            return
        shard = self._shards.get(p.index)
        if is_leader and p.role is Role.LEADER:
            if shard is not None and shard.leader_epoch == p.leader_epoch:
                return  # same term (e.g. an ISR change)
            self._drop(p.index, reason=f"new leader epoch {p.leader_epoch}")
            shard = _Shard(p.index, p.leader_epoch)
            self._shards[p.index] = shard
            loop = asyncio.get_running_loop()
            shard.task = loop.create_task(self._load(p, shard), name=f"load-{p.name}")
            if self._sessions_task is None or self._sessions_task.done():
                self._sessions_task = loop.create_task(self._check_sessions(), name="sessions")
            return
        if shard is not None:
            self._drop(p.index, reason="no longer the leader")

    def _drop(self, index: int, *, reason: str) -> None:
        shard = self._shards.pop(index, None)
        if shard is None:
            return
        if shard.task is not None and not shard.task.done():
            shard.task.cancel()
        for group in shard.groups.values():
            if group.state is not GroupState.DEAD:
                self.membership.unload(group, ErrorCode.NOT_COORDINATOR)
        groups = len(shard.groups)
        log.info(
            "%s-%d: dropped the groups of leader epoch %d (%d groups): %s",
            OFFSETS_TOPIC,
            index,
            shard.leader_epoch,
            groups,
            reason,
        )

    def _still_leading(self, p: Partition, shard: _Shard) -> bool:
        return (
            self._shards.get(shard.index) is shard
            and p.role is Role.LEADER
            and p.leader_epoch == shard.leader_epoch
        )

    async def _load(self, p: Partition, shard: _Shard) -> None:
        started = time.monotonic()
        warned = False
        # Everything earlier leaders acknowledged lies below our epoch's start offset;
        # it is committed once the high watermark reaches it.
        while p.high_watermark_behind_epoch_start:
            if not self._still_leading(p, shard):
                return
            if not warned and time.monotonic() - started > LOAD_SLOW_WARNING_S:
                warned = True
                log.warning(
                    "%s: offsets load still waits for the high watermark %d to reach %d "
                    "(start of leader epoch %d)",
                    p.name,
                    p.high_watermark,
                    p.leader_epoch_start_offset,
                    shard.leader_epoch,
                )
            await asyncio.sleep(LOAD_POLL_S)
        if not self._still_leading(p, shard):
            return
        end = p.high_watermark
        try:
            cache = await load_cache(p.log, end, name=p.name)
            groups = cache.loaded_groups()
        except (StorageError, OSError) as exc:
            log.error(
                "%s: cannot load the committed offsets: %s. Its groups answer "
                "COORDINATOR_NOT_AVAILABLE here; if the partition's other replicas are in "
                "sync, move its leadership away (stop this broker) or restore its directory",
                p.name,
                exc,
            )
            shard.failed = True
            return
        if not self._still_leading(p, shard):
            return
        shard.groups = groups
        for group in shard.groups.values():
            self.membership.loaded(group)
        shard.cache = cache
        if shard.deleted_while_loading:
            self._remove_deleted(shard, shard.deleted_while_loading)
            shard.deleted_while_loading = set()
        log.info(
            "%s: loaded %d groups (%d with members) up to offset %d at leader epoch %d in %.0f ms",
            p.name,
            len(shard.groups),
            sum(1 for g in shard.groups.values() if g.members),
            end,
            shard.leader_epoch,
            (time.monotonic() - started) * 1000,
        )

    async def _check_sessions(self) -> None:
        while self._shards:
            for shard in list(self._shards.values()):
                if (cache := shard.cache) is not None:
                    self.membership.expire_sessions(shard.groups)
                    self.membership.forget_unformed(shard.groups, cache.holds)
            await asyncio.sleep(SESSION_CHECK_S)

    def close(self) -> None:
        for index in list(self._shards):
            self._drop(index, reason="shutting down")
        for task in (self._create_task, self._sessions_task, *self._cleanups):
            if task is not None and not task.done():
                task.cancel()

    # ------------------------------------------------------------------ deleted topics

    def on_partitions_deleted(self, partitions: set[tuple[str, int]]) -> None:
        """Partitions that no longer exist (their topic was deleted): their committed
        offsets are removed from every shard we lead, as Kafka's coordinator does."""
        partitions = {tp for tp in partitions if tp[0] != OFFSETS_TOPIC}
        if not partitions:
            return
        for shard in self._shards.values():
            if shard.cache is not None:
                self._remove_deleted(shard, partitions)
            elif not shard.failed:
                shard.deleted_while_loading |= partitions

    def _remove_deleted(self, shard: _Shard, partitions: set[tuple[str, int]]) -> None:
        assert shard.cache is not None
        keys = [
            OffsetKey(OFFSET_KEY_VERSION, group, topic, index)
            for group, offsets in shard.cache.groups.items()
            for topic, index in offsets
            if (topic, index) in partitions
        ]
        if not keys:
            return
        task = asyncio.get_running_loop().create_task(
            self._write_tombstones(shard, keys), name=f"remove-deleted-{shard.index}"
        )
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _write_tombstones(self, shard: _Shard, keys: list[OffsetKey]) -> None:
        topics = sorted({k.topic for k in keys})
        for start in range(0, len(keys), TOMBSTONES_PER_BATCH):
            chunk = keys[start : start + TOMBSTONES_PER_BATCH]
            error, base_offset = await self._append(shard, [(k, None) for k in chunk])
            if error != ErrorCode.NONE:
                # The records stay in the log (a later coordinator loads them): the
                # same as a deletion that happened while no one led the shard.
                log.warning(
                    "%s-%d: cannot remove %d committed offsets of deleted topics %s: %s",
                    OFFSETS_TOPIC,
                    shard.index,
                    len(keys) - start,
                    topics,
                    error.name,
                )
                return
            if not self._current(shard):
                return
            assert shard.cache is not None
            for i, key in enumerate(chunk):
                shard.cache.apply(key, None, base_offset + i)
        log.info(
            "%s-%d: removed %d committed offsets of deleted topics %s",
            OFFSETS_TOPIC,
            shard.index,
            len(keys),
            topics,
        )

    # ------------------------------------------------------------------ topic

    def _topic_partitions(self) -> int | None:
        info = self.image.topics_by_name.get(OFFSETS_TOPIC)
        if info is None or not info.partitions:
            return None
        return len(info.partitions)

    def _ensure_topic(self) -> None:
        """Start creating the topic, once at a time."""
        if self._create_task is not None and not self._create_task.done():
            return
        self._create_task = asyncio.get_running_loop().create_task(
            self._create_topic(), name="create-offsets-topic"
        )

    async def _create_topic(self) -> None:
        live = len(self.image.live_brokers())
        if live == 0:
            log.warning("cannot create %s: no live broker in the metadata", OFFSETS_TOPIC)
            return
        rf = self.replication_factor
        if live < rf:
            log.warning(
                "creating %s with replication factor %d: only %d live brokers "
                "(offsets.topic.replication.factor=%d)",
                OFFSETS_TOPIC,
                live,
                live,
                rf,
            )
            rf = live
        request = CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name=OFFSETS_TOPIC,
                    num_partitions=self.num_partitions,
                    replication_factor=rf,
                    configs={MIN_INSYNC_REPLICAS: str(min(2, rf))},
                )
            ],
            timeout_ms=int(self.create_timeout_s * 1000),
        )
        try:
            resp = await self.controller.forward(request, self.create_timeout_s)
        except RpcErrorResponse as exc:
            log.warning("creating %s was refused: %s", OFFSETS_TOPIC, exc.message)
            return
        except RpcError as exc:
            log.warning("creating %s failed: %s", OFFSETS_TOPIC, exc)
            return
        assert isinstance(resp, CreateTopicsResponse)
        for result in resp.topics:
            if result.error_code == ErrorCode.NONE:
                log.info(
                    "created %s: %d partitions, replication factor %d",
                    OFFSETS_TOPIC,
                    self.num_partitions,
                    rf,
                )
            elif result.error_code != ErrorCode.TOPIC_ALREADY_EXISTS:
                log.warning(
                    "creating %s failed: %s %s",
                    OFFSETS_TOPIC,
                    ErrorCode.of(result.error_code).name,
                    result.error_message or "",
                )

    # ------------------------------------------------------------------ lookups

    def _locate(self, group: str) -> tuple[int, ErrorCode]:
        """(partition index, error) for a group: COORDINATOR_NOT_AVAILABLE while the
        topic does not exist (its creation is then started)."""
        n = self._topic_partitions()
        if n is None:
            self._ensure_topic()
            return -1, ErrorCode.COORDINATOR_NOT_AVAILABLE
        return partition_for(group, n), ErrorCode.NONE

    def _shard_for(self, group: str) -> tuple[_Shard | None, ErrorCode]:
        """The loaded shard that owns `group`, or why there is none here."""
        if not group:
            return None, ErrorCode.INVALID_GROUP_ID
        index, err = self._locate(group)
        if err != ErrorCode.NONE:
            return None, err
        shard = self._shards.get(index)
        if shard is None:
            return None, ErrorCode.NOT_COORDINATOR
        if shard.failed:
            return None, ErrorCode.COORDINATOR_NOT_AVAILABLE
        if shard.cache is None:
            return None, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return shard, ErrorCode.NONE

    # ------------------------------------------------------------------ writes

    async def _append(
        self, shard: _Shard, records: list[Record], errors: dict[ErrorCode, ErrorCode] | None = None
    ) -> tuple[ErrorCode, int]:
        """Write records to the shard's partition with acks=all: (error mapped as Kafka's
        coordinator maps it, by `errors` or else as for commits, base offset); NONE once
        the high watermark passed them."""
        builder = BatchBuilder()
        ts = self.now_ms()
        for key, value in records:
            builder.append(encode_value(value), encode_key(key), timestamp=ts)
        produce = ProduceRequest(
            acks=-1,
            timeout_ms=COMMIT_TIMEOUT_MS,
            topics=[
                ProduceTopic(
                    name=OFFSETS_TOPIC,
                    partitions=[
                        ProducePartition(
                            index=shard.index,
                            current_leader_epoch=shard.leader_epoch,
                            records=builder.build(),
                        )
                    ],
                )
            ],
        )
        result = (await self.replicas.produce(produce, internal=True)).topics[0].partitions[0]
        code = ErrorCode.of(result.error_code)
        if code == ErrorCode.NONE:
            return code, result.base_offset
        too_large = code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE)
        log.log(
            logging.WARNING if too_large else logging.INFO,
            "%s-%d: writing %d records failed: %s (%s)",
            OFFSETS_TOPIC,
            shard.index,
            len(records),
            code.name,
            result.error_message or "",
        )
        return (errors or _COMMIT_ERRORS).get(code, ErrorCode.UNKNOWN_SERVER_ERROR), -1

    def _current(self, shard: _Shard) -> bool:
        """Whether the shard is still ours and loaded (after an await)."""
        return self._shards.get(shard.index) is shard and shard.cache is not None

    def _shard_of(self, group: Group) -> _Shard | None:
        for shard in self._shards.values():
            if shard.groups.get(group.group_id) is group:
                return shard
        return None

    async def _store_group(self, group: Group, assignments: dict[str, bytes] | None) -> ErrorCode:
        """Write the group's metadata record (Membership's persist callback)."""
        shard = self._shard_of(group)
        if shard is None:
            return ErrorCode.NOT_COORDINATOR
        key = GroupKey(GROUP_KEY_VERSION, group.group_id)
        value = GroupValue(
            GROUP_VALUE_VERSION,
            group.protocol_type or "",
            group.generation,
            group.protocol_name,
            group.leader,
            group.state_timestamp_ms,
            [
                MemberRecord(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata(group.protocol_name) if group.protocol_name else b"",
                    m.assignment if assignments is None else assignments.get(m.member_id, b""),
                )
                for m in group.members.values()
            ],
        )
        error, _ = await self._append(shard, [(key, value)], _GROUP_ERRORS)
        if error == ErrorCode.UNKNOWN_SERVER_ERROR:
            size = sum(len(m.subscription) + len(m.assignment) for m in value.members)
            log.warning(
                "group %s: its metadata record (%d members, %d bytes of subscriptions and "
                "assignments) could not be written to %s-%d (the line before says why); "
                "answered UNKNOWN_SERVER_ERROR, as Kafka. A record too large fits with "
                "fewer members, smaller subscriptions or assignments, or a larger "
                "max.message.bytes of %s",
                group.group_id,
                len(value.members),
                size,
                OFFSETS_TOPIC,
                shard.index,
                OFFSETS_TOPIC,
            )
        if error == ErrorCode.NONE and self._current(shard):
            assert shard.cache is not None
            shard.cache.apply_group(key, value)
        return error

    # ------------------------------------------------------------------ membership APIs

    async def join_group(self, ctx: RequestContext, req: JoinGroupRequest) -> JoinGroupResponse:
        shard, err = self._shard_for(req.group_id)
        if shard is None:
            return JoinGroupResponse(error_code=err, member_id=req.member_id)
        return await self.membership.join(shard.groups, ctx, req)

    async def sync_group(self, ctx: RequestContext, req: SyncGroupRequest) -> SyncGroupResponse:
        shard, err = self._shard_for(req.group_id)
        if shard is None:
            return SyncGroupResponse(error_code=err)
        return await self.membership.sync(shard.groups.get(req.group_id), req)

    async def heartbeat(self, ctx: RequestContext, req: HeartbeatRequest) -> HeartbeatResponse:
        shard, err = self._shard_for(req.group_id)
        if shard is None:
            return HeartbeatResponse(error_code=err)
        return self.membership.heartbeat(shard.groups.get(req.group_id), req)

    async def leave_group(self, ctx: RequestContext, req: LeaveGroupRequest) -> LeaveGroupResponse:
        shard, err = self._shard_for(req.group_id)
        if shard is None:
            return LeaveGroupResponse(error_code=err)
        return self.membership.leave(shard.groups.get(req.group_id), req)

    # ------------------------------------------------------------------ group tools

    async def describe_groups(
        self, ctx: RequestContext, req: DescribeGroupsRequest
    ) -> DescribeGroupsResponse:
        out = []
        for group_id in req.groups:
            shard, err = self._shard_for(group_id)
            group = shard.groups.get(group_id) if shard is not None else None
            if shard is None:
                out.append(DescribedGroup(error_code=err, group_id=group_id))
            elif group is None:
                # Kafka answers an unknown group as a dead one, without an error.
                out.append(DescribedGroup(group_id=group_id, group_state=GroupState.DEAD.value))
            else:
                out.append(describe(group))
        return DescribeGroupsResponse(groups=out)

    async def list_groups(self, ctx: RequestContext, req: ListGroupsRequest) -> ListGroupsResponse:
        if any(s.cache is None and not s.failed for s in self._shards.values()):
            return ListGroupsResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return ListGroupsResponse(
            groups=[
                ListedGroup(
                    group_id=g.group_id,
                    protocol_type=g.protocol_type or "",
                    group_state=g.state.value,
                )
                for shard in self._shards.values()
                for g in shard.groups.values()
                if g.state is not GroupState.DEAD
            ]
        )

    async def delete_groups(
        self, ctx: RequestContext, req: DeleteGroupsRequest
    ) -> DeleteGroupsResponse:
        results = []
        for group_id in req.groups_names:
            error = await self._delete_group(group_id)
            results.append(DeletableGroupResult(group_id=group_id, error_code=error))
        return DeleteGroupsResponse(results=results)

    async def _delete_group(self, group_id: str) -> ErrorCode:
        shard, err = self._shard_for(group_id)
        if shard is None:
            return err
        group = shard.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.state is not GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        assert shard.cache is not None
        # Gone from memory before the tombstones are written, as in Kafka (the group
        # leaves the cache, then its records are deleted): a JoinGroup or OffsetCommit
        # meanwhile makes a new group, whose records follow the tombstones in the log.
        # Kept, it was joined (a member told GROUP_ID_NOT_FOUND once the deletion
        # landed, its generation's record left behind it in the log) or committed to
        # (offsets answered for a group that ListGroups and DeleteGroups no longer knew).
        del shard.groups[group_id]
        offsets = shard.cache.groups.pop(group_id, {})
        metadata = shard.cache.metadata.pop(group_id, None)
        tombstones: list[Record] = [
            (OffsetKey(OFFSET_KEY_VERSION, group_id, topic, partition), None)
            for topic, partition in offsets
        ]
        tombstones.append((GroupKey(GROUP_KEY_VERSION, group_id), None))
        error, _ = await self._append(shard, tombstones)
        if error != ErrorCode.NONE:
            # Not deleted: back as it was, unless a new group took the id meanwhile.
            taken = group_id in shard.groups or shard.cache.holds(group_id)
            if self._current(shard) and not taken:
                shard.groups[group_id] = group
                if offsets:
                    shard.cache.groups[group_id] = offsets
                if metadata is not None:
                    shard.cache.metadata[group_id] = metadata
            return error
        self.membership.unload(group, ErrorCode.GROUP_ID_NOT_FOUND)
        log.info("group %s deleted with its committed offsets", group_id)
        return ErrorCode.NONE

    # ------------------------------------------------------------------ offsets

    async def find_coordinator(
        self, ctx: RequestContext, req: FindCoordinatorRequest
    ) -> FindCoordinatorResponse:
        if req.key_type != 0:
            return FindCoordinatorResponse(
                error_code=int(ErrorCode.INVALID_REQUEST),
                error_message="only group coordinators (key_type 0) are supported",
            )
        if not req.key:
            return FindCoordinatorResponse(
                error_code=int(ErrorCode.INVALID_GROUP_ID), error_message="empty group id"
            )
        index, err = self._locate(req.key)
        if err != ErrorCode.NONE:
            return FindCoordinatorResponse(
                error_code=int(err), error_message=f"{OFFSETS_TOPIC} is being created"
            )
        state = self.image.partition(OFFSETS_TOPIC, index)
        leader = state.leader if state is not None else NO_LEADER
        broker = self.image.brokers.get(leader) if leader != NO_LEADER else None
        listener = broker.listener(ctx.listener) if broker is not None else None
        if broker is None or broker.fenced or listener is None:
            return FindCoordinatorResponse(
                error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                error_message=f"{OFFSETS_TOPIC}-{index} has no available leader",
            )
        return FindCoordinatorResponse(node_id=leader, host=listener.host, port=listener.port)

    async def offset_commit(
        self, ctx: RequestContext, req: OffsetCommitRequest
    ) -> OffsetCommitResponse:
        def answer(code: ErrorCode) -> OffsetCommitResponse:
            return OffsetCommitResponse(
                topics=[
                    OffsetCommitTopicResponse(
                        name=t.name,
                        partitions=[
                            OffsetCommitPartitionResponse(
                                partition_index=p.partition_index, error_code=int(code)
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in req.topics
                ]
            )

        shard, err = self._shard_for(req.group_id)
        if shard is None:
            return answer(err)
        group = shard.groups.get(req.group_id)
        err = self.membership.commit_allowed(
            group, req.generation_id, req.member_id, req.group_instance_id
        )
        if err != ErrorCode.NONE:
            return answer(err)
        if group is None:  # a consumer outside any group: its offsets make an empty group
            group = shard.groups[req.group_id] = Group(req.group_id)
        resp = answer(ErrorCode.NONE)
        ts = self.now_ms()
        written: list[tuple[OffsetCommitPartitionResponse, OffsetKey, OffsetValue]] = []
        for topic, topic_out in zip(req.topics, resp.topics, strict=True):
            for part, out in zip(topic.partitions, topic_out.partitions, strict=True):
                if self.image.partition(topic.name, part.partition_index) is None:
                    out.error_code = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    continue
                metadata = part.committed_metadata
                if metadata is not None and len(metadata.encode()) > MAX_METADATA_BYTES:
                    out.error_code = int(ErrorCode.OFFSET_METADATA_TOO_LARGE)
                    continue
                if part.committed_offset < 0:
                    # No consumer can resume from it: refused, not stored (the answer has
                    # no message field, so the log says what was wrong).
                    log.info(
                        "OffsetCommit from group %s: offset %d for %s-%d is negative; "
                        "refused (INVALID_REQUEST)",
                        req.group_id,
                        part.committed_offset,
                        topic.name,
                        part.partition_index,
                    )
                    out.error_code = int(ErrorCode.INVALID_REQUEST)
                    continue
                key = OffsetKey(OFFSET_KEY_VERSION, req.group_id, topic.name, part.partition_index)
                value = OffsetValue(
                    OFFSET_VALUE_VERSION,
                    part.committed_offset,
                    part.committed_leader_epoch,
                    metadata,
                    ts,
                )
                written.append((out, key, value))
        if not written:
            return resp
        error, base_offset = await self._append(shard, [(k, v) for _, k, v in written])
        if error != ErrorCode.NONE:
            for out, _, _ in written:
                out.error_code = int(error)
            return resp
        # Committed (the high watermark passed it): the cache takes it, unless the
        # shard changed meanwhile (a reload reads it from the log). A group deleted
        # while the commit was written is there again, with these offsets, as a reload
        # would find it.
        if self._current(shard):
            assert shard.cache is not None
            for i, (_, key, value) in enumerate(written):
                shard.cache.apply(key, value, base_offset + i)
            if req.group_id not in shard.groups and shard.cache.holds(req.group_id):
                shard.groups[req.group_id] = Group(req.group_id)
        return resp

    async def offset_fetch(
        self, ctx: RequestContext, req: OffsetFetchRequest
    ) -> OffsetFetchResponse:
        shard, err = self._shard_for(req.group_id)
        if shard is None or shard.cache is None:
            return OffsetFetchResponse(error_code=int(err))
        cache = shard.cache
        if req.topics is None:
            by_topic: dict[str, list[int]] = {}
            for topic, index in sorted(cache.groups.get(req.group_id, {})):
                by_topic.setdefault(topic, []).append(index)
            wanted = list(by_topic.items())
        else:
            wanted = [(t.name, t.partition_indexes) for t in req.topics]
        topics = []
        for name, indexes in wanted:
            parts = []
            for index in indexes:
                c = cache.get(req.group_id, name, index)
                parts.append(
                    OffsetFetchPartitionResponse(partition_index=index)
                    if c is None
                    else OffsetFetchPartitionResponse(
                        partition_index=index,
                        committed_offset=c.offset,
                        committed_leader_epoch=c.leader_epoch,
                        metadata=c.metadata,
                    )
                )
            topics.append(OffsetFetchTopicResponse(name=name, partitions=parts))
        return OffsetFetchResponse(topics=topics)
