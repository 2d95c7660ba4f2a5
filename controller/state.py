"""The controller's in-memory metadata image.

Built only by applying metadata records in offset order, so the image after a replay
(snapshot + log) is the image the live controller had: there is no other way to
change it. Records are never mutated once applied; a change is a new record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from controller.errors import invariant
from protocol.metadata_records import (
    NO_LEADER,
    FenceBrokerRecord,
    ListenerInfo,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)


@dataclass
class BrokerImage:
    broker_id: int
    broker_epoch: int
    incarnation_id: str
    listeners: list[ListenerInfo]
    rack: str | None
    fenced: bool

    def to_record(self) -> RegisterBrokerRecord:
        return RegisterBrokerRecord(
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch,
            incarnation_id=self.incarnation_id,
            listeners=list(self.listeners),
            rack=self.rack,
            fenced=self.fenced,
        )


@dataclass
class TopicImage:
    name: str
    topic_id: str
    configs: dict[str, str]
    partitions: dict[int, PartitionRecord] = field(default_factory=dict)


_MISSING: Any = object()


class MetadataImage:
    """Brokers, topics and partitions as of `last_offset`."""

    def __init__(self) -> None:
        self.brokers: dict[int, BrokerImage] = {}
        self.topics: dict[str, TopicImage] = {}  # by topic id
        self.topic_ids: dict[str, str] = {}  # name -> topic id
        self.last_offset = -1
        # The latest ProducerIdsRecord under the key "last" (a dict so `check` can undo).
        self.producer_ids: dict[str, ProducerIdsRecord] = {}
        # While `check` runs: every dict write, to be undone (a dry run).
        self._undo: list[tuple[dict[Any, Any], Any, Any]] | None = None

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    # ------------------------------------------------------------------ queries

    @property
    def next_producer_id(self) -> int:
        """The first producer id no broker has been given yet."""
        last = self.producer_ids.get("last")
        return 0 if last is None else last.next_producer_id

    def topic_by_name(self, name: str) -> TopicImage | None:
        topic_id = self.topic_ids.get(name)
        return None if topic_id is None else self.topics[topic_id]

    def is_unfenced(self, broker_id: int) -> bool:
        broker = self.brokers.get(broker_id)
        return broker is not None and not broker.fenced

    def unfenced_broker_ids(self) -> list[int]:
        return sorted(b.broker_id for b in self.brokers.values() if not b.fenced)

    def partitions(self) -> Iterator[tuple[TopicImage, PartitionRecord]]:
        for topic in self.topics.values():
            for partition_id in sorted(topic.partitions):
                yield topic, topic.partitions[partition_id]

    # ------------------------------------------------------------------ changes

    def apply(self, offset: int, record: MetadataRecord) -> None:
        """Apply a record appended at `offset` (offsets strictly increase)."""
        invariant(
            offset > self.last_offset,
            f"metadata offsets must increase: {offset} after {self.last_offset}",
        )
        self._apply(record, offset)
        self.last_offset = offset

    def check(self, base_offset: int, records: list[MetadataRecord]) -> None:
        """Raise InvariantViolation if applying `records` at `base_offset`, ... would
        break an invariant. Leaves the image as it was: the controller calls it before
        writing, so a bad record is refused instead of persisted."""
        invariant(self._undo is None, "nested check")
        saved_offset = self.last_offset
        self._undo = []
        try:
            for i, record in enumerate(records):
                self.apply(base_offset + i, record)
        finally:
            undo, self._undo = self._undo, None
            for d, key, old in reversed(undo):
                if old is _MISSING:
                    d.pop(key, None)
                else:
                    d[key] = old
            self.last_offset = saved_offset

    def _set(self, d: dict[Any, Any], key: Any, value: Any) -> None:
        if self._undo is not None:
            self._undo.append((d, key, d.get(key, _MISSING)))
        d[key] = value

    def _delete(self, d: dict[Any, Any], key: Any) -> None:
        if self._undo is not None:
            self._undo.append((d, key, d.get(key, _MISSING)))
        d.pop(key, None)

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
            self._apply(record, None)
        self.last_offset = last_offset

    def snapshot_records(self) -> list[MetadataRecord]:
        """The whole image as records; applying them to an empty image rebuilds it."""
        out: list[MetadataRecord] = [self.brokers[b].to_record() for b in sorted(self.brokers)]
        for topic in sorted(self.topics.values(), key=lambda t: t.name):
            out.append(
                TopicRecord(name=topic.name, topic_id=topic.topic_id, configs=dict(topic.configs))
            )
            out.extend(topic.partitions[p] for p in sorted(topic.partitions))
        last = self.producer_ids.get("last")
        if last is not None:
            out.append(last)
        return out

    def _apply(self, record: MetadataRecord, offset: int | None) -> None:
        # `offset` is None while loading a snapshot: records then describe state, they
        # were not appended at a position of their own.
        if isinstance(record, RegisterBrokerRecord):
            previous = self.brokers.get(record.broker_id)
            if offset is not None:
                invariant(
                    record.broker_epoch == offset,
                    f"broker {record.broker_id}: epoch {record.broker_epoch} is not the "
                    f"offset {offset} of its registration",
                )
            if previous is not None:
                invariant(
                    record.broker_epoch > previous.broker_epoch,
                    f"broker {record.broker_id}: epoch {record.broker_epoch} does not "
                    f"increase past {previous.broker_epoch}",
                )
            self._set(
                self.brokers,
                record.broker_id,
                BrokerImage(
                    broker_id=record.broker_id,
                    broker_epoch=record.broker_epoch,
                    incarnation_id=record.incarnation_id,
                    listeners=list(record.listeners),
                    rack=record.rack,
                    fenced=record.fenced,
                ),
            )
        elif isinstance(record, FenceBrokerRecord | UnfenceBrokerRecord):
            broker = self.brokers.get(record.broker_id)
            invariant(
                broker is not None and broker.broker_epoch == record.broker_epoch,
                f"{type(record).__name__} for broker {record.broker_id} epoch "
                f"{record.broker_epoch} does not match its registration",
            )
            assert broker is not None
            fenced = isinstance(record, FenceBrokerRecord)
            # A new object, never an in-place change: `check` undoes by dict writes.
            self._set(self.brokers, record.broker_id, dataclasses.replace(broker, fenced=fenced))
        elif isinstance(record, TopicRecord):
            invariant(
                record.topic_id not in self.topics and record.name not in self.topic_ids,
                f"topic {record.name} ({record.topic_id}) already exists",
            )
            self._set(
                self.topics,
                record.topic_id,
                TopicImage(
                    name=record.name, topic_id=record.topic_id, configs=dict(record.configs)
                ),
            )
            self._set(self.topic_ids, record.name, record.topic_id)
        elif isinstance(record, RemoveTopicRecord):
            topic = self.topics.get(record.topic_id)
            invariant(topic is not None, f"removing unknown topic id {record.topic_id}")
            assert topic is not None
            self._delete(self.topics, record.topic_id)
            self._delete(self.topic_ids, topic.name)
        elif isinstance(record, PartitionRecord):
            topic = self.topics.get(record.topic_id)
            invariant(topic is not None, f"partition of unknown topic id {record.topic_id}")
            assert topic is not None
            _check_partition(topic, record)
            self._set(topic.partitions, record.partition_id, record)
        elif isinstance(record, ProducerIdsRecord):
            # Ids are handed out once ever: the next block only moves forward.
            invariant(
                record.next_producer_id > self.next_producer_id,
                f"producer id block end {record.next_producer_id} does not pass "
                f"{self.next_producer_id}",
            )
            self._set(self.producer_ids, "last", record)
        else:  # pragma: no cover - the union is closed
            raise TypeError(f"unknown metadata record {record!r}")


def _check_partition(topic: TopicImage, record: PartitionRecord) -> None:
    tp = f"{topic.name}-{record.partition_id}"
    invariant(record.partition_id >= 0, f"{tp}: negative partition id")
    invariant(bool(record.replicas), f"{tp}: no replicas")
    invariant(len(set(record.replicas)) == len(record.replicas), f"{tp}: duplicate replicas")
    invariant(set(record.isr) <= set(record.replicas), f"{tp}: ISR {record.isr} not in replicas")
    invariant(
        record.leader == NO_LEADER or record.leader in record.isr,
        f"{tp}: leader {record.leader} not in ISR {record.isr}",
    )
    old = topic.partitions.get(record.partition_id)
    if old is not None:
        invariant(
            record.leader_epoch >= old.leader_epoch,
            f"{tp}: leader epoch goes back from {old.leader_epoch} to {record.leader_epoch}",
        )
        invariant(
            record.partition_epoch >= old.partition_epoch,
            f"{tp}: partition epoch goes back from {old.partition_epoch} to "
            f"{record.partition_epoch}",
        )
