"""The broker's view of the cluster: the controller's metadata log replayed.

`MetadataImage.apply(entries, is_snapshot=...)` applies a FetchMetadata answer and
returns a `MetadataDelta`: which partitions changed (new state), which disappeared,
which topics a RemoveTopicRecord deleted, which topics changed configs, whether
brokers changed. `MetadataDelta.local_changes` turns that into what this broker must
do: lead, follow, delete a replica, or set one aside as stray.

A snapshot answer replaces the whole image; its delta is the difference between the
old and the new image.

Nothing is deleted on an inference (`local_changes`): a replica is deleted only when
a RemoveTopicRecord names its topic id, or when a PartitionRecord of the same topic id
takes this broker out of the partition's replica set (Kafka's TopicDelta rule, ready
for reassignment; the controller never moves replicas today). A replica that merely
disappeared (a snapshot without its topic, e.g. from a controller whose metadata was
restored from an older backup) is set aside as stray, never deleted: unlike Kafka,
which reads a topic missing from a snapshot as deleted.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.messages import MetadataEntry
from protocol.metadata_records import (
    LEADER_RECOVERED,
    NO_LEADER,
    FenceBrokerRecord,
    ListenerInfo,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

# Topic ids of RemoveTopicRecords remembered for the start-up pass over local logs
# (broker/replica_manager.py). Forgetting the oldest is safe: a leftover replica of a
# forgotten deletion is then set aside as stray instead of deleted.
MAX_REMEMBERED_DELETIONS = 10_000


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: int
    broker_epoch: int
    incarnation_id: str
    listeners: tuple[ListenerInfo, ...]
    rack: str | None
    fenced: bool

    def listener(self, name: str) -> ListenerInfo | None:
        for item in self.listeners:
            if item.name == name:
                return item
        return None


@dataclass(frozen=True)
class PartitionState:
    """One partition as the controller last described it."""

    topic: str
    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    leader_recovery_state: int = LEADER_RECOVERED

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass
class TopicInfo:
    name: str
    topic_id: str
    configs: dict[str, str]
    partitions: dict[int, PartitionState] = field(default_factory=dict)


@dataclass
class LocalChanges:
    """What this broker must do after a delta."""

    leaders: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    followers: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    # Replicas this broker holds but that have no leader now (leader == -1).
    offline: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    # tp -> topic_id of the replica to stop and delete (an explicit record said so).
    deletes: dict[TopicPartition, str] = field(default_factory=dict)
    # tp -> topic_id of the replica to stop and set aside as stray (it vanished from
    # the metadata without a record saying so).
    strays: dict[TopicPartition, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.leaders or self.followers or self.offline or self.deletes or self.strays)


@dataclass
class MetadataDelta:
    # New state of every partition that changed (or appeared).
    changed: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    # Partitions that no longer exist: tp -> old state.
    removed: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    # State before the delta of every partition in `changed` or `removed` (None: new).
    previous: dict[TopicPartition, PartitionState | None] = field(default_factory=dict)
    # Topics a RemoveTopicRecord in this delta deleted: topic id -> name.
    deleted_topics: dict[str, str] = field(default_factory=dict)
    # Topics whose configs changed (or that are new): name -> configs.
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    brokers_changed: bool = False
    is_snapshot: bool = False

    def local_changes(self, node_id: int) -> LocalChanges:
        """What `node_id` must do; see the module doc for when a replica is deleted."""
        out = LocalChanges()
        for tp, old in self.removed.items():
            if node_id not in old.replicas:
                continue
            if old.topic_id in self.deleted_topics:
                out.deletes[tp] = old.topic_id
            else:
                out.strays[tp] = old.topic_id
        for tp, state in self.changed.items():
            if state.leader == node_id:
                out.leaders[tp] = state
            elif node_id in state.replicas:
                if state.leader == NO_LEADER:
                    out.offline[tp] = state
                else:
                    out.followers[tp] = state
            else:
                old = self.previous.get(tp)
                if old is None or old.topic_id != state.topic_id or node_id not in old.replicas:
                    continue  # never ours: a local directory of that name is not judged here
                if self.is_snapshot:
                    out.strays[tp] = state.topic_id
                else:
                    out.deletes[tp] = state.topic_id  # a PartitionRecord moved it away
        return out


class MetadataImage:
    """Mutable image; one instance per broker, updated in place by `apply`."""

    def __init__(self) -> None:
        self.offset = -1  # offset of the last record applied
        self.cluster_id: str | None = None
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics_by_id: dict[str, TopicInfo] = {}
        self.topics_by_name: dict[str, TopicInfo] = {}
        # Topic ids deleted by a RemoveTopicRecord this image applied, oldest first
        # (at most MAX_REMEMBERED_DELETIONS): id -> name.
        self.deleted_topic_ids: OrderedDict[str, str] = OrderedDict()

    # ------------------------------------------------------------------ queries

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        info = self.topics_by_name.get(topic)
        if info is None:
            return None
        return info.partitions.get(partition)

    def partitions(self) -> Iterable[PartitionState]:
        for info in self.topics_by_id.values():
            yield from info.partitions.values()

    def live_brokers(self) -> list[BrokerInfo]:
        return sorted((b for b in self.brokers.values() if not b.fenced), key=lambda b: b.broker_id)

    # ------------------------------------------------------------------ updates

    def apply(
        self,
        entries: list[MetadataEntry],
        *,
        is_snapshot: bool = False,
        next_offset: int | None = None,
    ) -> MetadataDelta:
        """Apply a FetchMetadata answer. A snapshot describes the whole state as of
        `next_offset - 1` (every entry carries that offset)."""
        if is_snapshot:
            delta = self._apply_snapshot(entries)
            if next_offset is not None:
                self.offset = next_offset - 1
            return delta
        before: dict[TopicPartition, PartitionState | None] = {}
        delta = MetadataDelta()
        for entry in entries:
            if entry.offset <= self.offset:
                continue  # a retried fetch may repeat entries
            self._apply_one(entry.record, before, delta)
            self.offset = entry.offset
        self._finish(before, delta)
        return delta

    def _apply_snapshot(self, entries: list[MetadataEntry]) -> MetadataDelta:
        old_states = {p.tp: p for p in self.partitions()}
        old_configs = {t.name: t.configs for t in self.topics_by_id.values()}
        self.brokers.clear()
        self.topics_by_id.clear()
        self.topics_by_name.clear()
        scratch = MetadataDelta()
        before: dict[TopicPartition, PartitionState | None] = {}
        for entry in entries:
            self._apply_one(entry.record, before, scratch)
            self.offset = entry.offset
        delta = MetadataDelta(brokers_changed=True, is_snapshot=True)
        new_states = {p.tp: p for p in self.partitions()}
        for tp, old in old_states.items():
            new = new_states.get(tp)
            if new is None or new.topic_id != old.topic_id:
                delta.removed[tp] = old
                delta.previous[tp] = old
        for tp, new in new_states.items():
            if old_states.get(tp) != new:
                delta.changed[tp] = new
                delta.previous[tp] = old_states.get(tp)
        for info in self.topics_by_id.values():
            if old_configs.get(info.name) != info.configs:
                delta.topic_configs[info.name] = dict(info.configs)
        return delta

    def _apply_one(
        self,
        record: object,
        before: dict[TopicPartition, PartitionState | None],
        delta: MetadataDelta,
    ) -> None:
        if isinstance(record, PartitionRecord):
            topic = self.topics_by_id.get(record.topic_id)
            if topic is None:
                log.warning(
                    "partition record for unknown topic id %s partition %d ignored",
                    record.topic_id,
                    record.partition_id,
                )
                return
            old = topic.partitions.get(record.partition_id)
            state = PartitionState(
                topic=topic.name,
                topic_id=topic.topic_id,
                partition=record.partition_id,
                replicas=tuple(record.replicas),
                isr=tuple(record.isr),
                leader=record.leader,
                leader_epoch=record.leader_epoch,
                partition_epoch=record.partition_epoch,
                leader_recovery_state=record.leader_recovery_state,
            )
            if old is not None:
                # The controller's invariants; a violation means a corrupt metadata log.
                assert state.leader_epoch >= old.leader_epoch, (old, state)
                assert state.partition_epoch >= old.partition_epoch, (old, state)
            before.setdefault(state.tp, old)
            topic.partitions[record.partition_id] = state
        elif isinstance(record, TopicRecord):
            existing = self.topics_by_id.get(record.topic_id)
            if existing is not None:
                existing.configs = dict(record.configs)
            else:
                stale = self.topics_by_name.get(record.name)
                if stale is not None:  # a name reused without a RemoveTopicRecord
                    self._remove_topic(stale, before)
                existing = TopicInfo(record.name, record.topic_id, dict(record.configs))
                self.topics_by_id[record.topic_id] = existing
                self.topics_by_name[record.name] = existing
            delta.topic_configs[record.name] = dict(record.configs)
        elif isinstance(record, RemoveTopicRecord):
            info = self.topics_by_id.get(record.topic_id)
            if info is not None:
                self._remove_topic(info, before)
                delta.topic_configs.pop(info.name, None)
                delta.deleted_topics[record.topic_id] = info.name
                self._remember_deletion(record.topic_id, info.name)
        elif isinstance(record, RegisterBrokerRecord):
            self.brokers[record.broker_id] = BrokerInfo(
                broker_id=record.broker_id,
                broker_epoch=record.broker_epoch,
                incarnation_id=record.incarnation_id,
                listeners=tuple(record.listeners),
                rack=record.rack,
                fenced=record.fenced,
            )
            delta.brokers_changed = True
        elif isinstance(record, FenceBrokerRecord | UnfenceBrokerRecord):
            broker = self.brokers.get(record.broker_id)
            fenced = isinstance(record, FenceBrokerRecord)
            if broker is not None and broker.broker_epoch == record.broker_epoch:
                self.brokers[record.broker_id] = BrokerInfo(
                    broker.broker_id,
                    broker.broker_epoch,
                    broker.incarnation_id,
                    broker.listeners,
                    broker.rack,
                    fenced,
                )
                delta.brokers_changed = True
        elif isinstance(record, ProducerIdsRecord):
            pass  # the controller's bookkeeping: blocks are fetched by AllocateProducerIds
        else:
            log.warning("unknown metadata record %s ignored", type(record).__name__)

    def _remember_deletion(self, topic_id: str, name: str) -> None:
        self.deleted_topic_ids[topic_id] = name
        while len(self.deleted_topic_ids) > MAX_REMEMBERED_DELETIONS:
            self.deleted_topic_ids.popitem(last=False)

    def _remove_topic(
        self, info: TopicInfo, before: dict[TopicPartition, PartitionState | None]
    ) -> None:
        for state in info.partitions.values():
            before.setdefault(state.tp, state)
        del self.topics_by_id[info.topic_id]
        if self.topics_by_name.get(info.name) is info:
            del self.topics_by_name[info.name]

    def _finish(
        self, before: dict[TopicPartition, PartitionState | None], delta: MetadataDelta
    ) -> None:
        for tp, old in before.items():
            new = self.partition(*tp)
            if old is not None and (new is None or new.topic_id != old.topic_id):
                delta.removed[tp] = old
                delta.previous[tp] = old
            if new is not None and new != old:
                delta.changed[tp] = new
                delta.previous[tp] = old
