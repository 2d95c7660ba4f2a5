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

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field

from protocol.messages import MetadataEntry
from protocol.metadata_records import LEADER_RECOVERED
from protocol.metadata_records import NO_LEADER
from protocol.metadata_records import PartitionRecord
from runtime.metadata_image import BrokerInfo
from runtime.metadata_image import MetadataImage as SharedImage
from runtime.metadata_image import TopicImage

__all__ = [
    "MAX_REMEMBERED_DELETIONS",
    "BrokerInfo",
    "LocalChanges",
    "MetadataDelta",
    "MetadataImage",
    "PartitionState",
    "TopicInfo",
    "TopicPartition",
]

TopicPartition = tuple[str, int]

# Topic ids of RemoveTopicRecords remembered for the start-up pass over local logs
# (broker/replica_manager.py). Forgetting the oldest is safe: a leftover replica of a
# forgotten deletion is then set aside as stray instead of deleted.
MAX_REMEMBERED_DELETIONS = 10_000


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


TopicInfo = TopicImage[PartitionState]


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


class MetadataImage(SharedImage[PartitionState]):
    """Mutable image; one instance per broker, updated in place by `apply`."""

    def __init__(self) -> None:
        super().__init__()
        self.cluster_id: str | None = None
        # Topic ids deleted by a RemoveTopicRecord this image applied, oldest first
        # (at most MAX_REMEMBERED_DELETIONS): id -> name.
        self.deleted_topic_ids: OrderedDict[str, str] = OrderedDict()
        # While `apply` runs: the state before of every partition touched, and the delta.
        self._before: dict[TopicPartition, PartitionState | None] = {}
        self._delta = MetadataDelta()

    @property
    def offset(self) -> int:
        """Offset of the last record applied."""
        return self.last_offset

    @offset.setter
    def offset(self, value: int) -> None:
        self.last_offset = value

    @property
    def topics_by_id(self) -> dict[str, TopicInfo]:
        return self.topics

    # ------------------------------------------------------------------ queries

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        info = self.topics_by_name.get(topic)
        if info is None:
            return None
        return info.partitions.get(partition)

    def partitions(self) -> Iterator[PartitionState]:
        for info in self.topics.values():
            yield from info.partitions.values()

    # ------------------------------------------------------------------ the shared replay's hooks

    def partition_view(self, topic: TopicInfo, record: PartitionRecord) -> PartitionState:
        return PartitionState(
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

    def _on_partition(
        self, topic: TopicInfo, partition_id: int, old: PartitionState | None
    ) -> None:
        self._before.setdefault((topic.name, partition_id), old)

    def _on_topic_configs(self, topic: TopicInfo) -> None:
        self._delta.topic_configs[topic.name] = dict(topic.configs)

    def _on_topic_deleted(self, topic: TopicInfo) -> None:
        self._delta.topic_configs.pop(topic.name, None)
        self._delta.deleted_topics[topic.topic_id] = topic.name
        self.deleted_topic_ids[topic.topic_id] = topic.name
        while len(self.deleted_topic_ids) > MAX_REMEMBERED_DELETIONS:
            self.deleted_topic_ids.popitem(last=False)

    def _on_brokers(self) -> None:
        self._delta.brokers_changed = True

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
        self._before, self._delta = {}, MetadataDelta()
        for entry in entries:
            if entry.offset <= self.offset:
                continue  # a retried fetch may repeat entries
            self.replay(entry.record)
            self.offset = entry.offset
        self._finish(self._before, self._delta)
        return self._delta

    def _apply_snapshot(self, entries: list[MetadataEntry]) -> MetadataDelta:
        old_states = {p.tp: p for p in self.partitions()}
        old_configs = {t.name: t.configs for t in self.topics.values()}
        self.clear()
        # The records' own changes are not the delta: the difference of the images is.
        self._before, self._delta = {}, MetadataDelta()
        for entry in entries:
            self.replay(entry.record)
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
        for info in self.topics.values():
            if old_configs.get(info.name) != info.configs:
                delta.topic_configs[info.name] = dict(info.configs)
        return delta

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
