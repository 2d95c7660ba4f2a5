"""The offsets part of Kafka's GroupCoordinator: FindCoordinator, OffsetCommit and
OffsetFetch over the internal, replicated topic `__consumer_offsets` (no group
membership, no rebalancing: every commit is accepted as from a "simple" consumer).

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

Record format in `__consumer_offsets` (RecordBatch v2, no compression), both key and
value MessagePack arrays (msgspec, array_like):
  key   = [version=1, group: str, topic: str, partition: int]
  value = [version=1, offset: int, leader_epoch: int (-1 none), metadata: str | nil,
           commit_timestamp: int (ms since the epoch)]
          or a null value (tombstone: the commit is deleted; not written yet).
Records with another key or value version are skipped on load (room for group
metadata records later). The log is not compacted (Kafka compacts this topic).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field

import msgspec

from broker.config import BrokerConfig
from broker.controller_channel import ControllerChannel
from broker.metadata_image import MetadataImage
from broker.partition import MIN_INSYNC_REPLICAS
from broker.partition import Partition
from broker.partition import Role
from broker.replica_manager import ReplicaManager
from broker.rpc import RpcError
from broker.rpc import RpcErrorResponse
from broker.storage.errors import StorageError
from broker.storage.log import Log
from protocol.errors import CorruptRecordError
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
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
from protocol.metadata_records import NO_LEADER
from protocol.record_batch import BatchBuilder
from protocol.record_batch import decode_batch
from protocol.record_batch import iter_headers
from runtime.server import RequestContext

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
KEY_VERSION = 1
VALUE_VERSION = 1
# Kafka's offset.metadata.max.bytes and offsets.commit.timeout.ms.
MAX_METADATA_BYTES = 4096
COMMIT_TIMEOUT_MS = 5_000
# Load: bytes read per step (the loop yields between steps), and the poll interval
# while waiting for the high watermark to reach the start of our epoch.
LOAD_CHUNK_BYTES = 1 << 20
LOAD_POLL_S = 0.02
# How long a load may wait for the high watermark before it says so (it keeps waiting:
# the wait ends with the leadership at the latest).
LOAD_SLOW_WARNING_S = 30.0


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


# ---------------------------------------------------------------------- records


class OffsetKey(msgspec.Struct, array_like=True, frozen=True):
    version: int
    group: str
    topic: str
    partition: int


class OffsetValue(msgspec.Struct, array_like=True, frozen=True):
    version: int
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp: int


_key_decoder = msgspec.msgpack.Decoder(OffsetKey)
_value_decoder = msgspec.msgpack.Decoder(OffsetValue)
_header_decoder = msgspec.msgpack.Decoder(list)


def encode_commit(
    group: str,
    topic: str,
    partition: int,
    offset: int,
    leader_epoch: int,
    metadata: str | None,
    commit_timestamp: int,
) -> tuple[bytes, bytes]:
    key = OffsetKey(KEY_VERSION, group, topic, partition)
    value = OffsetValue(VALUE_VERSION, offset, leader_epoch, metadata, commit_timestamp)
    return msgspec.msgpack.encode(key), msgspec.msgpack.encode(value)


def decode_commit(
    key: bytes | None, value: bytes | None
) -> tuple[OffsetKey, OffsetValue | None] | None:
    """(key, value or None for a tombstone); None for a record of another kind or
    version. Raises msgspec.DecodeError on a malformed record of our versions."""
    if key is None:
        return None
    head = _header_decoder.decode(key)
    if not head or head[0] != KEY_VERSION:
        return None
    k = _key_decoder.decode(key)
    if value is None:
        return k, None
    vhead = _header_decoder.decode(value)
    if not vhead or vhead[0] != VALUE_VERSION:
        return None
    return k, _value_decoder.decode(value)


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp: int
    log_offset: int  # where the commit record is in __consumer_offsets


@dataclass
class OffsetCache:
    """Committed offsets of the groups of one __consumer_offsets partition."""

    groups: dict[str, dict[tuple[str, int], CommittedOffset]] = field(default_factory=dict)

    def apply(self, key: OffsetKey, value: OffsetValue | None, log_offset: int) -> None:
        """Later records win (by log offset): replies to concurrent commits may come
        back in any order, the log order is the truth."""
        offsets = self.groups.get(key.group)
        tp = (key.topic, key.partition)
        current = offsets.get(tp) if offsets is not None else None
        if current is not None and current.log_offset >= log_offset:
            return
        if value is None:
            if offsets is not None:
                offsets.pop(tp, None)
                if not offsets:
                    del self.groups[key.group]
            return
        if offsets is None:
            offsets = self.groups[key.group] = {}
        offsets[tp] = CommittedOffset(
            value.offset, value.leader_epoch, value.metadata, value.commit_timestamp, log_offset
        )

    def get(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        offsets = self.groups.get(group)
        return offsets.get((topic, partition)) if offsets is not None else None


async def load_cache(log_: Log, end_offset: int, *, name: str = OFFSETS_TOPIC) -> OffsetCache:
    """Read `log_` from its start up to `end_offset` (exclusive) into a cache,
    LOAD_CHUNK_BYTES at a time, yielding to the loop between chunks. A batch that
    cannot be decoded is skipped with an ERROR line."""
    cache = OffsetCache()
    offset = log_.log_start_offset
    while offset < end_offset:
        data = log_.read(offset, LOAD_CHUNK_BYTES, max_offset=end_offset)
        if not data:
            break
        next_offset = offset
        for pos, header in iter_headers(data):
            next_offset = max(next_offset, header.next_offset)
            if header.is_control:
                continue
            try:
                _, records = decode_batch(data, pos)
                for record in records:
                    if record.offset >= end_offset:
                        break
                    decoded = decode_commit(record.key, record.value)
                    if decoded is not None:
                        cache.apply(decoded[0], decoded[1], record.offset)
            except (CorruptRecordError, DecodeError, msgspec.DecodeError, ValueError) as exc:
                log.error(
                    "%s: skipping undecodable batch at offset %d while loading: %s",
                    name,
                    header.base_offset,
                    exc,
                )
        if next_offset <= offset:
            break  # no whole batch in the read: cannot progress
        offset = next_offset
        await asyncio.sleep(0)
    return cache


# ---------------------------------------------------------------------- coordinator


@dataclass
class _Shard:
    """Our coordinator state for one __consumer_offsets partition we lead."""

    index: int
    leader_epoch: int
    cache: OffsetCache | None = None  # None while loading
    failed: bool = False
    task: asyncio.Task[None] | None = None


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
        self._shards: dict[int, _Shard] = {}
        self._create_task: asyncio.Task[None] | None = None
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
            shard.task = asyncio.get_running_loop().create_task(
                self._load(p, shard), name=f"load-{p.name}"
            )
            return
        if shard is not None:
            self._drop(p.index, reason="no longer the leader")

    def _drop(self, index: int, *, reason: str) -> None:
        shard = self._shards.pop(index, None)
        if shard is None:
            return
        if shard.task is not None and not shard.task.done():
            shard.task.cancel()
        groups = len(shard.cache.groups) if shard.cache is not None else 0
        log.info(
            "%s-%d: dropped the offsets cache of leader epoch %d (%d groups): %s",
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
        except (StorageError, OSError) as exc:
            log.error("%s: cannot load the committed offsets: %s", p.name, exc)
            shard.failed = True
            return
        if not self._still_leading(p, shard):
            return
        shard.cache = cache
        log.info(
            "%s: loaded committed offsets of %d groups up to offset %d at leader epoch %d "
            "in %.0f ms",
            p.name,
            len(cache.groups),
            end,
            shard.leader_epoch,
            (time.monotonic() - started) * 1000,
        )

    def close(self) -> None:
        for index in list(self._shards):
            self._drop(index, reason="shutting down")
        if self._create_task is not None and not self._create_task.done():
            self._create_task.cancel()

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

    # ------------------------------------------------------------------ APIs

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

        if not req.group_id:
            return answer(ErrorCode.INVALID_GROUP_ID)
        shard, err = self._shard_for(req.group_id)
        if shard is None:
            return answer(err)
        resp = answer(ErrorCode.NONE)
        builder = BatchBuilder()
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
                key = OffsetKey(KEY_VERSION, req.group_id, topic.name, part.partition_index)
                value = OffsetValue(
                    VALUE_VERSION,
                    part.committed_offset,
                    part.committed_leader_epoch,
                    metadata,
                    ts,
                )
                builder.append(
                    msgspec.msgpack.encode(value), msgspec.msgpack.encode(key), timestamp=ts
                )
                written.append((out, key, value))
        if not written:
            return resp
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
        result = (await self.replicas.produce(produce)).topics[0].partitions[0]
        code = ErrorCode.of(result.error_code)
        if code != ErrorCode.NONE:
            mapped = _COMMIT_ERRORS.get(code, ErrorCode.UNKNOWN_SERVER_ERROR)
            log.info(
                "%s-%d: commit of group %r failed: %s (%s)",
                OFFSETS_TOPIC,
                shard.index,
                req.group_id,
                code.name,
                result.error_message or "",
            )
            for out, _, _ in written:
                out.error_code = int(mapped)
            return resp
        # Committed (the high watermark passed it): the cache takes it, unless the
        # shard changed meanwhile (a reload reads it from the log).
        if self._shards.get(shard.index) is shard and shard.cache is not None:
            for i, (_, key, value) in enumerate(written):
                shard.cache.apply(key, value, result.base_offset + i)
        return resp

    async def offset_fetch(
        self, ctx: RequestContext, req: OffsetFetchRequest
    ) -> OffsetFetchResponse:
        if not req.group_id:
            return OffsetFetchResponse(error_code=int(ErrorCode.INVALID_GROUP_ID))
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
