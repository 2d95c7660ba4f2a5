"""One metadata image: the cluster metadata (brokers, topics, partitions, producer id
blocks) as the replay of the controller's metadata records, used by the controller
(controller/state.py) and by every broker (broker/metadata_image.py). Pure: no I/O,
no asyncio.

The replay rules, the same on both sides:

- a broker's registration replaces its previous one; its epoch never goes back (the
  controller requires it to increase: controller/state.py);
- a Fence/UnfenceBrokerRecord for another epoch than the registered one is ignored
  (it concerns an incarnation that is gone);
- a TopicRecord for a known topic id sets that topic's configs (the record says what
  the topic is now, as in a snapshot); one that reuses a known name under a new id
  replaces the old topic (a deletion without its RemoveTopicRecord, e.g. a log
  cut by a snapshot). The controller never writes either: its stricter checks
  (controller/state.py) refuse a TopicRecord for an existing id or name, since topic
  configs are fixed at creation; a broker, which only follows, takes the lenient
  reading rather than stop following the log;
- a RemoveTopicRecord for an unknown id, and a PartitionRecord of an unknown topic,
  are ignored (logged): only the controller refuses them;
- invariants (a violation is a corrupt log, never input): a partition's leader is in
  its ISR, its leader epoch never decreases and its partition epoch never decreases;
  broker epochs never decrease and the producer id blocks only move forward.

A side's own view of a partition is its choice (`partition_view`): the controller
keeps the PartitionRecord itself, a broker a PartitionState with the topic's name.
Subclasses follow the changes through the `_on_*` hooks (the broker builds its
MetadataDelta with them). Writes go through `_set`/`_delete` so that a dry run
(`journal`) can undo them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any
from typing import Generic
from typing import Protocol
from typing import TypeVar

import msgspec

from protocol.invariants import invariant
from protocol.metadata_records import NO_LEADER
from protocol.metadata_records import AccessControlEntryRecord
from protocol.metadata_records import ClientQuotaRecord
from protocol.metadata_records import FenceBrokerRecord
from protocol.metadata_records import LeaderChangeRecord
from protocol.metadata_records import ListenerInfo
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import ProducerIdsRecord
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import RemoveAccessControlEntryRecord
from protocol.metadata_records import RemoveScramCredentialRecord
from protocol.metadata_records import RemoveTopicRecord
from protocol.metadata_records import ScramCredentialRecord
from protocol.metadata_records import TopicRecord
from protocol.metadata_records import UnfenceBrokerRecord
from runtime.acl import AclBinding
from runtime.acl import binding_of
from runtime.client_quotas import QuotaEntity
from runtime.client_quotas import entity_of

log = logging.getLogger(__name__)


class PartitionLike(Protocol):
    """What both sides' partition views have (PartitionRecord, PartitionState)."""

    @property
    def replicas(self) -> Sequence[int]: ...
    @property
    def isr(self) -> Sequence[int]: ...
    @property
    def leader(self) -> int: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def partition_epoch(self) -> int: ...


P = TypeVar("P", bound=PartitionLike)


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: int
    broker_epoch: int
    incarnation_id: str
    listeners: tuple[ListenerInfo, ...]
    rack: str | None
    fenced: bool
    principal: str | None = None

    def listener(self, name: str) -> ListenerInfo | None:
        for item in self.listeners:
            if item.name == name:
                return item
        return None

    @classmethod
    def from_record(cls, record: RegisterBrokerRecord) -> BrokerInfo:
        fields = msgspec.structs.asdict(record)
        return cls(**{**fields, "listeners": tuple(record.listeners)})

    def to_record(self) -> RegisterBrokerRecord:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return RegisterBrokerRecord(**{**fields, "listeners": list(self.listeners)})


@dataclass
class TopicImage(Generic[P]):
    name: str
    topic_id: str
    configs: dict[str, str]
    partitions: dict[int, P] = field(default_factory=dict)


_MISSING: Any = object()


class MetadataImage(Generic[P]):
    """Brokers, topics and partitions as of `last_offset`."""

    def __init__(self) -> None:
        self.last_offset = -1
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicImage[P]] = {}  # by topic id
        self.topics_by_name: dict[str, TopicImage[P]] = {}
        # The latest ProducerIdsRecord under the key "last" (a dict, so undoable).
        self.producer_ids: dict[str, ProducerIdsRecord] = {}
        # (user, mechanism) -> its SCRAM credential (issue 18)
        self.scram_credentials: dict[tuple[str, int], ScramCredentialRecord] = {}
        # ACL id -> its binding (issue 18); `acl_generation` moves with every change, so
        # an authorizer knows when to rebuild its index (a count, never undone).
        self.acls: dict[str, AclBinding] = {}
        self.acl_generation = 0
        # entity -> {quota key: value} (issue 18; runtime/client_quotas.py). Each change
        # puts a new inner dict (a dry run undoes dict writes, not in-place changes).
        self.client_quotas: dict[QuotaEntity, dict[str, float]] = {}
        # Counts ClientQuotaRecords replayed: a cache of resolved quotas is stale once
        # it moves (a dry run's undo leaves it moved: a harmless extra refresh).
        self.client_quota_changes = 0
        # While a dry run goes: every dict write, to be undone.
        self._undo: list[tuple[dict[Any, Any], Any, Any]] | None = None

    # ------------------------------------------------------------------ queries

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def next_producer_id(self) -> int:
        """The first producer id no broker has been given yet."""
        last = self.producer_ids.get("last")
        return 0 if last is None else last.next_producer_id

    def topic_by_name(self, name: str) -> TopicImage[P] | None:
        return self.topics_by_name.get(name)

    def is_unfenced(self, broker_id: int) -> bool:
        broker = self.brokers.get(broker_id)
        return broker is not None and not broker.fenced

    def live_brokers(self) -> list[BrokerInfo]:
        """Unfenced brokers by id."""
        return sorted((b for b in self.brokers.values() if not b.fenced), key=lambda b: b.broker_id)

    def unfenced_broker_ids(self) -> list[int]:
        return [b.broker_id for b in self.live_brokers()]

    def topic_partitions(self) -> Iterator[tuple[TopicImage[P], P]]:
        for topic in self.topics.values():
            for partition_id in sorted(topic.partitions):
                yield topic, topic.partitions[partition_id]

    # ------------------------------------------------------------------ the side's view

    def partition_view(self, topic: TopicImage[P], record: PartitionRecord) -> P:
        raise NotImplementedError

    # Hooks, called before the change they name (no-ops here).

    def _on_partition(self, topic: TopicImage[P], partition_id: int, old: P | None) -> None:
        """A partition of `topic` changes or goes (`old`: its state before)."""

    def _on_topic_configs(self, topic: TopicImage[P]) -> None:
        """A topic appeared or its configs were set."""

    def _on_topic_deleted(self, topic: TopicImage[P]) -> None:
        """A RemoveTopicRecord deleted `topic`."""

    def _on_brokers(self) -> None:
        """A broker registered, or was fenced or unfenced."""

    # ------------------------------------------------------------------ replay

    def clear(self) -> None:
        """Forget everything but `last_offset` (a snapshot follows)."""
        invariant(self._undo is None, "no clear in a dry run")
        self.brokers.clear()
        self.topics.clear()
        self.topics_by_name.clear()
        self.producer_ids.clear()
        self.scram_credentials.clear()
        self.acls.clear()
        self.acl_generation += 1

    def journal(self) -> list[tuple[dict[Any, Any], Any, Any]]:
        """Start a dry run: writes are noted until `undo` puts them back."""
        invariant(self._undo is None, "nested dry run")
        self._undo = []
        return self._undo

    def undo(self) -> None:
        undo, self._undo = self._undo or [], None
        for d, key, old in reversed(undo):
            if old is _MISSING:
                d.pop(key, None)
            else:
                d[key] = old

    def _set(self, d: dict[Any, Any], key: Any, value: Any) -> None:
        if self._undo is not None:
            self._undo.append((d, key, d.get(key, _MISSING)))
        d[key] = value

    def _delete(self, d: dict[Any, Any], key: Any) -> None:
        if self._undo is not None:
            self._undo.append((d, key, d.get(key, _MISSING)))
        d.pop(key, None)

    def replay(self, record: MetadataRecord) -> None:
        """Apply one record (the rules are in the module doc); `last_offset` is the
        caller's."""
        if isinstance(record, PartitionRecord):
            self._replay_partition(record)
        elif isinstance(record, TopicRecord):
            self._replay_topic(record)
        elif isinstance(record, RemoveTopicRecord):
            topic = self.topics.get(record.topic_id)
            if topic is None:
                log.warning("RemoveTopicRecord for unknown topic id %s ignored", record.topic_id)
                return
            self._on_topic_deleted(topic)
            self._remove_topic(topic)
        elif isinstance(record, RegisterBrokerRecord):
            previous = self.brokers.get(record.broker_id)
            invariant(
                previous is None or record.broker_epoch >= previous.broker_epoch,
                lambda: (
                    f"broker {record.broker_id}: epoch goes back from "
                    f"{previous.broker_epoch if previous else None} to {record.broker_epoch}"
                ),
            )
            self._on_brokers()
            self._set(self.brokers, record.broker_id, BrokerInfo.from_record(record))
        elif isinstance(record, FenceBrokerRecord | UnfenceBrokerRecord):
            broker = self.brokers.get(record.broker_id)
            if broker is None or broker.broker_epoch != record.broker_epoch:
                return  # an incarnation that is gone
            self._on_brokers()
            fenced = isinstance(record, FenceBrokerRecord)
            # A new object, never an in-place change: a dry run undoes dict writes.
            self._set(self.brokers, record.broker_id, replace(broker, fenced=fenced))
        elif isinstance(record, ProducerIdsRecord):
            # Ids are handed out once ever: the next block only moves forward.
            invariant(
                record.next_producer_id > self.next_producer_id,
                lambda: (
                    f"producer id block end {record.next_producer_id} does not pass "
                    f"{self.next_producer_id}"
                ),
            )
            self._set(self.producer_ids, "last", record)
        elif isinstance(record, LeaderChangeRecord):
            pass  # the quorum's own entry: nothing of the cluster changes
        elif isinstance(record, ScramCredentialRecord):
            self._set(self.scram_credentials, (record.name, record.mechanism), record)
        elif isinstance(record, RemoveScramCredentialRecord):
            self._delete(self.scram_credentials, (record.name, record.mechanism))
        elif isinstance(record, AccessControlEntryRecord):
            self.acl_generation += 1
            try:
                self._set(self.acls, record.id, binding_of(record))
            except ValueError as exc:  # a code this version does not know: skip, say so
                log.warning("ACL %s ignored: %s", record.id, exc)
        elif isinstance(record, RemoveAccessControlEntryRecord):
            self.acl_generation += 1
            self._delete(self.acls, record.id)
        elif isinstance(record, ClientQuotaRecord):
            self._replay_client_quota(record)
        else:
            log.warning("unknown metadata record %s ignored", type(record).__name__)

    def _replay_client_quota(self, record: ClientQuotaRecord) -> None:
        entity = entity_of((p.entity_type, p.entity_name) for p in record.entity)
        values = dict(self.client_quotas.get(entity, {}))
        if record.remove:
            values.pop(record.key, None)
        else:
            values[record.key] = record.value
        if values:
            self._set(self.client_quotas, entity, values)
        elif entity in self.client_quotas:
            self._delete(self.client_quotas, entity)
        self.client_quota_changes += 1

    def _replay_topic(self, record: TopicRecord) -> None:
        existing = self.topics.get(record.topic_id)
        if existing is not None:
            topic = replace(existing, configs=dict(record.configs))
        else:
            stale = self.topics_by_name.get(record.name)
            if stale is not None:  # a name reused without a RemoveTopicRecord
                self._remove_topic(stale)
            topic = TopicImage(
                name=record.name, topic_id=record.topic_id, configs=dict(record.configs)
            )
        self._set(self.topics, topic.topic_id, topic)
        self._set(self.topics_by_name, topic.name, topic)
        self._on_topic_configs(topic)

    def _remove_topic(self, topic: TopicImage[P]) -> None:
        for partition_id, state in topic.partitions.items():
            self._on_partition(topic, partition_id, state)
        self._delete(self.topics, topic.topic_id)
        if self.topics_by_name.get(topic.name) is topic:
            self._delete(self.topics_by_name, topic.name)

    def _replay_partition(self, record: PartitionRecord) -> None:
        topic = self.topics.get(record.topic_id)
        if topic is None:
            log.warning(
                "partition record for unknown topic id %s partition %d ignored",
                record.topic_id,
                record.partition_id,
            )
            return
        old = topic.partitions.get(record.partition_id)
        check_partition_change(f"{topic.name}-{record.partition_id}", old, record)
        self._on_partition(topic, record.partition_id, old)
        self._set(topic.partitions, record.partition_id, self.partition_view(topic, record))


def check_partition_change(tp: str, old: PartitionLike | None, new: PartitionRecord) -> None:
    """The partition invariants every replay holds: the leader is in the ISR, and
    neither epoch goes back."""
    invariant(
        new.leader == NO_LEADER or new.leader in new.isr,
        lambda: f"{tp}: leader {new.leader} not in ISR {new.isr}",
    )
    if old is None:
        return
    invariant(
        new.leader_epoch >= old.leader_epoch,
        lambda: f"{tp}: leader epoch goes back from {old.leader_epoch} to {new.leader_epoch}",
    )
    invariant(
        new.partition_epoch >= old.partition_epoch,
        lambda: (
            f"{tp}: partition epoch goes back from {old.partition_epoch} to {new.partition_epoch}"
        ),
    )
