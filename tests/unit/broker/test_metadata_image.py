"""MetadataImage: replaying records, deltas, and what a broker must do about them."""

from __future__ import annotations

from broker.metadata_image import MetadataImage
from protocol.messages import MetadataEntry
from protocol.metadata_records import (
    FenceBrokerRecord,
    ListenerInfo,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)


def entries(*records: object, start: int = 0) -> list[MetadataEntry]:
    return [MetadataEntry(offset=start + i, record=r) for i, r in enumerate(records)]  # type: ignore[arg-type]


def part(topic_id: str, index: int, replicas: list[int], leader: int, epoch: int = 0, pe: int = 0):
    return PartitionRecord(
        topic_id=topic_id,
        partition_id=index,
        replicas=replicas,
        isr=list(replicas),
        leader=leader,
        leader_epoch=epoch,
        partition_epoch=pe,
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
    assert set(local.deletes) == {("t", 2)}  # not ours: make sure no stale replica stays

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
    local = delta.local_changes(1)
    assert local.deletes == {("t", 0): "T1"}
    assert local.leaders[("t", 0)].topic_id == "T2"


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
