"""KIP-320 rules the consumer keeps around leader changes, against the in-test broker
(client/epochs.py has the rules):

- a position whose leader epoch is newer than the leader the metadata shows (a seek or
  a committed offset with its epoch, reaching a deposed leader) waits for the metadata
  to reach that epoch: it never asks that leader, never resets, never raises before
  its bound, and resumes where it was;
- an "unknown epoch" answer is retried, never read as a truncation;
- records buffered before a leader epoch change (seen in metadata from any refresh)
  are dropped and the position validated before anything more is returned;
- OFFSET_NOT_AVAILABLE (a new leader whose high watermark lags) is retried by
  end_offsets() / seek_to_end(), so an end offset never goes back.
"""

from __future__ import annotations

import time

import pytest
from client_fakes import FakeBroker
from client_fakes import StartBroker
from client_fakes import poll_records
from client_fakes import produce_values

from client.cluster import ClusterClient
from client.consumer import AsyncConsumer
from client.epochs import EpochEndOffset
from client.epochs import ask_leader
from client.epochs import end_offsets_for_epochs
from client.errors import KafkaTimeoutError
from client.errors import LeaderEpochBehindError
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import EpochEndOffsetResult
from protocol.messages import FetchRequest
from protocol.messages import ListOffsetsPartitionResponse
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopicResponse
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import OffsetForLeaderTopicResult

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)


@pytest.fixture
async def broker(start_broker: StartBroker) -> FakeBroker:
    return await start_broker(2, leader_epoch=0)


def asked_epochs(broker: FakeBroker) -> list[tuple[int, int]]:
    """(current_leader_epoch, leader_epoch) of every OffsetsForLeaderEpoch sent."""
    return [
        (p.current_leader_epoch, p.leader_epoch)
        for r in broker.requests_of(OffsetForLeaderEpochRequest)
        for t in r.topics
        for p in t.partitions
    ]


# ------------------------------------------------------------ a position newer than the leader


@pytest.mark.parametrize("policy", ["earliest", "none"])
@pytest.mark.parametrize("stored", ["seek", "committed"])
async def test_a_position_newer_than_the_leader_waits_for_the_metadata(
    broker: FakeBroker, policy: str, stored: str
) -> None:
    """The consumer's position is (15, epoch 1); the broker it reaches is a deposed
    leader still at epoch 0 holding offsets 0-9. It must not ask that broker where
    epoch 1 ends (it would say "unknown"), reset to earliest (re-delivering 0-9) or
    raise; once the metadata shows the leader at epoch 1 it resumes at 15."""
    await produce_values(broker, [b"old-%d" % i for i in range(10)])
    async with AsyncConsumer(
        broker.address, group_id="g", auto_offset_reset=policy, retry_backoff_ms=5
    ) as consumer:
        consumer.assign([T0])
        if stored == "seek":
            consumer.seek(T0, OffsetAndMetadata(15, "", 1))
        else:
            await consumer.commit({T0: OffsetAndMetadata(15, "", 1)})
        assert await poll_records(consumer, 1, tries=10) == []
        assert not asked_epochs(broker), "asked a leader older than the position's epoch"
        assert not broker.requests_of(ListOffsetsRequest), "the position was reset"
        assert not broker.requests_of(FetchRequest)
        assert await consumer.position_with_epoch(T0) == OffsetAndMetadata(15, "", 1)

        # The metadata catches up: the leader at epoch 1 holds 0-14 and three more.
        part = broker.topics["t"][0]
        part.become_leader(1)
        await produce_values(broker, [b"new-%d" % i for i in range(8)])
        records = await poll_records(consumer, 3)
    assert [(r.offset, r.value) for r in records] == [
        (15, b"new-5"),
        (16, b"new-6"),
        (17, b"new-7"),
    ]
    assert asked_epochs(broker) == [(1, 1)]


async def test_other_partitions_flow_while_one_waits(broker: FakeBroker) -> None:
    await produce_values(broker, [b"p1-%d" % i for i in range(3)], partition=1)
    async with AsyncConsumer(
        broker.address, auto_offset_reset="none", retry_backoff_ms=5
    ) as consumer:
        consumer.assign([T0, T1])
        consumer.seek(T0, OffsetAndMetadata(15, "", 1))  # waits for epoch 1
        consumer.seek(T1, 0)
        records = await poll_records(consumer, 3)
    assert [(r.partition, r.offset) for r in records] == [(1, 0), (1, 1), (1, 2)]


async def test_the_wait_is_bounded_backs_off_and_keeps_the_position(broker: FakeBroker) -> None:
    """Metadata that never reaches the epoch (e.g. the topic was re-created): after
    default_api_timeout_ms poll() raises KafkaTimeoutError saying so, the position is
    kept; meanwhile metadata is refreshed with an exponential backoff, not in a loop."""
    async with AsyncConsumer(
        broker.address,
        auto_offset_reset="earliest",
        retry_backoff_ms=10,
        default_api_timeout_ms=600,
    ) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, OffsetAndMetadata(15, "", 1))
        before = len(broker.requests_of(MetadataRequest))
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError) as info:
            while time.monotonic() - started < 10:
                assert await consumer.poll(timeout_ms=100) == {}
        waited = time.monotonic() - started
        message = str(info.value)
        for part in ("t-0", "position 15 (leader epoch 1)", "default_api_timeout_ms=600", "seek()"):
            assert part in message, message
        assert 0.6 <= waited < 3, waited
        # 10, 20, 40, ... ms: a handful of refreshes, not one per poll iteration.
        refreshes = len(broker.requests_of(MetadataRequest)) - before
        assert refreshes <= 12, refreshes
        assert await consumer.position_with_epoch(T0) == OffsetAndMetadata(15, "", 1)
    assert not asked_epochs(broker)
    assert not broker.requests_of(ListOffsetsRequest)


# ------------------------------------------------------------ "unknown" is retried


async def test_an_unknown_epoch_answer_is_retried_not_read_as_truncation(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(1, leader_epoch=1)
    await produce_values(broker, [b"v-%d" % i for i in range(10)])
    unknown_answers = 3

    def not_yet(req: Message) -> Message | None:
        nonlocal unknown_answers
        if unknown_answers == 0:
            return None  # the leader's real answer
        unknown_answers -= 1
        assert isinstance(req, OffsetForLeaderEpochRequest)
        return OffsetForLeaderEpochResponse(
            topics=[
                OffsetForLeaderTopicResult(
                    topic="t",
                    partitions=[EpochEndOffsetResult(partition=0, leader_epoch=-1, end_offset=-1)],
                )
            ]
        )

    broker.overrides[OffsetForLeaderEpochRequest] = not_yet
    async with AsyncConsumer(
        broker.address, auto_offset_reset="earliest", retry_backoff_ms=5
    ) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, OffsetAndMetadata(5, "", 1))
        records = await poll_records(consumer, 5)
    assert [r.offset for r in records] == [5, 6, 7, 8, 9], "reset instead of retrying"
    assert unknown_answers == 0 and len(asked_epochs(broker)) == 4
    assert not broker.requests_of(ListOffsetsRequest)


async def test_the_shared_rule_for_the_spark_source(broker: FakeBroker) -> None:
    """client.epochs.end_offsets_for_epochs, which the Spark planner and executors
    use: a leader older than the asked epoch is not asked (retriable
    LeaderEpochBehindError, the metadata is refreshed); an "unknown" answer is the same
    retriable error, never a result; a leader at the epoch answers."""
    await produce_values(broker, [b"v-%d" % i for i in range(10)])
    cluster = ClusterClient(broker.address, retry_backoff_ms=5)
    await cluster.bootstrap()
    try:
        await cluster.wait_for_topics(["t"], timeout_ms=5000)
        results, errors = await end_offsets_for_epochs(cluster, {T0: 1})
        assert not results and isinstance(errors[T0], LeaderEpochBehindError)
        assert errors[T0].retriable and "leader epoch 1" in str(errors[T0])
        assert not asked_epochs(broker)
        # Asked at epoch 0 for epoch 1 anyway (a broker behind): "unknown" -> retry.
        outcome = await ask_leader(cluster, 1, {T0: (0, 1)})
        assert isinstance(outcome[T0], LeaderEpochBehindError), outcome
        assert "knows no leader epoch <= 1" in str(outcome[T0])
        broker.topics["t"][0].become_leader(1)
        await cluster.refresh_metadata()
        results, errors = await end_offsets_for_epochs(cluster, {T0: 1})
        assert results == {T0: EpochEndOffset(1, 10)} and not errors
    finally:
        await cluster.close()


# ------------------------------------------------------------ buffered records of an old lineage


async def test_buffered_records_are_dropped_when_the_leader_epoch_changes(
    broker: FakeBroker,
) -> None:
    """max_records=5 returns 0-4 and leaves 5-9 (old lineage, epoch 0) buffered; an
    unclean election keeps 0-4 and writes 5-9 anew at epoch 1; end_offsets() brings the
    new epoch into the metadata. The next polls must return the new 5-9 only."""
    await produce_values(broker, [b"old-%d" % i for i in range(10)])
    async with AsyncConsumer(
        broker.address, auto_offset_reset="none", retry_backoff_ms=5
    ) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 0)
        first = await consumer.poll(timeout_ms=1000, max_records=5)
        assert [r.offset for r in first[T0]] == [0, 1, 2, 3, 4]
        part = broker.topics["t"][0]
        part.truncate_to(5)
        part.become_leader(1)
        await produce_values(broker, [b"new-%d" % i for i in range(5)])
        assert await consumer.end_offsets([T0]) == {T0: 10}
        assert consumer.cluster.leader_for(T0) == (1, 1)
        records = await poll_records(consumer, 5)
    assert [(r.offset, r.value, r.leader_epoch) for r in records] == [
        (5 + i, b"new-%d" % i, 1) for i in range(5)
    ]
    assert asked_epochs(broker) == [(1, 0)]  # validated (5, epoch 0) first: valid


# ------------------------------------------------------------ OFFSET_NOT_AVAILABLE


def offset_not_available_for(seconds: float):
    """A ListOffsets override: OFFSET_NOT_AVAILABLE (a new leader whose high watermark
    has not reached its epoch start) for `seconds`, then the broker's own answer."""
    until = time.monotonic() + seconds

    def answer(req: Message) -> Message | None:
        if time.monotonic() >= until:
            return None
        assert isinstance(req, ListOffsetsRequest)
        return ListOffsetsResponse(
            topics=[
                ListOffsetsTopicResponse(
                    name=t.name,
                    partitions=[
                        ListOffsetsPartitionResponse(
                            partition_index=p.partition_index,
                            error_code=ErrorCode.OFFSET_NOT_AVAILABLE,
                        )
                        for p in t.partitions
                    ],
                )
                for t in req.topics
            ]
        )

    return answer


async def test_end_offsets_and_seek_to_end_wait_out_offset_not_available(
    broker: FakeBroker,
) -> None:
    await produce_values(broker, [b"v-%d" % i for i in range(10)])
    async with AsyncConsumer(
        broker.address, auto_offset_reset="none", retry_backoff_ms=10
    ) as consumer:
        consumer.assign([T0])
        broker.overrides[ListOffsetsRequest] = offset_not_available_for(0.8)
        assert await consumer.end_offsets([T0]) == {T0: 10}
        broker.overrides[ListOffsetsRequest] = offset_not_available_for(0.8)
        consumer.seek_to_end(T0)
        assert await consumer.position(T0) == 10


async def test_offset_not_available_past_the_bound_is_a_clear_timeout(broker: FakeBroker) -> None:
    async with AsyncConsumer(
        broker.address, auto_offset_reset="none", retry_backoff_ms=10, request_timeout_ms=500
    ) as consumer:
        broker.overrides[ListOffsetsRequest] = offset_not_available_for(60)
        with pytest.raises(KafkaTimeoutError) as info:
            await consumer.end_offsets([T0])
        message = str(info.value)
        assert "OFFSET_NOT_AVAILABLE" in message and "t-0" in message, message
        assert "request_timeout_ms=500" in message, message


async def test_position_waits_out_a_leader_change_for_default_api_timeout(
    broker: FakeBroker,
) -> None:
    """position() after a seek blocks as Kafka's does: a retriable ListOffsets answer
    longer than request_timeout_ms (here 0.3 s against 0.8 s) is retried up to
    default_api_timeout_ms. It gave up after request_timeout_ms before (the chaos final
    read stopped so during a leader change)."""
    await produce_values(broker, [b"v-%d" % i for i in range(10)])
    async with AsyncConsumer(
        broker.address,
        auto_offset_reset="none",
        retry_backoff_ms=10,
        request_timeout_ms=300,
        default_api_timeout_ms=5_000,
    ) as consumer:
        consumer.assign([T0])
        broker.overrides[ListOffsetsRequest] = offset_not_available_for(0.8)
        consumer.seek_to_end(T0)
        assert await consumer.position(T0) == 10
