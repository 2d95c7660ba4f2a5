"""The controller's metadata image: the shared image (runtime/metadata_image.py) with
the controller's stricter checks on top.

Built only by applying metadata records in offset order, so the image after a replay
(snapshot + log) is the image the live controller had: there is no other way to
change it. Records are never mutated once applied; a change is a new record. Where
a broker's image reads a record leniently (a TopicRecord for a known topic, a
RemoveTopicRecord or fencing for what is not there), the controller refuses it: it
checks every record before it writes it (`check`), so its log never holds one.
"""

from __future__ import annotations

from controller.epochs import broker_epoch_at
from controller.topic_validation import collision_key
from protocol.invariants import invariant
from protocol.metadata_records import ClientQuotaRecord
from protocol.metadata_records import FenceBrokerRecord
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import QuotaEntityData
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import RemoveTopicRecord
from protocol.metadata_records import TopicRecord
from protocol.metadata_records import UnfenceBrokerRecord
from runtime.client_quotas import entity_order
from runtime.metadata_image import BrokerInfo
from runtime.metadata_image import MetadataImage as SharedImage
from runtime.metadata_image import TopicImage

__all__ = ["BrokerInfo", "MetadataImage", "TopicImage"]


class MetadataImage(SharedImage[PartitionRecord]):
    """Brokers, topics and partitions (as their PartitionRecords) as of `last_offset`."""

    def __init__(self) -> None:
        super().__init__()
        # collision key -> the topics under it (Kafka's topicsWithCollisionChars), so a
        # CreateTopics checks its names without a pass over every topic. One name per
        # key unless a log written before collisions were refused holds more. Values
        # are replaced, never changed in place: a dry run undoes dict writes only.
        self.topics_by_collision_key: dict[str, frozenset[str]] = {}

    def colliding_topic(self, name: str) -> str | None:
        """An existing topic other than `name` whose name differs from it only by
        '.' against '_', if any."""
        key = collision_key(name)
        others = sorted(self.topics_by_collision_key.get(key, ())) if key else []
        return next((other for other in others if other != name), None)

    def clear(self) -> None:
        super().clear()
        self.topics_by_collision_key.clear()

    def _on_topic_configs(self, topic: TopicImage[PartitionRecord]) -> None:
        key = collision_key(topic.name)
        if key is not None:
            names = self.topics_by_collision_key.get(key, frozenset())
            self._set(self.topics_by_collision_key, key, names | {topic.name})

    def _on_topic_deleted(self, topic: TopicImage[PartitionRecord]) -> None:
        key = collision_key(topic.name)
        if key is None:
            return
        names = self.topics_by_collision_key.get(key, frozenset()) - {topic.name}
        if names:
            self._set(self.topics_by_collision_key, key, names)
        else:
            self._delete(self.topics_by_collision_key, key)

    @property
    def topic_ids(self) -> dict[str, str]:
        """Topic name -> topic id."""
        return {name: topic.topic_id for name, topic in self.topics_by_name.items()}

    def partition_view(
        self, topic: TopicImage[PartitionRecord], record: PartitionRecord
    ) -> PartitionRecord:
        return record

    def snapshot_records(self) -> list[MetadataRecord]:
        """The whole image as records; replaying them into an empty image rebuilds it."""
        out: list[MetadataRecord] = [self.brokers[b].to_record() for b in sorted(self.brokers)]
        for topic in sorted(self.topics.values(), key=lambda t: t.name):
            out.append(
                TopicRecord(name=topic.name, topic_id=topic.topic_id, configs=dict(topic.configs))
            )
            out.extend(topic.partitions[p] for p in sorted(topic.partitions))
        last = self.producer_ids.get("last")
        if last is not None:
            out.append(last)
        out.extend(self.scram_credentials[k] for k in sorted(self.scram_credentials))
        out.extend(self.acls[i].to_record(i) for i in sorted(self.acls))
        for entity in sorted(self.client_quotas, key=entity_order):
            parts = [QuotaEntityData(entity_type=t, entity_name=n) for t, n in entity]
            for key, value in sorted(self.client_quotas[entity].items()):
                out.append(ClientQuotaRecord(entity=parts, key=key, value=value))
        return out

    def apply(self, offset: int, record: MetadataRecord) -> None:
        """Apply a record appended at `offset` (offsets strictly increase)."""
        invariant(
            offset > self.last_offset,
            lambda: f"metadata offsets must increase: {offset} after {self.last_offset}",
        )
        self._validate(record, offset)
        self.replay(record)
        self.last_offset = offset

    def check(self, base_offset: int, records: list[MetadataRecord]) -> None:
        """Raise InvariantViolation if applying `records` at `base_offset`, ... would
        break an invariant. Leaves the image as it was: the controller calls it before
        writing, so a bad record is refused instead of persisted."""
        saved_offset = self.last_offset
        self.journal()
        try:
            for i, record in enumerate(records):
                self.apply(base_offset + i, record)
        finally:
            self.undo()
            self.last_offset = saved_offset

    def load_snapshot(self, last_offset: int, records: list[MetadataRecord]) -> None:
        """Rebuild from a snapshot: the image as of `last_offset`, as records."""
        invariant(
            self.last_offset == -1
            and not self.brokers
            and not self.topics
            and not self.producer_ids,
            "a snapshot loads into an empty image",
        )
        for record in records:
            self._validate(record, None)
            self.replay(record)
        self.last_offset = last_offset

    def _validate(self, record: MetadataRecord, offset: int | None) -> None:
        """The controller's checks beyond the shared replay's. `offset` is None while
        loading a snapshot: records then describe state, they were not appended at a
        position of their own."""
        if isinstance(record, RegisterBrokerRecord):
            invariant(
                offset is None or record.broker_epoch == broker_epoch_at(offset),
                lambda: (
                    f"broker {record.broker_id}: epoch {record.broker_epoch} is not the "
                    f"offset {offset} of its registration"
                ),
            )
            previous = self.brokers.get(record.broker_id)
            invariant(
                previous is None or record.broker_epoch > previous.broker_epoch,
                lambda: (
                    f"broker {record.broker_id}: epoch {record.broker_epoch} does not "
                    f"increase past {previous.broker_epoch if previous else None}"
                ),
            )
        elif isinstance(record, FenceBrokerRecord | UnfenceBrokerRecord):
            broker = self.brokers.get(record.broker_id)
            invariant(
                broker is not None and broker.broker_epoch == record.broker_epoch,
                lambda: (
                    f"{type(record).__name__} for broker {record.broker_id} epoch "
                    f"{record.broker_epoch} does not match its registration"
                ),
            )
        elif isinstance(record, TopicRecord):
            invariant(
                record.topic_id not in self.topics and record.name not in self.topics_by_name,
                lambda: f"topic {record.name} ({record.topic_id}) already exists",
            )
        elif isinstance(record, RemoveTopicRecord):
            invariant(
                record.topic_id in self.topics,
                lambda: f"removing unknown topic id {record.topic_id}",
            )
        elif isinstance(record, PartitionRecord):
            topic = self.topics.get(record.topic_id)
            invariant(topic is not None, lambda: f"partition of unknown topic id {record.topic_id}")
            _check_partition(f"{topic.name if topic else '?'}-{record.partition_id}", record)


def _check_partition(tp: str, record: PartitionRecord) -> None:
    invariant(record.partition_id >= 0, f"{tp}: negative partition id")
    invariant(bool(record.replicas), f"{tp}: no replicas")
    invariant(len(set(record.replicas)) == len(record.replicas), f"{tp}: duplicate replicas")
    invariant(
        set(record.isr) <= set(record.replicas),
        lambda: f"{tp}: ISR {record.isr} not in replicas",
    )
