"""MetadataImage: replaying records, deltas, and what a broker must do about them."""

from __future__ import annotations

from broker_harness import partition_record

from broker.metadata_image import MAX_REMEMBERED_DELETIONS
from broker.metadata_image import MetadataImage
from protocol.messages import MetadataEntry
from protocol.metadata_records import FenceBrokerRecord
from protocol.metadata_records import ListenerInfo
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import RemoveTopicRecord
from protocol.metadata_records import TopicRecord
from protocol.metadata_records import UnfenceBrokerRecord


def entries(*records: object, start: int = 0) -> list[MetadataEntry]:
    return [MetadataEntry(offset=start + i, record=r) for i, r in enumerate(records)]  # type: ignore[arg-type]


def part(topic_id: str, index: int, replicas: list[int], leader: int, epoch: int = 0, pe: int = 0):
    return partition_record(
        topic_id, index, replicas=replicas, leader=leader, epoch=epoch, partition_epoch=pe
    )


def test_brokers_fence_unfence() -> None:
    image = MetadataImage()
    listener = ListenerInfo(name="PLAINTEXT", host="h", port=1)
    delta = image.apply(
        entries(
            RegisterBrokerRecord(
                broker_id=1, broker_epoch=0, incarnation_id="a", listeners=[listener]
            ),
            UnfenceBrokerRecord(broker_id=1, broker_epoch=0),
            # A fence for an older epoch must not touch the current registration.
            FenceBrokerRecord(broker_id=1, broker_epoch=-5),
        )
    )
    assert delta.brokers_changed
    assert image.offset == 2
    assert [b.broker_id for b in image.live_brokers()] == [1]
    assert image.brokers[1].listener("PLAINTEXT") == listener
    image.apply(entries(FenceBrokerRecord(broker_id=1, broker_epoch=0), start=3))
    assert image.live_brokers() == []


def test_partition_changes_and_local_roles() -> None:
    image = MetadataImage()
    delta = image.apply(
        entries(
            TopicRecord(name="t", topic_id="T1", configs={"retention.ms": "1000"}),
            part("T1", 0, [1], leader=1),
            part("T1", 1, [2, 1], leader=2),
            part("T1", 2, [2], leader=2),
            part("T1", 3, [1], leader=-1),
        )
    )
    assert delta.topic_configs == {"t": {"retention.ms": "1000"}}
    local = delta.local_changes(1)
    assert set(local.leaders) == {("t", 0)}
    assert set(local.followers) == {("t", 1)}
    assert set(local.offline) == {("t", 3)}
    # Not ours and never was: nothing to delete on that inference (a local directory
    # of that name is judged by its topic id at start-up, replica_manager.py).
    assert not local.deletes and not local.strays

    # A leader change bumps the epoch; replaying an old entry is ignored.
    delta = image.apply(entries(part("T1", 1, [2, 1], leader=1, epoch=1, pe=1), start=5))
    assert set(delta.changed) == {("t", 1)}
    assert delta.local_changes(1).leaders[("t", 1)].leader_epoch == 1
    assert not image.apply(entries(part("T1", 1, [2, 1], leader=2), start=5)).changed


def test_remove_topic_and_recreate_in_one_batch() -> None:
    image = MetadataImage()
    image.apply(entries(TopicRecord(name="t", topic_id="T1"), part("T1", 0, [1], leader=1)))
    delta = image.apply(
        entries(
            RemoveTopicRecord(topic_id="T1"),
            TopicRecord(name="t", topic_id="T2"),
            part("T2", 0, [1], leader=1),
            start=2,
        )
    )
    assert delta.removed[("t", 0)].topic_id == "T1"
    assert delta.changed[("t", 0)].topic_id == "T2"
    assert delta.deleted_topics == {"T1": "t"}
    local = delta.local_changes(1)
    assert local.deletes == {("t", 0): "T1"}
    assert not local.strays
    assert local.leaders[("t", 0)].topic_id == "T2"
    assert image.deleted_topic_ids == {"T1": "t"}


def test_snapshot_replaces_the_image_with_a_diff() -> None:
    image = MetadataImage()
    image.apply(
        entries(
            TopicRecord(name="gone", topic_id="G"),
            part("G", 0, [1], leader=1),
            TopicRecord(name="kept", topic_id="K"),
            part("K", 0, [1], leader=1),
        )
    )
    delta = image.apply(
        entries(
            TopicRecord(name="kept", topic_id="K"),
            part("K", 0, [1], leader=1, epoch=3, pe=3),
            start=10,
        ),
        is_snapshot=True,
    )
    assert delta.is_snapshot
    assert set(delta.removed) == {("gone", 0)}
    assert delta.changed[("kept", 0)].leader_epoch == 3
    assert image.offset == 11
    assert "gone" not in image.topics_by_name
    # A snapshot without the topic is no deletion record: the replica is set aside as
    # stray, never deleted (Kafka would delete it here).
    local = delta.local_changes(1)
    assert local.strays == {("gone", 0): "G"}
    assert not local.deletes
    assert not image.deleted_topic_ids


def test_only_a_remove_topic_record_naming_the_topic_id_deletes_a_replica() -> None:
    image = MetadataImage()
    image.apply(entries(TopicRecord(name="t", topic_id="T1"), part("T1", 0, [1, 2], leader=1)))
    # An empty snapshot (a controller that lost its data, restored from an old backup):
    # the replica vanished, nobody deleted it.
    delta = image.apply(entries(start=5), is_snapshot=True, next_offset=5)
    assert delta.local_changes(1).strays == {("t", 0): "T1"}
    assert not delta.local_changes(1).deletes
    # The topic comes back (same id) and is then deleted by a record: that deletes it.
    image.apply(
        entries(TopicRecord(name="t", topic_id="T1"), part("T1", 0, [1, 2], leader=1), start=5),
        is_snapshot=True,
        next_offset=7,
    )
    delta = image.apply(entries(RemoveTopicRecord(topic_id="T1"), start=7))
    local = delta.local_changes(2)
    assert local.deletes == {("t", 0): "T1"} and not local.strays
    # A broker that was never a replica has nothing to do.
    assert not delta.local_changes(3)


def test_a_partition_record_moving_the_replica_away_deletes_it() -> None:
    # Kafka's TopicDelta rule (reassignment): the same topic id, the broker was in the
    # replica set and a PartitionRecord takes it out. The controller never moves
    # replicas today; the rule is kept for when it does.
    image = MetadataImage()
    image.apply(entries(TopicRecord(name="t", topic_id="T1"), part("T1", 0, [1, 2], leader=1)))
    delta = image.apply(entries(part("T1", 0, [2, 3], leader=2, epoch=1, pe=1), start=2))
    assert delta.local_changes(1).deletes == {("t", 0): "T1"}
    assert set(delta.local_changes(3).followers) == {("t", 0)}
    # The same move seen only through a snapshot is set aside, not deleted.
    image = MetadataImage()
    image.apply(entries(TopicRecord(name="t", topic_id="T1"), part("T1", 0, [1, 2], leader=1)))
    delta = image.apply(
        entries(TopicRecord(name="t", topic_id="T1"), part("T1", 0, [2, 3], leader=2, epoch=1)),
        is_snapshot=True,
        next_offset=9,
    )
    local = delta.local_changes(1)
    assert local.strays == {("t", 0): "T1"} and not local.deletes


def test_remembered_deletions_are_bounded() -> None:
    image = MetadataImage()
    n = MAX_REMEMBERED_DELETIONS + 3
    records: list[object] = []
    for i in range(n):
        records += [
            TopicRecord(name=f"t{i}", topic_id=f"T{i}"),
            RemoveTopicRecord(topic_id=f"T{i}"),
        ]
    image.apply(entries(*records))
    assert len(image.deleted_topic_ids) == MAX_REMEMBERED_DELETIONS
    assert "T0" not in image.deleted_topic_ids and f"T{n - 1}" in image.deleted_topic_ids
