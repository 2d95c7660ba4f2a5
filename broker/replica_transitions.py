"""Replica transitions from metadata: apply the local part of each delta (lead, follow,
go offline, stop; delete only when a record names the replica's topic id, otherwise
set it aside as stray), topic configs, and a log directory's failure."""

from __future__ import annotations

import asyncio
import time

from broker.delayed_requests import log
from broker.delayed_requests import mono_ms
from broker.metadata_image import MetadataDelta
from broker.metadata_image import PartitionState
from broker.metadata_image import TopicPartition
from broker.partition import MIN_INSYNC_REPLICAS
from broker.partition import Partition
from broker.storage.errors import LogDirFailureError
from broker.storage.errors import StorageError
from broker.storage.log import LogConfig
from broker.storage.log_manager import STRAY_ADVICE
from protocol.metadata_records import NO_LEADER

# A replica whose log could not be created or opened (EMFILE, a full disk) is tried
# again after the first backoff, doubling up to the second (ms): it comes back once
# descriptors are free without a broker restart, and costs little while they are not.
REPLICA_RETRY_BACKOFF_MS = (200, 5_000)

# A delta may move thousands of partitions (a topic of 10,000 created, the leaderships
# of a fenced broker): the loop is handed back this often meanwhile, so heartbeats and
# requests keep flowing. Held for longer than the session timeout, the broker would be
# fenced and its partitions moved, which brings another such delta.
_LOOP_SHARE_S = 0.01


class _LoopShare:
    def __init__(self) -> None:
        self._since = time.monotonic()

    async def turn(self) -> None:
        """Yield to the loop if this delta has held it for _LOOP_SHARE_S."""
        if time.monotonic() - self._since >= _LOOP_SHARE_S:
            await asyncio.sleep(0)
            self._since = time.monotonic()


class ReplicaTransitions:
    """Replica transitions from metadata: apply the local part of each delta (lead, follow,"""

    async def apply_delta(self, delta: MetadataDelta) -> None:
        """Act on the part of a metadata delta that concerns this broker."""
        if self.log_dir_failure is not None:
            return  # nothing here can be led, followed or deleted until a restart
        changes = delta.local_changes(self.node_id)
        share = _LoopShare()
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
        # The new replicas' directories first, made durable by one fsync for the whole
        # delta, before any of them leads or follows.
        created = False
        for states in (changes.leaders, changes.followers, changes.offline):
            for state in states.values():
                if state.tp not in self.partitions:
                    config = self._log_config_for(state.topic)
                    created |= self.log_manager.prepare_new_log(state.tp, config)
                    await share.turn()
        if created:
            try:
                self.log_manager.sync_new_logs()
            except StorageError as exc:  # each replica's creation tries again, and says
                log.warning("new replicas: %s", exc)
        for states in (changes.leaders, changes.followers, changes.offline):
            for state in states.values():
                await self._take_role(state)
                await share.turn()
        if delta.brokers_changed:
            self.fetchers.on_brokers_changed()
        for topic, configs in delta.topic_configs.items():
            self._apply_topic_configs(topic, configs)

    async def _take_role(self, state: PartitionState) -> None:
        """Lead, follow or go offline as `state` says for this broker; a replica whose
        log cannot be created or opened (out of descriptors, say) is retried later."""
        tp = state.tp
        p = await self._get_or_create(state)
        if p is None:
            return
        if state.leader == self.node_id:
            # Stop fetching first: no fetched batch may land once we lead.
            self.fetchers.remove_partition(tp)
            # Now, not when the delta began: creating its replicas can take longer
            # than replica.lag.time.max.ms, and the ISR's followers get a full lag
            # window from the moment we lead (Kafka's makeLeader).
            p.make_leader(state, mono_ms())
            self._isr_retry_after.pop(tp, None)
            self._notify(tp)
            self._leadership_changed(p, True)
        elif state.leader == NO_LEADER:
            self.fetchers.remove_partition(tp)
            p.make_offline(state)
            self._notify(tp)
            self._leadership_changed(p, False)
        else:
            was_leader = p.is_leader
            # A deposed leader's waiting produces fail with NOT_LEADER_OR_FOLLOWER
            # (the notify below); the fetcher reconciles by epoch before fetching.
            if p.make_follower(state) or was_leader:
                self.fetchers.add_partition(p)
            self._notify(tp)
            self._leadership_changed(p, False)

    async def retry_failed_replicas(self) -> None:
        """Create again the replicas whose log could not be created or opened, once
        their backoff is over, as the metadata now assigns them (background job)."""
        if not self._failed_replicas:
            return
        ts = mono_ms()
        share = _LoopShare()
        for tp, (retry_at, _) in list(self._failed_replicas.items()):
            if retry_at > ts:
                continue
            state = self.image.partition(*tp)
            if state is None or self.node_id not in state.replicas or tp in self.partitions:
                self._failed_replicas.pop(tp, None)  # moved away, deleted, or back
                continue
            await self._take_role(state)
            await share.turn()

    def _replica_failed(self, tp: TopicPartition) -> None:
        """Back off before the next try: doubling from the first, at most the last."""
        _, backoff = self._failed_replicas.get(tp, (0, REPLICA_RETRY_BACKOFF_MS[0] // 2))
        backoff = min(backoff * 2, REPLICA_RETRY_BACKOFF_MS[1])
        self._failed_replicas[tp] = (mono_ms() + backoff, backoff)

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
        except (StorageError, OSError) as exc:
            log.error(
                "%s-%d: cannot open the log (tried again later): %s",
                state.topic,
                state.partition,
                exc,
            )
            self._replica_failed(tp)
            return None
        except ValueError as exc:  # an illegal name: no retry makes it legal
            log.error("%s-%d: cannot open the log: %s", state.topic, state.partition, exc)
            return None
        self._failed_replicas.pop(tp, None)
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
