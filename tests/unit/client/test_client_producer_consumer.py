"""AsyncProducer and AsyncConsumer against the in-test broker: batching, leader
epochs in requests (KIP-320 / KIP-359), retries after fencing, positions; the
batch API (create_batch / send_batch)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from client_fakes import FakeBroker
from client_fakes import StartBroker

from client.admin import AsyncAdmin
from client.consumer import AsyncConsumer
from client.errors import IllegalStateError
from client.errors import KafkaTimeoutError
from client.errors import LogTruncationError
from client.errors import NoOffsetForPartitionError
from client.errors import OffsetOutOfRangeError
from client.errors import UnknownTopicOrPartitionError
from client.partitioner import partition_for_key
from client.producer import AsyncProducer
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.messages import EpochEndOffset
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopicResponse
from protocol.messages import ListOffsetsRequest
from protocol.messages import ProduceRequest
from protocol.record_batch import iter_headers

T0 = TopicPartition("t", 0)


@pytest.fixture
async def broker(start_broker: StartBroker) -> FakeBroker:
    return await start_broker(3, leader_epoch=2)


async def test_produce_batches_and_reports_offsets(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address, linger_ms=20) as producer:
        futures = [await producer.send("t", b"v%d" % i, partition=i % 3) for i in range(30)]
        results = await asyncio.gather(*futures)
    for i, md in enumerate(results):
        assert (md.topic, md.partition, md.offset) == ("t", i % 3, i // 3)
        assert md.leader_epoch == 2
        assert md.serialized_value_size == len(b"v%d" % i)
    produces = broker.requests_of(ProduceRequest)
    # Lingering put all 10 records of each partition in one batch, one request.
    assert len(produces) == 1
    for topic in produces[0].topics:
        for p in topic.partitions:
            assert p.current_leader_epoch == 2  # KIP-359: the cached epoch is sent


async def test_keyed_records_use_murmur2(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address) as producer:
        for key in (b"a", b"b", b"c", b"key-42"):
            md = await producer.send_and_wait("t", b"x", key=key)
            assert md.partition == partition_for_key(key, 3)


async def test_fenced_epoch_refreshes_metadata_and_retries(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address, retry_backoff_ms=5, linger_ms=0) as producer:
        await producer.send_and_wait("t", b"first", partition=0)
        # A new leader epoch the producer has not heard of yet.
        broker.topics["t"][0].leader_epoch = 3
        md = await producer.send_and_wait("t", b"second", partition=0)
    assert md.offset == 1
    assert md.leader_epoch == 3
    epochs = [
        r.topics[0].partitions[0].current_leader_epoch for r in broker.requests_of(ProduceRequest)
    ]
    assert epochs == [2, 2, 3]  # refused once (FENCED_LEADER_EPOCH), then the new epoch


async def test_a_lagging_leader_is_retried_until_the_delivery_timeout(broker: FakeBroker) -> None:
    async with AsyncProducer(
        broker.address, retry_backoff_ms=5, retry_backoff_max_ms=20, delivery_timeout_ms=1000
    ) as producer:
        await producer.send_and_wait("t", b"x", partition=1)
        # The leader lags behind our metadata: it keeps answering UNKNOWN_LEADER_EPOCH.
        broker.topics["t"][1].leader_epoch = 1
        with pytest.raises(KafkaTimeoutError, match="UNKNOWN_LEADER_EPOCH"):
            await producer.send_and_wait("t", b"y", partition=1)
    assert len(broker.requests_of(ProduceRequest)) > 3


async def test_unknown_topic_fails_after_max_block(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address, max_block_ms=100, retry_backoff_ms=10) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="minibroker topic create"):
            await producer.send("nope", b"x")
        with pytest.raises(UnknownTopicOrPartitionError, match="partition 7"):
            await producer.send("t", b"x", partition=7)


async def test_acks_zero_does_not_wait(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address, acks=0) as producer:
        md = await producer.send_and_wait("t", b"x", partition=0)
    assert md.offset == -1
    await asyncio.sleep(0.05)
    assert broker.topics["t"][0].log_end == 1


async def test_flush_sends_lingering_batches(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address, linger_ms=60_000) as producer:
        future = await producer.send("t", b"x", partition=2)
        await producer.flush(timeout_ms=5_000)
        assert future.done() and future.result().offset == 0


async def produce(broker: FakeBroker, per_partition: int) -> None:
    async with AsyncProducer(broker.address, batch_size=200) as producer:
        futures = [
            await producer.send("t", f"{p}-{i}".encode(), key=f"k{i}".encode(), partition=p)
            for i in range(per_partition)
            for p in range(3)
        ]
        await asyncio.gather(*futures)


async def consume_all(consumer: AsyncConsumer, n: int) -> list:
    out = []
    for _ in range(200):
        for records in (await consumer.poll(timeout_ms=50)).values():
            out.extend(records)
        if len(out) >= n:
            break
    return out


async def test_consume_from_beginning_in_order(broker: FakeBroker) -> None:
    await produce(broker, 50)
    # Small fetches: several rounds, each ending in a partial batch the consumer skips.
    async with AsyncConsumer(
        broker.address, auto_offset_reset="earliest", max_partition_fetch_bytes=1000
    ) as consumer:
        tps = [TopicPartition("t", p) for p in range(3)]
        consumer.assign(tps)
        records = await consume_all(consumer, 150)
        assert len(records) == 150
        for p in range(3):
            mine = [r for r in records if r.partition == p]
            assert [r.offset for r in mine] == list(range(50))
            assert [r.value for r in mine] == [f"{p}-{i}".encode() for i in range(50)]
            assert all(r.leader_epoch == 2 and r.key is not None for r in mine)
            assert await consumer.position(TopicPartition("t", p)) == 50
            assert consumer.highwater(TopicPartition("t", p)) == 50
    fetches = broker.requests_of(FetchRequest)
    # One request for all three partitions of the one leader, with the epochs.
    assert {p.partition for p in fetches[0].topics[0].partitions} == {0, 1, 2}
    assert all(p.current_leader_epoch == 2 for f in fetches for t in f.topics for p in t.partitions)
    later = [p for f in fetches[1:] for t in f.topics for p in t.partitions if p.fetch_offset > 0]
    assert later and all(p.last_fetched_epoch == 2 for p in later)


async def test_max_records_and_position_epoch(broker: FakeBroker) -> None:
    await produce(broker, 10)
    async with AsyncConsumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0])
        got = []
        while len(got) < 10:
            batch = await consumer.poll(timeout_ms=200, max_records=3)
            assert sum(len(v) for v in batch.values()) <= 3
            got.extend(batch.get(T0, []))
        assert [r.offset for r in got] == list(range(10))
        assert await consumer.position_with_epoch(T0) == OffsetAndMetadata(10, "", 2)


async def test_seek_skips_records_below_the_position(broker: FakeBroker) -> None:
    await produce(broker, 20)
    async with AsyncConsumer(broker.address) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 7)  # inside a batch: the batch starts below 7
        records = await consume_all(consumer, 13)
        assert [r.offset for r in records] == list(range(7, 20))


async def test_latest_is_the_default_and_seek_to_end(broker: FakeBroker) -> None:
    await produce(broker, 5)
    async with AsyncConsumer(broker.address) as consumer:
        consumer.assign([T0])
        assert await consumer.position(T0) == 5
        consumer.seek_to_beginning(T0)
        assert await consumer.position(T0) == 0
        consumer.seek_to_end()
        assert await consumer.position(T0) == 5
        assert await consumer.poll(timeout_ms=50) == {}
        assert await consumer.end_offsets([T0]) == {T0: 5}
        assert await consumer.beginning_offsets([T0]) == {T0: 0}


async def test_out_of_range_resets_or_raises(broker: FakeBroker) -> None:
    await produce(broker, 5)
    async with AsyncConsumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 100)
        records = await consume_all(consumer, 5)
        assert [r.offset for r in records] == list(range(5))
    async with AsyncConsumer(broker.address, auto_offset_reset="none") as consumer:
        consumer.assign([T0])
        with pytest.raises(NoOffsetForPartitionError):
            await consumer.poll()
        consumer.seek(T0, 100)
        with pytest.raises(OffsetOutOfRangeError) as info:
            for _ in range(20):
                await consumer.poll(timeout_ms=50)
        assert info.value.offsets == {T0: 100}


async def test_consumer_follows_a_new_leader_epoch(broker: FakeBroker) -> None:
    await produce(broker, 3)
    async with AsyncConsumer(
        broker.address, auto_offset_reset="earliest", retry_backoff_ms=5
    ) as consumer:
        consumer.assign([T0])
        assert len(await consume_all(consumer, 3)) == 3
        broker.topics["t"][0].become_leader(4)  # FENCED_LEADER_EPOCH until we refresh
        await produce(broker, 2)
        records = await consume_all(consumer, 2)
        assert [(r.offset, r.leader_epoch) for r in records] == [(3, 4), (4, 4)]
    epochs = [
        p.current_leader_epoch
        for f in broker.requests_of(FetchRequest)
        for t in f.topics
        for p in t.partitions
    ]
    assert 2 in epochs and 4 in epochs


async def test_admin_describe_topics(broker: FakeBroker) -> None:
    await produce(broker, 4)
    async with AsyncAdmin(broker.address) as admin:
        assert await admin.list_topics() == ["t"]
        (desc,) = await admin.describe_topics(["t"])
        assert desc.name == "t" and desc.replication_factor == 1
        assert [(p.partition, p.leader, p.leader_epoch) for p in desc.partitions] == [
            (0, 1, 2),
            (1, 1, 2),
            (2, 1, 2),
        ]
        assert all(p.log_start_offset == 0 and p.high_watermark == 4 for p in desc.partitions)
        with pytest.raises(UnknownTopicOrPartitionError, match="does not exist"):
            await admin.describe_topics(["missing"])
        cluster = await admin.describe_cluster()
        assert [b.node_id for b in cluster.brokers] == [1]
    offsets = broker.requests_of(ListOffsetsRequest)
    assert all(p.current_leader_epoch == 2 for r in offsets for t in r.topics for p in t.partitions)


def diverging_fetch(
    broker: FakeBroker,
    epoch: int,
    end_offset: int,
    *,
    high_watermark: int | None = None,
    times: int | None = None,
):
    """A Fetch handler answering partition t-0 with diverging epoch (`epoch`,
    `end_offset`) once the consumer states a last fetched epoch (`times` answers at
    most, then the broker's own)."""
    told = 0

    def handler(req: FetchRequest) -> FetchResponse | None:
        nonlocal told
        p = req.topics[0].partitions[0]
        if p.last_fetched_epoch < 0 or (times is not None and told >= times):
            return None  # the normal answer
        told += 1
        return FetchResponse(
            responses=[
                FetchTopicResponse(
                    topic="t",
                    partitions=[
                        FetchPartitionResponse(
                            partition_index=0,
                            high_watermark=end_offset if high_watermark is None else high_watermark,
                            diverging_epoch=EpochEndOffset(epoch=epoch, end_offset=end_offset),
                        )
                    ],
                )
            ]
        )

    return handler


@asynccontextmanager
async def consumer_told_of_divergence(
    broker: FakeBroker, auto_offset_reset: str
) -> AsyncIterator[AsyncConsumer]:
    """A consumer at offset 8 (epoch 2) of 10 records, whose fetches the leader answers
    with a diverging epoch: epoch 2 ended at offset 5."""
    await produce(broker, 10)
    async with AsyncConsumer(broker.address, auto_offset_reset=auto_offset_reset) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, OffsetAndMetadata(8, leader_epoch=2))
        broker.overrides[FetchRequest] = diverging_fetch(broker, 2, 5)
        yield consumer


async def test_diverging_epoch_raises_log_truncation_with_reset_none(broker: FakeBroker) -> None:
    async with consumer_told_of_divergence(broker, "none") as consumer:
        with pytest.raises(LogTruncationError) as info:
            for _ in range(20):
                await consumer.poll(timeout_ms=50)
        assert info.value.divergent_offsets == {T0: OffsetAndMetadata(5, "", 2)}
        assert info.value.positions == {T0: 8}


async def test_diverging_epoch_resumes_at_the_divergence_point(broker: FakeBroker) -> None:
    async with consumer_told_of_divergence(broker, "earliest") as consumer:
        await consumer.poll(timeout_ms=100)
        del broker.overrides[FetchRequest]
        assert await consumer.position(T0) == 5
        records = await consume_all(consumer, 5)
        assert [r.offset for r in records] == [5, 6, 7, 8, 9]


# ------------------------------------------------------------ create_batch / send_batch

T1 = TopicPartition("t", 1)


async def test_send_batch_lands_between_the_sends_around_it(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address, linger_ms=20) as producer:
        before = await producer.send("t", b"first", partition=1)
        batch = producer.create_batch()
        deltas = [batch.append(value=b"b%d" % i, key=b"k") for i in range(3)]
        assert deltas == [0, 1, 2] and batch.record_count() == 3
        whole = await producer.send_batch(batch, "t", partition=1)
        after = await producer.send("t", b"last", partition=1)
        first_md, batch_md, last_md = await asyncio.gather(before, whole, after)
    assert (first_md.offset, batch_md.offset, last_md.offset) == (0, 1, 4)
    assert (batch_md.topic, batch_md.partition, batch_md.leader_epoch) == ("t", 1, 2)
    async with AsyncConsumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([T1])
        got: list = []
        for _ in range(50):
            got.extend((await consumer.poll(timeout_ms=50)).get(T1, []))
            if len(got) >= 5:
                break
    assert [(r.offset, r.key, r.value) for r in got] == [
        (0, None, b"first"),
        (1, b"k", b"b0"),
        (2, b"k", b"b1"),
        (3, b"k", b"b2"),
        (4, None, b"last"),
    ]
    # Idempotent (acks=all): the batch carries the sequence after the send() before it.
    sequences = [
        (header.base_sequence, header.record_count)
        for request in broker.requests_of(ProduceRequest)
        for topic in request.topics
        for part in topic.partitions
        if part.index == 1
        for _, header in iter_headers(part.records)
    ]
    assert sequences == [(0, 1), (1, 3), (4, 1)]


async def test_a_full_batch_refuses_records_and_a_batch_is_sent_once(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address, batch_size=300) as producer:
        batch = producer.create_batch()
        added = 0
        while batch.append(value=bytes(100)) is not None:
            added += 1
            assert added < 10
        assert added == batch.record_count() == 2 and batch.size() <= 300
        with pytest.raises(ValueError, match="empty"):
            await producer.send_batch(producer.create_batch(), "t", partition=0)
        md = await (await producer.send_batch(batch, "t", partition=0))
        assert md.offset == 0
        with pytest.raises(IllegalStateError):
            await producer.send_batch(batch, "t", partition=0)
        with pytest.raises(IllegalStateError):
            batch.append(value=b"late")
        with pytest.raises(TypeError):
            producer.create_batch().append(value="text")  # type: ignore[arg-type]
