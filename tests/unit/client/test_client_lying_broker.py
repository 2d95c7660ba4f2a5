"""The client library against a broker that lies (the in-test broker with one answer
overridden per test). The invariants: no call hangs past its timeout, no record is
handed out twice or a position taken from nonsense, nothing is reported done that the
answer does not say was done, and a broker's fault surfaces as a MinibrokerError that
says what was wrong (never KeyError, AssertionError or ZeroDivisionError from inside
the library). Each test failed before its fix (found by a hostile-broker session,
2026-11-30).

- ListOffsets naming a partition not asked (with a retriable error): ignored.
- ListOffsets answering offset -1 for earliest/latest: not a position (retried, then
  an error naming it), as Kafka's consumer leaves such a partition to retry.
- InitProducerId answering no id, or a bump that does not raise the epoch: a clear
  error, and the records waiting for the bump still expire at delivery_timeout_ms.
- A Fetch's diverging epoch: the validation's rules (rule 4 of client/epochs.py: a
  leader that never had our epoch lacks what we read in it); a newer epoch than ours
  is ignored instead of waited for.
- Metadata listing a topic with no partitions: the producer waits for real metadata
  up to max_block_ms, never divides by zero.
- Admin answers that leave out a topic or group asked for: an error naming it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from client_fakes import FakeBroker
from client_fakes import StartBroker
from client_fakes import poll_records
from client_fakes import produce_refused
from client_fakes import produce_values
from test_client_producer_consumer import diverging_fetch

from client.admin import AsyncAdmin
from client.admin import NewTopic
from client.answer_matching import result_for_each
from client.answer_matching import results_by_item
from client.consumer import AsyncConsumer
from client.descriptions import LeaderElection
from client.errors import LogTruncationError
from client.errors import MinibrokerError
from client.producer import AsyncProducer
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeleteGroupsRequest
from protocol.messages import DeleteGroupsResponse
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DeleteTopicsResponse
from protocol.messages import DescribedGroup
from protocol.messages import DescribeGroupsRequest
from protocol.messages import DescribeGroupsResponse
from protocol.messages import ElectLeadersRequest
from protocol.messages import ElectLeadersResponse
from protocol.messages import ElectLeadersResult
from protocol.messages import FetchRequest
from protocol.messages import InitProducerIdRequest
from protocol.messages import InitProducerIdResponse
from protocol.messages import ListOffsetsPartitionResponse
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopicResponse
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic
from protocol.messages import ProduceRequest

T0 = TopicPartition("t", 0)


# ------------------------------------------------------------ ListOffsets


async def test_list_offsets_answer_for_an_unasked_partition_with_a_retriable_error(
    start_broker: StartBroker,
) -> None:
    """A ListOffsets answer that also names a partition nobody asked about, with a
    retriable error: end_offsets() must answer for what it asked (or raise a
    MinibrokerError), never KeyError."""
    broker = await start_broker(2)

    def lying(req: ListOffsetsRequest) -> ListOffsetsResponse:
        good = broker.list_offsets(req)
        extra = ListOffsetsTopicResponse(
            name="t",
            partitions=[
                ListOffsetsPartitionResponse(
                    partition_index=1, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER
                )
            ],
        )
        return ListOffsetsResponse(topics=[*good.topics, extra])

    broker.overrides[ListOffsetsRequest] = lying
    async with AsyncConsumer(broker.address, request_timeout_ms=2000) as consumer:
        assert await consumer.end_offsets([T0]) == {T0: 0}


async def test_list_offsets_latest_answering_minus_one_is_not_a_position(
    start_broker: StartBroker,
) -> None:
    """ListOffsets(latest) answered NONE with offset -1 (UNKNOWN_OFFSET): Kafka's
    consumer does not take -1 as a position (the reset is retried); position() must
    never be -1."""
    broker = await start_broker(1)
    broker.overrides[ListOffsetsRequest] = lambda req: ListOffsetsResponse(
        topics=[
            ListOffsetsTopicResponse(
                name="t",
                partitions=[ListOffsetsPartitionResponse(partition_index=0, offset=-1)],
            )
        ]
    )
    async with AsyncConsumer(
        broker.address, request_timeout_ms=500, default_api_timeout_ms=1500
    ) as consumer:
        consumer.assign([T0])
        with pytest.raises(MinibrokerError, match="answered offset -1 for the latest offset"):
            await asyncio.wait_for(consumer.position(T0), 5)
        with pytest.raises(MinibrokerError, match="answered offset -1 for the latest offset"):
            await asyncio.wait_for(consumer.end_offsets([T0]), 5)


# ------------------------------------------------------------ producer id and epoch bump


async def test_init_producer_id_answering_no_id_is_a_clear_error(
    start_broker: StartBroker,
) -> None:
    """InitProducerId answered NONE with producer_id -1, epoch -1: start() should fail
    with a MinibrokerError (or fall back), not AssertionError."""
    broker = await start_broker(1)
    broker.overrides[InitProducerIdRequest] = lambda req: InitProducerIdResponse(
        producer_id=-1, producer_epoch=-1
    )
    producer = AsyncProducer(broker.address, max_block_ms=1000)
    try:
        with pytest.raises(MinibrokerError, match="producer id -1 epoch -1 with no error"):
            await producer.start()
    finally:
        await producer.close()


@pytest.mark.parametrize(
    "bump_answer",
    [
        # answered with the epoch it already has (the epoch must go up)
        lambda req: InitProducerIdResponse(
            producer_id=req.producer_id, producer_epoch=req.producer_epoch
        ),
        # a retriable error, again and again (max_block_ms is 60 s by default)
        lambda req: InitProducerIdResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE),
    ],
    ids=["same-epoch", "keeps-failing"],
)
async def test_records_waiting_for_an_epoch_bump_still_end_within_delivery_timeout(
    start_broker: StartBroker, bump_answer
) -> None:
    """The leader loses our producer state (UNKNOWN_PRODUCER_ID): the producer bumps
    its epoch (KIP-360). Whatever the bump's answer, the record waiting for it fails
    once delivery_timeout_ms passes; send_and_wait() never hangs."""
    broker = await start_broker(1)
    broker.overrides[InitProducerIdRequest] = lambda req: (
        bump_answer(req) if req.producer_id >= 0 else None
    )
    broker.overrides[ProduceRequest] = lambda req: produce_refused(ErrorCode.UNKNOWN_PRODUCER_ID)
    async with AsyncProducer(
        broker.address, linger_ms=0, delivery_timeout_ms=1000, request_timeout_ms=500
    ) as producer:
        start = time.monotonic()
        with pytest.raises(MinibrokerError, match="1000 ms passed since the batch was created"):
            await asyncio.wait_for(producer.send_and_wait("t", b"v", partition=0), 5)
        assert time.monotonic() - start < 3


# ------------------------------------------------------------ a Fetch's diverging epoch


async def read_two_epochs(broker: FakeBroker, consumer: AsyncConsumer) -> None:
    """Records 0-4 at leader epoch 1, 5-9 at epoch 2, all consumed: position 10,
    epoch 2, epoch 2 read from offset 5."""
    await produce_values(broker, [b"a%d" % i for i in range(5)])
    broker.topics["t"][0].become_leader(2)
    await produce_values(broker, [b"b%d" % i for i in range(5, 10)])
    consumer.assign([T0])
    consumer.seek(T0, 0)
    got = await poll_records(consumer, 10)
    assert [(r.offset, r.leader_epoch) for r in got] == [(i, 1 if i < 5 else 2) for i in range(10)]


async def test_a_fetch_diverging_epoch_older_than_ours_is_a_truncation_under_rule_4(
    start_broker: StartBroker,
) -> None:
    """Unclean election: the new leader never followed epoch 2 (its log has epoch 1 up
    to offset 13). A Fetch at 10 with last_fetched_epoch 2 is answered, as Kafka's leader
    does, diverging_epoch (1, 13). The records 5-9 of epoch 2 we returned are not in its
    log (client/epochs.py rule 4, EpochEndOffset.diverges_at): a truncation at 5, as the
    same answer to OffsetsForLeaderEpoch is in the validation path."""
    broker = await start_broker(1, leader_epoch=1)
    async with AsyncConsumer(broker.address, auto_offset_reset="none") as consumer:
        await read_two_epochs(broker, consumer)
        broker.overrides[FetchRequest] = diverging_fetch(broker, 1, 13)
        with pytest.raises(LogTruncationError) as info:
            for _ in range(20):
                await consumer.poll(timeout_ms=50)
        assert info.value.divergent_offsets == {T0: OffsetAndMetadata(5, "", 1)}


async def test_a_diverging_epoch_with_a_future_epoch_does_not_stall_the_consumer(
    start_broker: StartBroker,
) -> None:
    """A Fetch answer whose diverging_epoch names an epoch (99) newer than any leader's,
    ending past the position: nothing was truncated (Kafka's consumer keeps its position
    and its epoch, and goes on fetching). The consumer must go on reading 8 and 9."""
    broker = await start_broker(1, leader_epoch=2)
    await produce_values(broker, [b"%d" % i for i in range(10)])
    async with AsyncConsumer(
        broker.address, auto_offset_reset="earliest", default_api_timeout_ms=2000
    ) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, OffsetAndMetadata(8, leader_epoch=2))
        broker.overrides[FetchRequest] = diverging_fetch(
            broker, 99, 1000, high_watermark=10, times=1
        )
        got = await poll_records(consumer, 2, tries=60)
        assert [r.offset for r in got] == [8, 9]
        assert await consumer.position_with_epoch(T0) == OffsetAndMetadata(10, "", 2)


# ------------------------------------------------------------ a topic with no partitions


@pytest.mark.parametrize("key", [None, b"k"])
async def test_send_to_a_topic_listed_with_no_partitions_is_a_clear_error(
    start_broker: StartBroker, key: bytes | None
) -> None:
    """send() to a topic whose metadata lists no partitions (no error code): Kafka's
    producer waits up to max.block.ms and raises a TimeoutException; never
    ZeroDivisionError / IndexError from the partitioner."""
    broker = await start_broker(1)

    def no_partitions(req: MetadataRequest) -> MetadataResponse:
        good = broker.metadata(req)
        return MetadataResponse(
            brokers=good.brokers,
            cluster_id=good.cluster_id,
            controller_id=good.controller_id,
            topics=[MetadataTopic(name="t", topic_id="id-t", partitions=[])],
        )

    broker.overrides[MetadataRequest] = no_partitions
    async with AsyncProducer(broker.address, max_block_ms=500, delivery_timeout_ms=1000) as p:
        with pytest.raises(MinibrokerError, match="topic t not available after 500 ms"):
            await asyncio.wait_for(p.send_and_wait("t", b"v", key=key), 5)


# ------------------------------------------------------------ admin answers


async def test_create_topic_answered_for_another_topic_is_not_a_success(
    start_broker: StartBroker,
) -> None:
    """CreateTopics for "a" answered with a result only for "b": Kafka's AdminClient
    fails "a" (no result for it); create_topic("a") must not report "b" as created."""
    broker = await start_broker()
    broker.overrides[CreateTopicsRequest] = lambda req: CreateTopicsResponse(
        topics=[CreatableTopicResult(name="b", topic_id="id-b", num_partitions=1)]
    )
    async with AsyncAdmin(broker.address) as admin:
        with pytest.raises(MinibrokerError, match="CreateTopics answer has no result for topic a"):
            await admin.create_topic("a", 1, 1)


async def test_create_topics_missing_a_result_is_not_a_success(start_broker: StartBroker) -> None:
    broker = await start_broker()
    broker.overrides[CreateTopicsRequest] = lambda req: CreateTopicsResponse(
        topics=[CreatableTopicResult(name="a", topic_id="id-a", num_partitions=1)]
    )
    async with AsyncAdmin(broker.address) as admin:
        with pytest.raises(MinibrokerError, match="no result for topic b: it may or may not"):
            await admin.create_topics([NewTopic("a", 1, 1), NewTopic("b", 1, 1)])


async def test_delete_topics_answered_with_no_results_is_not_a_success(
    start_broker: StartBroker,
) -> None:
    broker = await start_broker(1)
    broker.overrides[DeleteTopicsRequest] = lambda req: DeleteTopicsResponse(responses=[])
    async with AsyncAdmin(broker.address) as admin:
        with pytest.raises(MinibrokerError, match="DeleteTopics answer has no result for topic t"):
            await admin.delete_topics(["t"])


async def test_group_answers_that_leave_the_group_out_are_not_a_success(
    start_broker: StartBroker,
) -> None:
    """DescribeGroups answered with no group (or another one) and DeleteGroups with no
    result: errors naming the group, never an IndexError or a silent success."""
    broker = await start_broker()
    broker.overrides[DescribeGroupsRequest] = lambda req: DescribeGroupsResponse(
        groups=[DescribedGroup(group_id="other", group_state="Stable")]
    )
    broker.overrides[DeleteGroupsRequest] = lambda req: DeleteGroupsResponse(results=[])
    async with AsyncAdmin(broker.address) as admin:
        with pytest.raises(
            MinibrokerError, match="DescribeGroups answer has no result for group g"
        ):
            await admin.describe_group("g")
        with pytest.raises(MinibrokerError, match="DeleteGroups answer has no result for group g"):
            await admin.delete_groups(["g"])


async def test_an_election_answer_that_leaves_a_partition_out_reports_it(
    start_broker: StartBroker,
) -> None:
    """ElectLeaders for t-0 and t-1 answered for t-1 and for t-7 (not asked): the result
    has t-0 with an error saying the answer left it out, t-1 as answered, no t-7."""
    broker = await start_broker(2)
    broker.overrides[ElectLeadersRequest] = lambda req: ElectLeadersResponse(
        results=[
            ElectLeadersResult(topic="t", partition=1, leader=1, leader_epoch=3),
            ElectLeadersResult(topic="t", partition=7, leader=1, leader_epoch=3),
        ]
    )
    t1 = TopicPartition("t", 1)
    async with AsyncAdmin(broker.address) as admin:
        got = await admin.elect_leaders([T0, t1], preferred=True)
    assert list(got) == [T0, t1]
    assert got[t1] == LeaderElection(1, 3, None)
    assert got[T0].leader == -1 and got[T0].error is not None
    assert "ElectLeaders answer has no result for partition" in str(got[T0].error)


def test_results_are_matched_to_what_was_asked() -> None:
    """client.answer_matching: results in the order asked, the first of duplicates,
    extras ignored, the first item left out named."""
    results = [("b", 2), ("x", 9), ("a", 1), ("b", 3)]
    assert result_for_each(["a", "b"], results, lambda r: r[0], what="t", request="R") == [
        ("a", 1),
        ("b", 2),
    ]
    found, missing = results_by_item(["a", "c", "d"], results, lambda r: r[0])
    assert found == {"a": ("a", 1)} and missing == ["c", "d"]
    with pytest.raises(MinibrokerError, match="R answer has no result for t c: it may or may"):
        result_for_each(["a", "c", "d"], results, lambda r: r[0], what="t", request="R")
