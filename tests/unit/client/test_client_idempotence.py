"""The idempotent producer against the in-test broker (which deduplicates by producer
id and sequence like a leader): numbering, lost answers, retry order, re-init."""

from __future__ import annotations

import asyncio
import logging

import pytest
from client_fakes import DROP_CONNECTION, FakeBroker

from client.producer import AsyncProducer
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import (
    InitProducerIdRequest,
    Message,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    ProduceTopicResponse,
)
from protocol.record_batch import iter_records, validate_batches

T0 = TopicPartition("t", 0)


@pytest.fixture
async def broker():
    b = FakeBroker()
    b.create_topic("t", 2, leader_epoch=1)
    await b.start()
    yield b
    await b.stop()


def sent_headers(broker: FakeBroker, partition: int = 0) -> list:
    out = []
    for r in broker.requests_of(ProduceRequest):
        for t in r.topics:
            for p in t.partitions:
                if p.index == partition:
                    out.extend(h for _, h in validate_batches(bytearray(p.records)))
    return out


def log_values(broker: FakeBroker, partition: int = 0) -> list[bytes | None]:
    data = b"".join(b for _, b in broker.topics["t"][partition].batches)
    return [r.value for _, r in iter_records(data)]


async def test_sequence_numbers_per_partition(broker: FakeBroker) -> None:
    async with AsyncProducer(broker.address, linger_ms=0, batch_size=1) as producer:
        assert producer.producer_id > 0 and producer.producer_epoch == 0
        for i in range(4):
            await producer.send_and_wait("t", b"a%d" % i, partition=0)
            await producer.send_and_wait("t", b"b%d" % i, partition=1)
        pid = producer.producer_id
    for partition in (0, 1):
        headers = sent_headers(broker, partition)
        assert [h.base_sequence for h in headers] == [0, 1, 2, 3]
        assert {(h.producer_id, h.producer_epoch) for h in headers} == {(pid, 0)}
    assert len(broker.requests_of(InitProducerIdRequest)) == 1


async def test_lost_answers_do_not_duplicate(broker: FakeBroker) -> None:
    drops = iter([True, False, True, False, False, True])

    def lose_some(body: Message) -> object:
        answer = broker.produce(body)  # appended...
        return DROP_CONNECTION if next(drops, False) else answer  # ...answer lost

    broker.overrides[ProduceRequest] = lose_some
    async with AsyncProducer(
        broker.address, linger_ms=0, retry_backoff_ms=5, request_timeout_ms=2000
    ) as producer:
        results = [await producer.send_and_wait("t", b"v%d" % i, partition=0) for i in range(6)]
    assert [md.offset for md in results] == list(range(6))
    assert log_values(broker) == [b"v%d" % i for i in range(6)]


async def test_retry_order_with_pipelined_batches(broker: FakeBroker) -> None:
    failed = False

    async def fail_first(body: Message) -> Message | None:
        nonlocal failed
        if failed:
            return None  # the default: dedup by sequence, OUT_OF_ORDER on a gap
        failed = True
        await asyncio.sleep(0.05)  # the later batches are in flight meanwhile
        return ProduceResponse(
            topics=[
                ProduceTopicResponse(
                    name="t",
                    partitions=[
                        ProducePartitionResponse(
                            index=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER
                        )
                    ],
                )
            ]
        )

    broker.overrides[ProduceRequest] = fail_first
    async with AsyncProducer(
        broker.address, linger_ms=0, batch_size=1, retry_backoff_ms=5
    ) as producer:
        futures = [await producer.send("t", b"v%d" % i, partition=0) for i in range(8)]
        results = await asyncio.gather(*futures)
    assert [md.offset for md in results] == list(range(8))
    assert log_values(broker) == [b"v%d" % i for i in range(8)]
    headers = sent_headers(broker)
    # Pipelined: several batches went out before the first one's answer.
    assert len(headers) > 8
    assert max(h.base_sequence for h in headers) == 7


async def test_lost_producer_state_reinitializes(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    async with AsyncProducer(broker.address, linger_ms=0, retry_backoff_ms=5) as producer:
        await producer.send_and_wait("t", b"x0", partition=0)
        await producer.send_and_wait("t", b"x1", partition=0)
        first = producer.producer_id
        broker.topics["t"][0].producers.clear()  # the leader forgot us
        with caplog.at_level(logging.WARNING, logger="client.producer"):
            md = await producer.send_and_wait("t", b"x2", partition=0)
        assert md.offset == 2
        assert producer.producer_id != first
    assert log_values(broker) == [b"x0", b"x1", b"x2"]
    assert len(broker.requests_of(InitProducerIdRequest)) == 2
    assert any("new producer id" in r.getMessage() for r in caplog.records)


async def test_unknown_producer_id_answer_reinitializes(broker: FakeBroker) -> None:
    once = iter([True])

    def unknown(body: Message) -> Message | None:
        if not next(once, False):
            return None
        return ProduceResponse(
            topics=[
                ProduceTopicResponse(
                    name="t",
                    partitions=[
                        ProducePartitionResponse(index=0, error_code=ErrorCode.UNKNOWN_PRODUCER_ID)
                    ],
                )
            ]
        )

    broker.overrides[ProduceRequest] = unknown
    async with AsyncProducer(broker.address, linger_ms=0, retry_backoff_ms=5) as producer:
        md = await producer.send_and_wait("t", b"y", partition=0)
    assert md.offset == 0
    assert len(broker.requests_of(InitProducerIdRequest)) == 2
    assert sent_headers(broker)[-1].base_sequence == 0


async def test_falls_back_when_the_broker_lacks_init_producer_id(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.supports_idempotence = False
    with caplog.at_level(logging.WARNING, logger="client.producer"):
        async with AsyncProducer(broker.address, linger_ms=0) as producer:
            md = await producer.send_and_wait("t", b"z", partition=0)
            assert producer.producer_id == -1
    assert md.offset == 0
    assert any("does not support InitProducerId" in r.getMessage() for r in caplog.records)
    assert sent_headers(broker)[0].producer_id == -1


def test_idempotence_config_rules() -> None:
    with pytest.raises(ValueError):
        AsyncProducer("127.0.0.1:1", acks=1, enable_idempotence=True)
    with pytest.raises(ValueError):
        AsyncProducer("127.0.0.1:1", max_in_flight=6)
    assert not AsyncProducer("127.0.0.1:1", acks=1).enable_idempotence
    assert AsyncProducer("127.0.0.1:1").enable_idempotence
