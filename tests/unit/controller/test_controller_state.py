"""The metadata image: applying records, invariants, snapshots, replay == live."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import InvariantViolation
from controller.state import MetadataImage
from protocol.messages import DeleteTopicsRequest
from protocol.metadata_records import NO_LEADER
from protocol.metadata_records import FenceBrokerRecord
from protocol.metadata_records import ListenerInfo
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import RemoveTopicRecord
from protocol.metadata_records import TopicRecord
from protocol.metadata_records import UnfenceBrokerRecord


def reg(broker_id: int, epoch: int, fenced: bool = True) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(
        broker_id=broker_id,
        broker_epoch=epoch,
        incarnation_id=f"i{epoch}",
        listeners=[ListenerInfo(name="PLAINTEXT", host="h", port=1)],
        fenced=fenced,
    )


def prec(le: int, pe: int, leader: int = 1, isr: list[int] | None = None) -> PartitionRecord:
    return PartitionRecord(
        topic_id="tid",
        partition_id=0,
        replicas=[1, 2],
        isr=[1, 2] if isr is None else isr,
        leader=leader,
        leader_epoch=le,
        partition_epoch=pe,
    )


def test_apply_builds_the_image() -> None:
    image = MetadataImage()
    image.apply(0, reg(1, 0))
    image.apply(1, UnfenceBrokerRecord(broker_id=1, broker_epoch=0))
    image.apply(2, TopicRecord(name="t", topic_id="tid", configs={"a": "b"}))
    image.apply(3, prec(0, 0))
    assert image.is_unfenced(1) and image.unfenced_broker_ids() == [1]
    assert image.topic_by_name("t").partitions[0] == prec(0, 0)  # type: ignore[union-attr]
    image.apply(4, FenceBrokerRecord(broker_id=1, broker_epoch=0))
    assert not image.is_unfenced(1)
    image.apply(5, RemoveTopicRecord(topic_id="tid"))
    assert image.topic_by_name("t") is None and image.last_offset == 5


@pytest.mark.parametrize(
    "offset, record, message",
    [
        (3, reg(1, 2), "not the offset"),  # epoch must be the record's offset
        (1, reg(9, 1), "must increase"),  # offsets must increase
        (3, FenceBrokerRecord(broker_id=1, broker_epoch=7), "does not match"),
        (3, TopicRecord(name="t", topic_id="other"), "already exists"),
        (3, prec(4, 9), "leader epoch goes back"),
        (3, prec(5, 8), "partition epoch goes back"),
        (3, prec(6, 9, leader=3), "not in ISR"),
        (3, RemoveTopicRecord(topic_id="nope"), "unknown topic"),
    ],
)
def test_invariants_are_enforced(offset: int, record: object, message: str) -> None:
    image = MetadataImage()
    image.apply(0, reg(1, 0))
    image.apply(1, TopicRecord(name="t", topic_id="tid"))
    image.apply(2, prec(5, 9))
    with pytest.raises(InvariantViolation, match=message):
        image.apply(offset, record)  # type: ignore[arg-type]


def test_broker_epochs_strictly_increase() -> None:
    image = MetadataImage()
    image.load_snapshot(5, [reg(1, 5)])
    with pytest.raises(InvariantViolation, match="does not increase"):
        MetadataImage().load_snapshot(9, [reg(1, 5), reg(1, 3)])


def test_check_is_a_dry_run() -> None:
    image = MetadataImage()
    image.apply(0, reg(1, 0))
    image.apply(1, TopicRecord(name="t", topic_id="tid"))
    image.apply(2, prec(1, 1))
    before = image.snapshot_records()
    good = [
        UnfenceBrokerRecord(broker_id=1, broker_epoch=0),
        prec(2, 2),
        RemoveTopicRecord(topic_id="tid"),
        TopicRecord(name="t", topic_id="tid2"),
        reg(2, 7),
    ]
    image.check(3, good)
    assert image.snapshot_records() == before and image.last_offset == 2
    bad = [prec(2, 2), prec(1, 3)]  # second record moves the leader epoch back
    with pytest.raises(InvariantViolation):
        image.check(3, bad)
    assert image.snapshot_records() == before and image.last_offset == 2


def test_snapshot_records_rebuild_the_same_image() -> None:
    image = MetadataImage()
    image.apply(0, reg(1, 0))
    image.apply(1, reg(2, 1))
    image.apply(2, UnfenceBrokerRecord(broker_id=2, broker_epoch=1))
    image.apply(3, TopicRecord(name="t", topic_id="tid"))
    image.apply(4, prec(0, 0, leader=NO_LEADER, isr=[1]))
    copy = MetadataImage()
    copy.load_snapshot(image.last_offset, image.snapshot_records())
    assert copy.snapshot_records() == image.snapshot_records()
    assert copy.last_offset == 4 and copy.is_unfenced(2) and not copy.is_unfenced(1)


async def test_replay_equals_live(tmp_path: Path, make_harness) -> None:
    """A controller that does a bit of everything, restarted from its files (with and
    without snapshots in between), rebuilds exactly the image it had."""
    for snapshot_every in (10_000, 3, 1):
        h = await make_harness(tmp_path / f"c{snapshot_every}", snapshot_every=snapshot_every)
        e1 = await h.start_broker(1)
        await h.start_broker(2)
        await h.start_broker(3)
        await h.create_topic("a", partitions=3, replication_factor=2)
        await h.create_topic("b", partitions=1, replication_factor=3)
        await h.register(2)  # new incarnation: leaderships move
        h.run_for(5)
        await h.heartbeat(1, e1)
        await h.handlers.fence_expired_brokers()  # 3 and 2 fenced
        await h.create_topic("c", partitions=2, replication_factor=1)
        await h.handlers.delete_topics(DeleteTopicsRequest(topic_names=["b"]))
        live = h.image.snapshot_records()
        live_offset = h.image.last_offset
        await h.reopen()
        assert h.image.snapshot_records() == live
        assert h.image.last_offset == live_offset
        if snapshot_every < 10_000:
            assert any(p.name.startswith("snapshot-") for p in h.config.data_dir.iterdir())
        await h.close()
