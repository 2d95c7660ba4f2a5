"""AlterPartition (KIP-903): every check and its error code."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import TEST_FAULTS_ENV
from controller.config import ControllerConfig
from protocol.errors import ErrorCode
from protocol.messages import AlterPartitionPartition
from protocol.messages import AlterPartitionRequest
from protocol.messages import AlterPartitionResponse
from protocol.messages import AlterPartitionTopic
from protocol.messages import BrokerState
from protocol.messages import CreatableReplicaAssignment
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest


async def setup(h) -> dict[int, int]:
    """Brokers 1, 2, 3 unfenced, broker 4 registered (unfenced, not a replica of t),
    topic t partition 0 on [1, 2, 3] led by 1."""
    epochs = {b: await h.start_broker(b) for b in (1, 2, 3, 4)}
    await h.create_assigned("t", [[1, 2, 3]])
    return epochs


async def alter(
    h,
    isr: list[tuple[int, int]],
    *,
    broker_id: int = 1,
    broker_epoch: int | None = None,
    leader_epoch: int | None = None,
    partition_epoch: int | None = None,
    topic: str = "t",
    partition: int = 0,
    recovery: int = 0,
) -> AlterPartitionResponse:
    # The epochs default to the partition's own; one that does not exist gets t-0's.
    image_topic = h.image.topic_by_name(topic)
    exists = image_topic is not None and partition in image_topic.partitions
    current = h.partition(topic, partition) if exists else h.partition("t", 0)
    return await h.handlers.alter_partition(
        AlterPartitionRequest(
            broker_id=broker_id,
            broker_epoch=(
                h.image.brokers[broker_id].broker_epoch if broker_epoch is None else broker_epoch
            ),
            topics=[
                AlterPartitionTopic(
                    topic_name=topic,
                    partitions=[
                        AlterPartitionPartition(
                            partition_index=partition,
                            leader_epoch=(
                                current.leader_epoch if leader_epoch is None else leader_epoch
                            ),
                            new_isr_with_epochs=[
                                BrokerState(broker_id=b, broker_epoch=e) for b, e in isr
                            ],
                            leader_recovery_state=recovery,
                            partition_epoch=(
                                current.partition_epoch
                                if partition_epoch is None
                                else partition_epoch
                            ),
                        )
                    ],
                )
            ],
        )
    )


def code(response: AlterPartitionResponse) -> ErrorCode:
    if response.error_code:
        return ErrorCode(response.error_code)
    return ErrorCode(response.topics[0].partitions[0].error_code)


async def test_shrink_and_expand(harness) -> None:
    h = harness
    e = await setup(h)
    before = h.partition("t")
    offset = h.image.last_offset
    shrink = await alter(h, [(1, e[1]), (2, e[2])])
    assert code(shrink) == ErrorCode.NONE
    result = shrink.topics[0].partitions[0]
    assert (result.leader_id, result.isr, result.leader_epoch) == (1, [1, 2], before.leader_epoch)
    assert result.partition_epoch == before.partition_epoch + 1
    assert h.partition("t").isr == [1, 2] and h.image.last_offset == offset + 1
    grow = await alter(h, [(1, e[1]), (2, e[2]), (3, -1)])  # -1 skips the epoch check
    assert code(grow) == ErrorCode.NONE
    assert h.partition("t").isr == [1, 2, 3]
    assert h.partition("t").partition_epoch == before.partition_epoch + 2
    # Same ISR again: answered with the current state, nothing written.
    offset = h.image.last_offset
    same = await alter(h, [(1, e[1]), (2, e[2]), (3, e[3])])
    assert code(same) == ErrorCode.NONE and h.image.last_offset == offset


async def test_stale_requester_epoch(harness) -> None:
    h = harness
    e = await setup(h)
    stale = await alter(h, [(1, e[1])], broker_epoch=e[1] - 1)
    assert stale.error_code == ErrorCode.STALE_BROKER_EPOCH and stale.topics == []
    unknown = await alter(h, [(1, e[1])], broker_id=9, broker_epoch=0)
    assert unknown.error_code == ErrorCode.STALE_BROKER_EPOCH


async def test_unknown_partition(harness) -> None:
    h = harness
    e = await setup(h)
    assert code(await alter(h, [(1, e[1])], topic="nope")) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert code(await alter(h, [(1, e[1])], partition=5)) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_leader_epoch_checks(harness) -> None:
    h = harness
    e = await setup(h)
    le = h.partition("t").leader_epoch
    assert code(await alter(h, [(1, e[1])], leader_epoch=le - 1)) == ErrorCode.FENCED_LEADER_EPOCH
    assert code(await alter(h, [(1, e[1])], leader_epoch=le + 1)) == ErrorCode.UNKNOWN_LEADER_EPOCH
    # A follower (right epochs, not the leader) is fenced too.
    follower = await alter(h, [(2, e[2]), (1, e[1])], broker_id=2)
    assert code(follower) == ErrorCode.FENCED_LEADER_EPOCH


async def test_partition_epoch_check(harness) -> None:
    h = harness
    e = await setup(h)
    pe = h.partition("t").partition_epoch
    await alter(h, [(1, e[1]), (2, e[2])])  # pe + 1
    # A leader that did not see its own last change yet retries with the old epoch.
    stale = await alter(h, [(1, e[1])], partition_epoch=pe)
    assert code(stale) == ErrorCode.INVALID_UPDATE_VERSION
    assert code(await alter(h, [(1, e[1])], partition_epoch=pe + 5)) == (
        ErrorCode.INVALID_UPDATE_VERSION
    )


async def test_isr_shape_checks(harness) -> None:
    h = harness
    e = await setup(h)
    assert code(await alter(h, [(2, e[2]), (3, e[3])])) == ErrorCode.INVALID_REQUEST  # no leader
    assert code(await alter(h, [])) == ErrorCode.INVALID_REQUEST
    assert code(await alter(h, [(1, e[1]), (1, e[1])])) == ErrorCode.INVALID_REQUEST
    assert code(await alter(h, [(1, e[1]), (2, e[2])], recovery=1)) == ErrorCode.INVALID_REQUEST
    assert code(await alter(h, [(1, e[1])], recovery=7)) == ErrorCode.INVALID_REQUEST


async def test_ineligible_replicas(harness) -> None:
    h = harness
    e = await setup(h)
    await alter(h, [(1, e[1])])  # ISR [1]
    # Not a replica of the partition.
    assert code(await alter(h, [(1, e[1]), (4, e[4])])) == ErrorCode.INELIGIBLE_REPLICA
    # Fenced.
    await h.heartbeat(3, e[3], want_fence=True)
    assert code(await alter(h, [(1, e[1]), (3, e[3])])) == ErrorCode.INELIGIBLE_REPLICA
    # KIP-903: broker 2 rebooted (new epoch, even unfenced); the leader still proposes
    # it with the epoch it learned before the reboot.
    r2 = await h.register(2)
    await h.heartbeat(2, r2.broker_epoch)
    assert not h.image.brokers[2].fenced
    stale = await alter(h, [(1, e[1]), (2, e[2])])
    assert code(stale) == ErrorCode.INELIGIBLE_REPLICA
    assert h.partition("t").isr == [1]
    fresh = await alter(h, [(1, e[1]), (2, r2.broker_epoch)])
    assert code(fresh) == ErrorCode.NONE and h.partition("t").isr == [1, 2]


async def test_unregistered_replica_is_ineligible(harness) -> None:
    h = harness
    await h.start_broker(1)
    response = await h.handlers.create_topics(
        CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name="t",
                    assignments=[CreatableReplicaAssignment(partition_index=0, broker_ids=[1])],
                )
            ]
        )
    )
    assert response.topics[0].error_code == 0
    e1 = h.image.brokers[1].broker_epoch
    assert code(await alter(h, [(1, e1), (5, -1)])) == ErrorCode.INELIGIBLE_REPLICA


async def test_unsafe_hook_requires_test_faults_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_harness
) -> None:
    monkeypatch.delenv(TEST_FAULTS_ENV, raising=False)
    with pytest.raises(ValueError, match=TEST_FAULTS_ENV):
        ControllerConfig(unsafe_ignore_broker_epochs=True)
    monkeypatch.setenv(TEST_FAULTS_ENV, "1")
    h = await make_harness(tmp_path / "c", unsafe_ignore_broker_epochs=True)
    e = await setup(h)
    await alter(h, [(1, e[1])])
    r2 = await h.register(2)
    await h.heartbeat(2, r2.broker_epoch)
    # With the protection off the stale epoch is accepted: the KIP-903 hole.
    assert code(await alter(h, [(1, e[1]), (2, e[2])])) == ErrorCode.NONE
    assert h.partition("t").isr == [1, 2]


async def test_partition_listed_twice_is_refused(harness) -> None:
    h = harness
    e = await setup(h)
    current = h.partition("t")
    entry = AlterPartitionPartition(
        partition_index=0,
        leader_epoch=current.leader_epoch,
        new_isr_with_epochs=[BrokerState(broker_id=1, broker_epoch=e[1])],
        partition_epoch=current.partition_epoch,
    )
    response = await h.handlers.alter_partition(
        AlterPartitionRequest(
            broker_id=1,
            broker_epoch=e[1],
            topics=[AlterPartitionTopic(topic_name="t", partitions=[entry, entry])],
        )
    )
    first, second = response.topics[0].partitions
    assert first.error_code == 0 and second.error_code == ErrorCode.INVALID_REQUEST
    assert h.partition("t").partition_epoch == current.partition_epoch + 1
