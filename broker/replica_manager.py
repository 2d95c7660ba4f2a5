"""The partitions this broker holds, and the data path over them.

- applies the local part of each metadata delta: lead (new epoch in the epoch cache,
  stamped on every append; the follower fetcher lets go of the partition), follow
  (the fetcher reconciles by epoch, then replicates: broker/fetcher.py), go offline,
  stop and delete (only when a record names the replica's topic id), or stop and set
  the replica aside as stray (anything the metadata merely no longer shows);
- Produce with acks 0/1/all (acks=all: NOT_ENOUGH_REPLICAS before the append when the
  ISR is below min.insync.replicas, then a delayed produce answered when the high
  watermark passes the batch, NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank
  below the minimum meanwhile, REQUEST_TIMED_OUT after timeout_ms), Fetch with
  long-poll (consumers below the high watermark, followers up to the LEO; a follower's
  fetch records its progress, may move the high watermark and wakes delayed produces,
  and may expand the ISR), ListOffsets, OffsetsForLeaderEpoch;
- ISR changes through AlterPartition (broker/alter_partition.py, KIP-903): expand on
  a follower's fetch, shrink on a periodic check every replica.lag.time.max.ms / 2;
- background jobs: high-watermark (and recovery point / log start) checkpoints,
  the flush.ms policy, and retention.

The controller channel (our broker epoch, AlterPartition) is attached by the server
with `attach_controller`; until then the broker epoch comes from the metadata image
and AlterPartition goes through a channel of our own.

The broker never decodes a record: storage validates batch headers and CRCs and
stamps offsets and the leader epoch in place; Fetch returns file slices as bytes.
fsync always runs in a worker thread (flush.messages, flush.ms, checkpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from broker.alter_partition import AlterPartitionManager, IsrChange, SendAlterPartition
from broker.config import BrokerConfig
from broker.controller_channel import ControllerChannel
from broker.delayed import DelayedOperation, Purgatory
from broker.faults import NO_FAULTS, Faults
from broker.fetcher import ClientFactory, FetcherManager
from broker.isr import EXPAND, SHRINK, PendingIsr, ineligibility, isr_with_epochs
from broker.metadata_image import MetadataDelta, MetadataImage, PartitionState, TopicPartition
from broker.partition import MIN_INSYNC_REPLICAS, Partition, Role
from broker.storage.errors import (
    InvalidAppendError,
    LogDirFailureError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from broker.storage.log import LogConfig
from broker.storage.log_manager import STRAY_ADVICE, LogManager
from broker.storage.producer_state import ProducerStateError
from protocol.api import DEBUGGING_REPLICA_ID, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, NO_EPOCH
from protocol.errors import CorruptRecordError, DecodeError, ErrorCode, InvalidRecordError
from protocol.messages import (
    AlterPartitionPartitionResult,
    AlterPartitionRequest,
    AlterPartitionResponse,
    EpochEndOffset,
    EpochEndOffsetResult,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopicResponse,
    LeaderIdAndEpoch,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    Message,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    ProduceTopicResponse,
)
from protocol.metadata_records import LEADER_RECOVERED
from runtime.fileio import off_loop

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


def mono_ms() -> int:
    """Clock of the replication timers (lag, ISR retries): never jumps."""
    return int(time.monotonic() * 1000)


# AlterPartition refusals after which the leader waits for the metadata log (its view
# of the partition or of itself is stale); the pending change keeps counting in the
# high watermark meanwhile, as Kafka keeps it in flight.
_AWAIT_METADATA = frozenset(
    {
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.INVALID_UPDATE_VERSION,
        ErrorCode.STALE_BROKER_EPOCH,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NEW_LEADER_ELECTED,
    }
)


# ---------------------------------------------------------------------- delayed ops


class _FetchWatch:
    __slots__ = ("appended_at_start", "epoch", "fetch_offset", "partition")

    def __init__(self, partition: Partition, fetch_offset: int) -> None:
        self.partition = partition
        self.fetch_offset = fetch_offset
        self.epoch = partition.leader_epoch
        self.appended_at_start = partition.appended_bytes


class DelayedFetch(DelayedOperation):
    """Completes when about `min_bytes` are readable, or a watched partition changed
    role or epoch or was truncated (the answer then carries the error).

    Bytes are estimated from what was appended since the fetch started, so no read
    happens until the answer is built; the estimate can only make a fetch answer
    early, never late."""

    def __init__(
        self, watches: list[_FetchWatch], *, min_bytes: int, have_bytes: int, to_leo: bool
    ) -> None:
        super().__init__(w.partition.tp for w in watches)
        self.watches = watches
        self.min_bytes = min_bytes
        self.have_bytes = have_bytes
        self.to_leo = to_leo

    def try_complete(self) -> bool:
        total = self.have_bytes
        for w in self.watches:
            p = w.partition
            if p.role is not Role.LEADER or p.leader_epoch != w.epoch:
                return True
            end = p.log_end_offset if self.to_leo else p.high_watermark
            if end < w.fetch_offset or p.log_start_offset > w.fetch_offset:
                return True  # out of range now: answer with the error
            if end > w.fetch_offset:
                total += max(1, p.appended_bytes - w.appended_at_start)
        return total >= self.min_bytes


class DelayedProduce(DelayedOperation):
    """acks=all: completes when, for every appended batch, the high watermark passed
    it or the partition lost its leadership. Each partition's outcome is fixed the
    moment it is decided (a leader that is deposed and re-elected meanwhile must not
    count a batch it may have truncated): NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND
    (the maximal ISR shrank below min.insync.replicas, as Kafka counts it) or
    NOT_LEADER_OR_FOLLOWER. Undecided at the timeout: REQUEST_TIMED_OUT.

    A leader epoch bump without a change of leader (the controller re-elected us)
    keeps the wait going, as in Kafka: the batch stays in our log, and the high
    watermark of the new epoch passing it means the ISR has it."""

    def __init__(self, waits: list[tuple[Partition, int, int]]) -> None:
        super().__init__(p.tp for p, _, _ in waits)
        self.waits = waits  # (partition, required high watermark, leader generation)
        self.outcomes: list[ErrorCode | None] = [None] * len(waits)

    def try_complete(self) -> bool:
        done = True
        for i, (p, required, generation) in enumerate(self.waits):
            if self.outcomes[i] is not None:
                continue
            if p.role is not Role.LEADER or p.leader_generation != generation:
                self.outcomes[i] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            elif p.high_watermark >= required:
                self.outcomes[i] = (
                    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                    if len(p.maximal_isr) < p.min_insync_replicas
                    else ErrorCode.NONE
                )
            else:
                done = False
        return done


def fetch_response_max_bytes(config: BrokerConfig, request: FetchRequest) -> int:
    """The record bytes one Fetch may return, all partitions together: its max_bytes,
    capped by fetch.max.bytes for a consumer and by replica.fetch.response.max.bytes
    for a follower (Kafka caps both at fetch.max.bytes; the follower's own setting is
    the tighter bound). The first batch is returned whole even when larger (KIP-74);
    a batch is at most the max.message.bytes it was accepted under."""
    cap = (
        config.replica_fetch_response_max_bytes
        if request.replica_id >= 0
        else config.fetch_max_bytes
    )
    return max(0, min(request.max_bytes, cap))


# ---------------------------------------------------------------------- the manager


class ReplicaManager:
    def __init__(
        self,
        config: BrokerConfig,
        log_manager: LogManager,
        image: MetadataImage,
        *,
        base_log_config: LogConfig,
        checkpointed_high_watermarks: dict[TopicPartition, int] | None = None,
        fetcher_client_factory: ClientFactory | None = None,
        send_alter_partition: SendAlterPartition | None = None,
    ) -> None:
        """`fetcher_client_factory` and `send_alter_partition` replace the network
        (tests): connections to leaders, and AlterPartition to the controller."""
        self.config = config
        self.node_id = config.node_id
        self.log_manager = log_manager
        self.image = image
        self.base_log_config = base_log_config
        self.partitions: dict[TopicPartition, Partition] = {}
        self.fetch_purgatory = Purgatory("fetch", max_size=config.max_delayed_operations)
        self.produce_purgatory = Purgatory("produce", max_size=config.max_delayed_operations)
        self._checkpointed_hws = dict(checkpointed_high_watermarks or {})
        self._flush_locks: dict[TopicPartition, asyncio.Lock] = {}
        self._timed_flush: set[TopicPartition] = set()  # partitions with flush.ms set
        self._checkpoint_lock = asyncio.Lock()
        # fsync and checkpoint writes; a few threads so one slow disk op does not
        # hold up the others.
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="broker-io")
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # built outside a loop (tests): start_background sets it
            self._loop = None
        self._controller: ControllerChannel | None = None
        self._own_channel: ControllerChannel | None = None  # until one is attached
        # How long an ISR change refused for stale state waits for the metadata log.
        self._refused_isr_timeout_ms = config.request_timeout_ms
        # After INELIGIBLE_REPLICA, the partition waits this long before proposing again.
        self._isr_retry_ms = max(
            config.replica_fetch_backoff_ms, min(1000, config.replica_lag_time_max_ms // 2)
        )
        self._isr_retry_after: dict[TopicPartition, int] = {}
        self.fetchers = FetcherManager(
            config,
            image,
            broker_epoch=self.broker_epoch,
            notify=self._notify,
            after_append=self._after_follower_append,
            client_factory=fetcher_client_factory,
        )
        self.alter_partitions = AlterPartitionManager(
            node_id=self.node_id,
            broker_epoch=self.broker_epoch,
            send=send_alter_partition or self._send_alter_partition,
        )
        # The data directory's failure once it went offline (log_dir_failure.py): from
        # then on no replica here is served, replicated, checkpointed or deleted.
        self.log_dir_failure: LogDirFailureError | None = None
        log_manager.dir_failure.add_listener(self._log_dir_failed)
        # Called after each leadership change of a partition here (became leader, or
        # stopped leading: follower, offline, deleted) with (partition, is_leader); the
        # offsets coordinator loads / drops its cache on them. Must not raise.
        self.leadership_listeners: list[Callable[[Partition, bool], None]] = []

    # ------------------------------------------------------------------ wiring

    def attach_controller(
        self, controller: ControllerChannel, *, faults: Faults = NO_FAULTS
    ) -> None:
        """Use the server's controller channel for our broker epoch and AlterPartition,
        and its test faults for the connections to leaders. Call it before the first
        metadata is published."""
        self._controller = controller
        self.fetchers.set_faults(faults)

    def broker_epoch(self) -> int:
        """Our broker epoch: the controller channel's, else the metadata image's record
        of our registration (the broker publishes only once it has seen it)."""
        if self._controller is not None:
            return self._controller.broker_epoch
        me = self.image.brokers.get(self.node_id)
        return me.broker_epoch if me is not None else -1

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

    # ------------------------------------------------------------------ log dir failure

    def _log_dir_failed(self, failure: LogDirFailureError) -> None:
        """LogDirFailureChannel listener; may run on a worker thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._take_replicas_offline, failure)

    def _take_replicas_offline(self, failure: LogDirFailureError) -> None:
        """The data directory failed: stop every replica here (appends, reads and
        replication), fail waiting requests, and ask the controller to fence this broker
        so that its leaderships move to the other ISR members (Kafka's handling of an
        offline log directory when it is the broker's only one)."""
        if self.log_dir_failure is not None:
            return
        self.log_dir_failure = failure
        leaders = [p.name for p in self.partitions.values() if p.is_leader]
        log.error(
            "log directory %s is offline: its %d replica(s) are no longer served "
            "(KAFKA_STORAGE_ERROR), leaderships of %s are given up; asking the controller "
            "to fence broker %d. Restart the broker once the disk is fixed.",
            failure.data_dir,
            len(self.partitions),
            ", ".join(leaders) or "no partition",
            self.node_id,
        )
        for p in self.partitions.values():
            was_leader = p.is_leader
            self.fetchers.remove_partition(p.tp)
            p.stop()
            self._notify(p.tp)
            if was_leader:
                self._leadership_changed(p, False)
        if self._controller is not None:
            self._controller.report_offline_log_dir(str(failure.data_dir), str(failure.cause))

    # ------------------------------------------------------------------ metadata

    async def apply_delta(self, delta: MetadataDelta) -> None:
        """Act on the part of a metadata delta that concerns this broker."""
        if self.log_dir_failure is not None:
            return  # nothing here can be led, followed or deleted until a restart
        changes = delta.local_changes(self.node_id)
        ts = mono_ms()
        for tp, topic_id in changes.deletes.items():
            # A replica of a newer topic with the same name is not the one to delete.
            if self._local_topic_id(tp) == topic_id:
                why = (
                    f"topic {delta.deleted_topics[topic_id]} (id {topic_id}) deleted"
                    if topic_id in delta.deleted_topics
                    else f"a partition record of topic id {topic_id} moved it off this broker"
                )
                await self._delete_replica(tp, reason=why)
        for tp, topic_id in changes.strays.items():
            if self._local_topic_id(tp) == topic_id:
                await self._set_aside_as_stray(
                    tp,
                    reason=f"topic id {topic_id} vanished from the cluster metadata (a "
                    "snapshot without it) and no deletion record names it",
                )
        for tp, state in changes.leaders.items():
            p = await self._get_or_create(state)
            if p is not None:
                # Stop fetching first: no fetched batch may land once we lead.
                self.fetchers.remove_partition(tp)
                p.make_leader(state, ts)
                self._isr_retry_after.pop(tp, None)
                self._notify(tp)
                self._leadership_changed(p, True)
        for tp, state in changes.followers.items():
            p = await self._get_or_create(state)
            if p is not None:
                was_leader = p.is_leader
                # A deposed leader's waiting produces fail with NOT_LEADER_OR_FOLLOWER
                # (the notify below); the fetcher reconciles by epoch before fetching.
                if p.make_follower(state) or was_leader:
                    self.fetchers.add_partition(p)
                self._notify(tp)
                self._leadership_changed(p, False)
        for tp, state in changes.offline.items():
            p = await self._get_or_create(state)
            if p is not None:
                self.fetchers.remove_partition(tp)
                p.make_offline(state)
                self._notify(tp)
                self._leadership_changed(p, False)
        if delta.brokers_changed:
            self.fetchers.on_brokers_changed()
        for topic, configs in delta.topic_configs.items():
            self._apply_topic_configs(topic, configs)

    async def handle_unassigned_logs(self) -> None:
        """After the first metadata catch-up (and `apply_delta` of the whole image): a
        local log the metadata does not assign here is deleted only if a
        RemoveTopicRecord named its topic id (a topic deleted while this broker was
        down); any other is set aside as stray, never deleted on that inference."""
        for log_ in list(self.log_manager.all_logs()):
            tp = log_.topic_partition
            if tp in self.partitions:
                continue
            topic_id = log_.topic_id
            if topic_id is not None and topic_id in self.image.deleted_topic_ids:
                name = self.image.deleted_topic_ids[topic_id]
                why = f"topic {name} (id {topic_id}) was deleted while this broker was down"
                await self._delete_replica(tp, reason=why)
            else:
                await self._set_aside_as_stray(tp, reason=self._why_unassigned(tp, topic_id))

    def _why_unassigned(self, tp: TopicPartition, topic_id: str | None) -> str:
        state = self.image.partition(*tp)
        if topic_id is None:
            assigned = "" if state is None else f" (it is on brokers {list(state.replicas)})"
            return (
                f"its directory records no topic id and the metadata assigns no partition "
                f"{tp[0]}-{tp[1]} to broker {self.node_id}{assigned}"
            )
        if state is not None and state.topic_id == topic_id:
            return f"partition of topic id {topic_id} is on brokers {list(state.replicas)}"
        if state is not None:
            return (
                f"topic {tp[0]} now has topic id {state.topic_id}; this replica belongs to "
                f"topic id {topic_id}, which the metadata does not know"
            )
        return f"the cluster metadata has no partition {tp[0]}-{tp[1]} of topic id {topic_id}"

    def _local_topic_id(self, tp: TopicPartition) -> str | None:
        """The topic id of the replica of `tp` here (None when there is none)."""
        p = self.partitions.get(tp)
        if p is not None:
            return p.topic_id
        log_ = self.log_manager.get_log(tp)
        return log_.topic_id if log_ is not None else None

    def _log_config_for(self, topic: str) -> LogConfig:
        info = self.image.topics_by_name.get(topic)
        configs = info.configs if info is not None else {}
        return LogConfig.from_topic_configs(configs, self.base_log_config)

    def _min_isr_for(self, topic: str) -> int:
        info = self.image.topics_by_name.get(topic)
        raw = info.configs.get(MIN_INSYNC_REPLICAS) if info is not None else None
        try:
            return max(1, int(raw)) if raw is not None else 1
        except ValueError:
            return 1

    async def _get_or_create(self, state: PartitionState) -> Partition | None:
        tp = state.tp
        p = self.partitions.get(tp)
        if p is not None and p.topic_id == state.topic_id:
            return p
        old_id = self._local_topic_id(tp)
        if old_id is not None and old_id != state.topic_id:
            # Same name, another topic id: the old replica's data must not leak into the
            # new topic. Deleted only if a RemoveTopicRecord named the old id.
            if old_id in self.image.deleted_topic_ids:
                await self._delete_replica(
                    tp, reason=f"topic id {old_id} was deleted; re-created as {state.topic_id}"
                )
            else:
                await self._set_aside_as_stray(
                    tp,
                    reason=f"topic {state.topic} now has topic id {state.topic_id}; this "
                    f"replica belongs to topic id {old_id}, which no deletion record names",
                )
        try:
            log_ = self.log_manager.get_or_create_log(tp, self._log_config_for(state.topic))
            # New, or written by a version without partition.metadata: from now on the
            # directory names its topic id (before any record of the topic lands).
            log_.assign_topic_id(state.topic_id)
        except (StorageError, OSError, ValueError) as exc:
            log.error("%s-%d: cannot open the log: %s", state.topic, state.partition, exc)
            return None
        hw = self._checkpointed_hws.pop(tp, 0)
        p = Partition(
            state.topic,
            state.partition,
            state.topic_id,
            log_,
            node_id=self.node_id,
            high_watermark=hw,
            min_insync_replicas=self._min_isr_for(state.topic),
            ignore_leader_epoch=self.config.unsafe_ignore_leader_epoch,
        )
        self.partitions[tp] = p
        if log_.config.flush_ms is not None:
            self._timed_flush.add(tp)
        return p

    def _apply_topic_configs(self, topic: str, configs: dict[str, str]) -> None:
        new_config = LogConfig.from_topic_configs(configs, self.base_log_config)
        min_isr = self._min_isr_for(topic)
        for p in self.partitions.values():
            if p.topic == topic:
                p.min_insync_replicas = min_isr
                if p.log.config != new_config:
                    p.log.update_config(new_config)
                if new_config.flush_ms is not None:
                    self._timed_flush.add(p.tp)
                else:
                    self._timed_flush.discard(p.tp)

    async def _stop_replica(self, tp: TopicPartition) -> None:
        """Take the replica of `tp` out of service (its log stays open)."""
        p = self.partitions.pop(tp, None)
        self._timed_flush.discard(tp)
        self.fetchers.remove_partition(tp)
        self._isr_retry_after.pop(tp, None)
        if p is not None:
            p.stop()
            self._notify(tp)
            self._leadership_changed(p, False)
        lock = self._flush_locks.pop(tp, None)
        if lock is not None:
            async with lock:  # a flush in a worker thread must finish first
                pass

    async def _set_aside_as_stray(self, tp: TopicPartition, *, reason: str) -> None:
        """Stop the replica and rename its directory aside (`-stray`), data kept."""
        await self._stop_replica(tp)
        if self.log_manager.get_log(tp) is None:
            return
        try:
            # The rename rewrites the recovery-point checkpoint: not while a worker
            # thread writes it too.
            async with self._checkpoint_lock:
                stray = self.log_manager.set_aside_as_stray(tp)
        except (StorageError, OSError) as exc:
            log.error("%s-%d: cannot set the replica aside as stray: %s", tp[0], tp[1], exc)
            return
        if stray is not None:
            log.warning(
                "%s-%d: stray replica (%s) set aside as %s, NOT deleted: %s",
                tp[0],
                tp[1],
                reason,
                stray.path,
                STRAY_ADVICE,
            )

    async def _delete_replica(self, tp: TopicPartition, *, reason: str) -> None:
        await self._stop_replica(tp)
        if self.log_manager.get_log(tp) is None:
            return
        log.info("%s-%d: deleting the replica (%s)", tp[0], tp[1], reason)
        try:
            # delete_log rewrites the recovery-point checkpoint: not while a worker
            # thread writes it too.
            async with self._checkpoint_lock:
                self.log_manager.delete_log(tp)
        except (StorageError, OSError) as exc:
            log.error("%s-%d: cannot delete the replica: %s", tp[0], tp[1], exc)

    def _leadership_changed(self, p: Partition, is_leader: bool) -> None:
        for listener in self.leadership_listeners:
            try:
                listener(p, is_leader)
            except Exception:
                log.exception("%s: a leadership listener failed", p.name)

    def _notify(self, tp: TopicPartition) -> None:
        self.fetch_purgatory.notify(tp)
        self.produce_purgatory.notify(tp)

    # ------------------------------------------------------------------ lookups

    def _current_leader(self, topic: str, index: int) -> LeaderIdAndEpoch:
        state = self.image.partition(topic, index)
        if state is None:
            return LeaderIdAndEpoch()
        return LeaderIdAndEpoch(leader_id=state.leader, leader_epoch=state.leader_epoch)

    def _lookup(self, topic: str, index: int) -> tuple[Partition | None, ErrorCode]:
        state = self.image.partition(topic, index)
        if self.log_dir_failure is not None and (
            (topic, index) in self.partitions or (state and self.node_id in state.replicas)
        ):
            # Kafka's answer for a replica in an offline log directory (retriable: the
            # client refreshes metadata and finds the partition's new leader).
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        p = self.partitions.get((topic, index))
        if p is not None and p.role is not Role.STOPPED:
            return p, ErrorCode.NONE
        if state is not None:
            # It exists, just not here: the client's metadata is stale.
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    # ------------------------------------------------------------------ produce

    async def produce(self, request: ProduceRequest) -> ProduceResponse:
        acks = request.acks
        topics_out: list[ProduceTopicResponse] = []
        waits: list[tuple[Partition, int, int]] = []
        pending: list[ProducePartitionResponse] = []
        flushes: list[Partition] = []
        for topic in request.topics:
            parts_out: list[ProducePartitionResponse] = []
            topics_out.append(ProduceTopicResponse(name=topic.name, partitions=parts_out))
            for part in topic.partitions:
                r = ProducePartitionResponse(index=part.index)
                parts_out.append(r)
                if acks not in (0, 1, -1):
                    r.error_code = ErrorCode.INVALID_REQUIRED_ACKS
                    r.error_message = f"acks must be 0, 1 or -1 (all), got {acks}"
                    continue
                p, err = self._lookup(topic.name, part.index)
                if p is None:
                    r.error_code = err
                    r.current_leader = self._current_leader(topic.name, part.index)
                    continue
                r.current_leader = p.current_leader
                err = p.check_leader_epoch(part.current_leader_epoch)
                if err != ErrorCode.NONE:
                    r.error_code = err
                    continue
                if acks == -1 and len(p.isr) < p.min_insync_replicas:
                    r.error_code = ErrorCode.NOT_ENOUGH_REPLICAS
                    r.error_message = (
                        f"ISR {list(p.isr)} is smaller than min.insync.replicas="
                        f"{p.min_insync_replicas}"
                    )
                    continue
                try:
                    info = p.append_as_leader(part.records)
                except InvalidRecordError as exc:
                    r.error_code = ErrorCode.INVALID_RECORD
                    r.error_message = str(exc)
                    log.info("%s: refused an invalid produce: %s", p.name, exc)
                    continue
                except (CorruptRecordError, InvalidAppendError, DecodeError) as exc:
                    r.error_code = ErrorCode.CORRUPT_MESSAGE
                    r.error_message = str(exc)
                    log.info("%s: refused a corrupt produce: %s", p.name, exc)
                    continue
                except RecordTooLargeError as exc:
                    r.error_code = ErrorCode.MESSAGE_TOO_LARGE
                    r.error_message = str(exc)
                    continue
                except ProducerStateError as exc:
                    r.error_code = exc.error_code
                    r.error_message = str(exc)
                    log.info("%s: refused an idempotent produce: %s", p.name, exc)
                    continue
                except StorageError as exc:
                    r.error_code = ErrorCode.KAFKA_STORAGE_ERROR
                    r.error_message = str(exc)
                    log.error("%s: append failed: %s", p.name, exc)
                    continue
                r.base_offset = info.first_offset
                r.log_append_time_ms = info.log_append_time
                r.log_start_offset = p.log_start_offset
                if info.duplicate:
                    log.debug("%s: duplicate batch answered with offset %d", p.name, r.base_offset)
                    # acks=all still waits until the original is committed (Kafka).
                    if acks == -1:
                        waits.append((p, info.last_offset + 1, p.leader_generation))
                        pending.append(r)
                    continue
                self._notify(p.tp)
                flush_messages = p.log.config.flush_messages
                if flush_messages is not None and p.log.unflushed_messages >= flush_messages:
                    flushes.append(p)
                if acks == -1:
                    waits.append((p, info.last_offset + 1, p.leader_generation))
                    pending.append(r)
        # flush.messages: as in Kafka, the append that crosses the threshold flushes
        # before it is acknowledged (in a worker thread, never on the loop).
        for p in flushes:
            await self.flush_partition(p)
        if waits:
            op = DelayedProduce(waits)
            await self.produce_purgatory.wait(op, max(0, request.timeout_ms) / 1000)
            op.try_complete()  # what was decided by now (nothing changes without a notify)
            for (p, required, _), r, outcome in zip(waits, pending, op.outcomes, strict=True):
                if outcome is None:
                    r.error_code = ErrorCode.REQUEST_TIMED_OUT
                    r.error_message = (
                        f"high watermark {p.high_watermark} did not reach {required} "
                        f"within {request.timeout_ms} ms"
                    )
                elif outcome == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
                    r.error_code = outcome
                    r.error_message = (
                        f"written, but the ISR {list(p.isr)} shrank below "
                        f"min.insync.replicas={p.min_insync_replicas}"
                    )
                elif outcome == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                    r.error_code = outcome
                    r.current_leader = self._current_leader(*p.tp)
        return ProduceResponse(topics=topics_out)

    # ------------------------------------------------------------------ fetch

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        to_leo = request.replica_id >= 0 or request.replica_id == DEBUGGING_REPLICA_ID
        responses, total, watches, answer_now = self._read_fetch(request, first=True)
        max_wait_ms = min(request.max_wait_ms, self.config.max_fetch_wait_ms)
        # Kafka's rule: never wait for more than the response may carry.
        min_bytes = min(request.min_bytes, fetch_response_max_bytes(self.config, request))
        if answer_now or total >= min_bytes or max_wait_ms <= 0 or not watches:
            return FetchResponse(responses=responses)
        op = DelayedFetch(watches, min_bytes=min_bytes, have_bytes=total, to_leo=to_leo)
        await self.fetch_purgatory.wait(op, max_wait_ms / 1000)
        responses, _, _, _ = self._read_fetch(request, first=False)
        return FetchResponse(responses=responses)

    def _read_fetch(
        self, request: FetchRequest, *, first: bool
    ) -> tuple[list[FetchTopicResponse], int, list[_FetchWatch], bool]:
        """One pass over the requested partitions: (responses, bytes read, what to
        watch if the fetch waits, whether it must answer now)."""
        replica_id = request.replica_id
        is_follower = replica_id >= 0
        to_leo = is_follower or replica_id == DEBUGGING_REPLICA_ID
        remaining = fetch_response_max_bytes(self.config, request)
        min_one = True  # the first partition with data returns at least one whole batch
        total = 0
        answer_now = False
        watches: list[_FetchWatch] = []
        ts = mono_ms()
        out: list[FetchTopicResponse] = []
        for topic in request.topics:
            parts: list[FetchPartitionResponse] = []
            out.append(FetchTopicResponse(topic=topic.topic, partitions=parts))
            for fp in topic.partitions:
                # Kafka lets a debugging consumer read any replica, not only the leader.
                r, p = self._fetch_partition_checks(
                    topic.topic, fp, require_leader=replica_id != DEBUGGING_REPLICA_ID
                )
                parts.append(r)
                if p is None:
                    answer_now = True
                    continue
                if is_follower and replica_id not in p.replicas:
                    # Only assigned replicas may read past the high watermark.
                    r.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    answer_now = True
                    continue
                if is_follower and first:
                    self._record_follower_fetch(p, replica_id, request.replica_epoch, fp, ts)
                r.high_watermark = p.high_watermark
                r.last_stable_offset = p.high_watermark
                max_offset = p.log_end_offset if to_leo else p.high_watermark
                limit = min(max(0, fp.partition_max_bytes), remaining)
                data = b""
                if fp.fetch_offset < max_offset and (limit > 0 or min_one):
                    try:
                        data = p.log.read(
                            fp.fetch_offset, limit, max_offset=max_offset, min_one_batch=min_one
                        )
                    except OffsetOutOfRangeError:
                        r.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                        r.log_start_offset = p.log_start_offset
                        answer_now = True
                        continue
                    except StorageError as exc:
                        log.error("%s: read at %d failed: %s", p.name, fp.fetch_offset, exc)
                        r.error_code = ErrorCode.KAFKA_STORAGE_ERROR
                        answer_now = True
                        continue
                if data:
                    r.records = data
                    total += len(data)
                    remaining = max(0, remaining - len(data))
                    min_one = False
                watches.append(_FetchWatch(p, fp.fetch_offset))
        return out, total, watches, answer_now

    def fetch_reservation(self, body: Message) -> int:
        """What a request may add to its connection's pending bytes beyond its own
        frame (protocol.connection.ServerConnection reserves it while it is served):
        a Fetch its record-data cap, others nothing worth counting in advance."""
        if isinstance(body, FetchRequest):
            return fetch_response_max_bytes(self.config, body)
        return 0

    def _fetch_partition_checks(
        self, topic: str, fp: FetchPartition, *, require_leader: bool = True
    ) -> tuple[FetchPartitionResponse, Partition | None]:
        r = FetchPartitionResponse(partition_index=fp.partition)
        p, err = self._lookup(topic, fp.partition)
        if p is None:
            r.error_code = err
            r.current_leader = self._current_leader(topic, fp.partition)
            return r, None
        r.current_leader = p.current_leader
        r.high_watermark = p.high_watermark
        r.last_stable_offset = p.high_watermark
        r.log_start_offset = p.log_start_offset
        err = p.check_leader_epoch(fp.current_leader_epoch, require_leader=require_leader)
        if err != ErrorCode.NONE:
            r.error_code = err
            return r, None
        leo = p.log_end_offset
        if fp.last_fetched_epoch != NO_EPOCH and fp.last_fetched_epoch >= 0:
            # Kafka's order (Partition.readRecords): an epoch we cannot place, or an
            # offset below our log start, is out of range whatever the epochs say.
            epoch, end_offset = p.log.epoch_cache.end_offset_for(fp.last_fetched_epoch, leo)
            if epoch == NO_EPOCH or end_offset < 0 or fp.fetch_offset < p.log_start_offset:
                r.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                return r, None
            if epoch < fp.last_fetched_epoch or end_offset < fp.fetch_offset:
                # KIP-320/595: the fetcher's log diverges from ours; it truncates to
                # this point (or reports LogTruncation) before fetching again.
                r.diverging_epoch = EpochEndOffset(epoch=epoch, end_offset=end_offset)
                return r, None
        if not p.log_start_offset <= fp.fetch_offset <= leo:
            r.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            return r, None
        return r, p

    # ------------------------------------------------------------------ ISR

    def _record_follower_fetch(
        self, p: Partition, replica_id: int, broker_epoch: int, fp: FetchPartition, ts: int
    ) -> None:
        """A follower's fetch passed the checks: its progress may move the high
        watermark (waking delayed produces) and let it join the ISR."""
        if p.update_follower_fetch_state(replica_id, broker_epoch, fp.fetch_offset, ts):
            self._notify(p.tp)
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

    # ------------------------------------------------------------------ offsets

    def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        to_leo = request.replica_id >= 0 or request.replica_id == DEBUGGING_REPLICA_ID
        topics_out: list[ListOffsetsTopicResponse] = []
        for topic in request.topics:
            parts: list[ListOffsetsPartitionResponse] = []
            topics_out.append(ListOffsetsTopicResponse(name=topic.name, partitions=parts))
            for lp in topic.partitions:
                r = ListOffsetsPartitionResponse(partition_index=lp.partition_index)
                parts.append(r)
                p, err = self._lookup(topic.name, lp.partition_index)
                if p is None:
                    r.error_code = err
                    continue
                err = p.check_leader_epoch(lp.current_leader_epoch)
                if err != ErrorCode.NONE:
                    r.error_code = err
                    continue
                ts = lp.timestamp
                # Kafka's fetchOffsetForTimestamp: for consumers, a new leader whose
                # HW lags its epoch start has no "latest" to give (it would go back),
                # nor a timestamp answer at or past its HW; earliest is served.
                lagging = not to_leo and p.high_watermark_behind_epoch_start
                if ts == EARLIEST_TIMESTAMP:
                    r.offset = p.log_start_offset
                    epoch = p.log.epoch_cache.epoch_for_offset(r.offset)
                    r.leader_epoch = epoch if epoch is not None else -1
                elif ts == LATEST_TIMESTAMP:
                    if lagging:
                        r.error_code = ErrorCode.OFFSET_NOT_AVAILABLE
                        continue
                    r.offset = p.log_end_offset if to_leo else p.high_watermark
                    r.leader_epoch = p.leader_epoch
                elif ts >= 0:
                    found = p.log.offset_for_timestamp(ts)
                    limit = p.log_end_offset if to_leo else p.high_watermark
                    if found is not None and found[0] < limit:
                        r.offset, r.timestamp, r.leader_epoch = found[0], found[1], found[2]
                    elif lagging:
                        r.error_code = ErrorCode.OFFSET_NOT_AVAILABLE
                else:
                    r.error_code = ErrorCode.INVALID_REQUEST
        return ListOffsetsResponse(topics=topics_out)

    def offsets_for_leader_epoch(
        self, request: OffsetForLeaderEpochRequest
    ) -> OffsetForLeaderEpochResponse:
        topics_out: list[OffsetForLeaderTopicResult] = []
        for topic in request.topics:
            parts: list[EpochEndOffsetResult] = []
            topics_out.append(OffsetForLeaderTopicResult(topic=topic.topic, partitions=parts))
            for op in topic.partitions:
                r = EpochEndOffsetResult(partition=op.partition)
                parts.append(r)
                p, err = self._lookup(topic.topic, op.partition)
                if p is None:
                    r.error_code = err
                    continue
                err = p.check_leader_epoch(op.current_leader_epoch)
                if err != ErrorCode.NONE:
                    r.error_code = err
                    continue
                r.leader_epoch, r.end_offset = p.log.epoch_cache.end_offset_for(
                    op.leader_epoch, p.log_end_offset
                )
        return OffsetForLeaderEpochResponse(topics=topics_out)

    # ------------------------------------------------------------------ background

    def start_background(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.fetchers.start()
        self.alter_partitions.start()
        self._tasks = [
            asyncio.create_task(
                self._every(max(1, self.config.replica_lag_time_max_ms // 2), self._check_isr)
            ),
            asyncio.create_task(
                self._every(self.config.hw_checkpoint_interval_ms, self.checkpoint)
            ),
            asyncio.create_task(
                self._every(self.config.flush_check_interval_ms, self._flush_by_time)
            ),
            asyncio.create_task(
                self._every(self.config.retention_check_interval_ms, self._retention)
            ),
        ]

    async def _every(self, interval_ms: int, job: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            if self.log_dir_failure is not None:
                continue  # nothing to check, flush, checkpoint or delete any more
            try:
                result = job()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except LogDirFailureError:
                pass  # the directory went offline: announced once, where it failed
            except Exception:
                log.exception("background job %s failed", getattr(job, "__name__", job))

    async def checkpoint(self) -> None:
        """High watermarks, recovery points and log start offsets, written in a worker
        thread (each file is replaced atomically with an fsync)."""
        async with self._checkpoint_lock:
            hws = {
                tp: p.high_watermark
                for tp, p in self.partitions.items()
                if p.role is not Role.STOPPED
            }
            # Partitions not opened yet keep their last checkpointed value.
            for tp, hw in self._checkpointed_hws.items():
                hws.setdefault(tp, hw)
            await off_loop(self._executor, self.log_manager.checkpoint_high_watermarks, hws)
            await off_loop(
                self._executor, self.log_manager.checkpoint_recovery_points_and_log_starts
            )

    async def flush_partition(self, p: Partition) -> None:
        lock = self._flush_locks.setdefault(p.tp, asyncio.Lock())
        async with lock:
            if p.role is Role.STOPPED:
                return
            target = p.log_end_offset
            if p.log.recovery_point >= target:
                return  # a concurrent flush already covered it
            await off_loop(self._executor, p.log.flush, target)

    async def _after_follower_append(self, p: Partition) -> None:
        """flush.messages holds on followers too (Kafka flushes on any append)."""
        flush_messages = p.log.config.flush_messages
        if flush_messages is not None and p.log.unflushed_messages >= flush_messages:
            # Shielded: a fetcher stopped meanwhile must not release the flush lock
            # while the fsync still runs in its thread.
            await asyncio.shield(self.flush_partition(p))

    async def _flush_by_time(self) -> None:
        ts = now_ms()
        # Most topics have no flush.ms: look only at those that do.
        for tp in list(self._timed_flush):
            p = self.partitions.get(tp)
            flush_ms = p.log.config.flush_ms if p is not None else None
            if p is None or flush_ms is None or p.role is Role.STOPPED:
                continue
            if p.log.unflushed_messages > 0 and ts - p.log.last_flush_ms >= flush_ms:
                await self.flush_partition(p)

    def _retention(self) -> None:
        ts = now_ms()
        for p in list(self.partitions.values()):
            if p.role is Role.STOPPED:
                continue
            before = p.log_start_offset
            try:
                p.log.delete_old_segments(high_watermark=p.high_watermark, now_ms=ts)
            except (StorageError, OSError) as exc:
                log.error("%s: retention failed: %s", p.name, exc)
                continue
            if p.log_start_offset != before:
                p.on_log_start_moved()
                log.info(
                    "%s: retention moved the log start offset %d -> %d",
                    p.name,
                    before,
                    p.log_start_offset,
                )
                self._notify(p.tp)

    async def shutdown(self) -> None:
        """Release waiting requests, stop background jobs, write the checkpoints."""
        if self._closed:
            return
        self._closed = True
        # Replication stops first, so no fetched batch lands during the checkpoints.
        await self.fetchers.shutdown()
        await self.alter_partitions.close()
        if self._own_channel is not None:
            await self._own_channel.close()
        self.fetch_purgatory.close()
        self.produce_purgatory.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for lock in list(self._flush_locks.values()):
            async with lock:
                pass
        if self.log_dir_failure is None:
            try:
                await self.checkpoint()
            except (StorageError, OSError) as exc:
                log.error("final checkpoint failed: %s", exc)
        self._executor.shutdown(wait=True)
