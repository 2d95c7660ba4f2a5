"""The idempotent producer against the in-test broker (which deduplicates by producer
id and sequence like a leader): numbering, lost answers, retry order, and the KIP-360
epoch bump after the leader lost our state (per partition, never reordering)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from client_fakes import DROP_CONNECTION
from client_fakes import FakeBroker
from client_fakes import StartBroker
from client_fakes import produce_refused

from client.errors import KafkaTimeoutError
from client.errors import PossiblyWrittenError
from client.producer import AsyncProducer
from client.types import RecordMetadata
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import InitProducerIdRequest
from protocol.messages import Message
from protocol.messages import ProducePartitionResponse
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.messages import ProduceTopicResponse
from protocol.record_batch import iter_records
from protocol.record_batch import validate_batches

T0 = TopicPartition("t", 0)


@pytest.fixture
async def broker(start_broker: StartBroker) -> FakeBroker:
    return await start_broker(2, leader_epoch=1)


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
        return produce_refused(ErrorCode.NOT_LEADER_OR_FOLLOWER)

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
    # The leader did not know the producer yet, so the later batches were refused
    # UNKNOWN_PRODUCER_ID (an epoch bump). The first one's NOT_LEADER_OR_FOLLOWER may
    # follow an append, so it was resent under its old numbers; the other seven were
    # renumbered 0..6 under epoch 1, none skipped.
    assert [(h.producer_epoch, h.base_sequence) for h in headers].count((0, 0)) == 2
    assert {h.base_sequence for h in headers if h.producer_epoch == 1} == set(range(7))


async def test_lost_producer_state_bumps_the_epoch(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """KIP-360: UNKNOWN_PRODUCER_ID -> InitProducerId with our id and epoch -> the same
    id at epoch 1; the partition starts again at sequence 0."""
    async with AsyncProducer(broker.address, linger_ms=0, retry_backoff_ms=5) as producer:
        await producer.send_and_wait("t", b"x0", partition=0)
        await producer.send_and_wait("t", b"x1", partition=0)
        pid = producer.producer_id
        broker.topics["t"][0].producers.clear()  # the leader forgot us
        with caplog.at_level(logging.WARNING, logger="client.producer"):
            md = await producer.send_and_wait("t", b"x2", partition=0)
        assert md.offset == 2
        assert (producer.producer_id, producer.producer_epoch) == (pid, 1)
    assert log_values(broker) == [b"x0", b"x1", b"x2"]
    inits = broker.requests_of(InitProducerIdRequest)
    assert [(r.producer_id, r.producer_epoch) for r in inits] == [(-1, -1), (pid, 0)]
    assert [(h.producer_epoch, h.base_sequence) for h in sent_headers(broker)] == [
        (0, 0),
        (0, 1),
        (0, 2),  # refused: UNKNOWN_PRODUCER_ID
        (1, 0),
    ]
    assert any("bumping the epoch" in r.getMessage() for r in caplog.records)


async def test_unknown_producer_id_answer_bumps_the_epoch(broker: FakeBroker) -> None:
    once = iter([True])

    def unknown(body: Message) -> Message | None:
        if not next(once, False):
            return None
        return produce_refused(ErrorCode.UNKNOWN_PRODUCER_ID)

    broker.overrides[ProduceRequest] = unknown
    async with AsyncProducer(broker.address, linger_ms=0, retry_backoff_ms=5) as producer:
        md = await producer.send_and_wait("t", b"y", partition=0)
        assert producer.producer_epoch == 1
    assert md.offset == 0
    assert len(broker.requests_of(InitProducerIdRequest)) == 2
    assert (sent_headers(broker)[-1].producer_epoch, sent_headers(broker)[-1].base_sequence) == (
        1,
        0,
    )


async def test_epoch_bump_renumbers_pipelined_batches_in_order(broker: FakeBroker) -> None:
    """Five batches in flight when the leader loses our state: all come back refused,
    and are renumbered 0.. under the new epoch in send order (never reordered); the
    other partition moves to the new epoch at sequence 0 with its next batch."""
    forgot = False

    async def forget_once(body: Message) -> Message | None:
        nonlocal forgot
        if not forgot and len(broker.topics["t"][0].batches) >= 2:
            forgot = True
            broker.topics["t"][0].producers.clear()
        await asyncio.sleep(0.01)  # keep several batches in flight
        return None

    broker.overrides[ProduceRequest] = forget_once
    async with AsyncProducer(
        broker.address, linger_ms=0, batch_size=1, retry_backoff_ms=5
    ) as producer:
        await producer.send_and_wait("t", b"p1-a", partition=1)
        futures = [await producer.send("t", b"v%d" % i, partition=0) for i in range(12)]
        results = await asyncio.gather(*futures)
        await producer.send_and_wait("t", b"p1-b", partition=1)
        assert producer.producer_epoch == 1
    assert forgot
    assert [md.offset for md in results] == list(range(12))
    assert log_values(broker) == [b"v%d" % i for i in range(12)]
    assert log_values(broker, 1) == [b"p1-a", b"p1-b"]
    accepted = [
        (h.producer_epoch, h.base_sequence)
        for h in sent_headers(broker)
        if h.producer_epoch == 1 or h.base_sequence < 2
    ]
    assert accepted[:2] == [(0, 0), (0, 1)]
    epoch1 = [seq for epoch, seq in accepted if epoch == 1]
    assert epoch1 == sorted(epoch1) and epoch1[0] == 0
    assert [(h.producer_epoch, h.base_sequence) for h in sent_headers(broker, 1)] == [
        (0, 0),
        (1, 0),
    ]


async def test_old_epoch_retry_resolves_before_the_partition_moves(broker: FakeBroker) -> None:
    """Partition 1's answer is lost, and its retries are refused for a while, when
    partition 0 makes the producer bump its epoch: partition 1 resends that batch under
    its old epoch and sequence (the leader finds the duplicate) and only then moves to
    the new epoch. Renumbering it instead would have written it twice."""
    state = {"drop": True, "hold": False}

    def script(body: ProduceRequest) -> object:
        if not any(p.index == 1 for t in body.topics for p in t.partitions):
            return None
        if state["drop"]:
            state["drop"] = False
            state["hold"] = True
            broker.produce(body)  # appended...
            return DROP_CONNECTION  # ...the answer lost
        if not state["hold"]:
            return None
        # Partition 1 refused (retriable), the others served.
        others = [
            ProduceTopic(name=t.name, partitions=[p for p in t.partitions if p.index != 1])
            for t in body.topics
        ]
        served = broker.produce(ProduceRequest(acks=body.acks, timeout_ms=1, topics=others))
        served.topics[0].partitions.append(
            ProducePartitionResponse(index=1, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER)
        )
        return served

    async with AsyncProducer(
        broker.address, linger_ms=0, retry_backoff_ms=5, request_timeout_ms=2000
    ) as producer:
        await producer.send_and_wait("t", b"a0", partition=0)
        await producer.send_and_wait("t", b"b0", partition=1)
        broker.overrides[ProduceRequest] = script
        lost = await producer.send("t", b"b1", partition=1)
        while state["drop"]:
            await asyncio.sleep(0.01)
        broker.topics["t"][0].producers.clear()  # partition 0's leader forgets us
        md = await producer.send_and_wait("t", b"a1", partition=0)  # UNKNOWN -> bump
        assert (producer.producer_epoch, md.offset) == (1, 1)
        state["hold"] = False
        assert (await lost).offset == 1  # the duplicate's original offset
        await producer.send_and_wait("t", b"b2", partition=1)
    assert log_values(broker, 1) == [b"b0", b"b1", b"b2"]
    p1 = [(h.producer_epoch, h.base_sequence) for h in sent_headers(broker, 1)]
    assert p1[0] == (0, 0) and p1[-1] == (1, 0), p1
    assert set(p1[1:-1]) == {(0, 1)}, p1  # the lost one, resent under its old numbers


def refuse_partition_0(body: ProduceRequest, code: ErrorCode) -> ProduceResponse:
    """Every batch for partition 0 refused with `code` before any append."""
    return ProduceResponse(
        topics=[
            ProduceTopicResponse(
                name=t.name,
                partitions=[ProducePartitionResponse(index=p.index, error_code=code)],
            )
            for t in body.topics
            for p in t.partitions
        ]
    )


async def test_batch_in_doubt_is_not_renumbered_when_another_expires(broker: FakeBroker) -> None:
    """Invariant: a batch the leader may have written is never written again under a new
    epoch (issue 13, found by the chaos suite). Batches b (sequence 1) and a (sequence 2)
    are both appended and both answers are lost; b's retries are refused until its
    delivery timeout expires, a sequence gap that makes the producer bump its epoch. a
    is resent under its old epoch and sequence, so the leader answers with the offset
    it already has; renumbering it under the new epoch wrote it twice. b's future says
    its records may or may not have been written (they were)."""
    state = {"phase": "serve", "appended": 0}
    release = asyncio.Event()

    async def script(body: ProduceRequest) -> object:
        if state["phase"] == "lose":
            broker.produce(body)  # appended...
            state["appended"] += 1
            await release.wait()
            return DROP_CONNECTION  # ...and the answer lost
        if state["phase"] == "refuse":
            return refuse_partition_0(body, ErrorCode.NOT_ENOUGH_REPLICAS)
        return None

    def bump(body: InitProducerIdRequest) -> None:
        if body.producer_id >= 0:
            state["phase"] = "serve"  # the cluster heals as b expires
        return None

    async def until(condition: Callable[[], bool]) -> None:
        for _ in range(500):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the scripted broker never got there")

    broker.overrides[ProduceRequest] = script
    broker.overrides[InitProducerIdRequest] = bump
    async with AsyncProducer(
        broker.address,
        linger_ms=0,
        batch_size=1,
        retry_backoff_ms=5,
        retry_backoff_max_ms=20,
        request_timeout_ms=10_000,
        delivery_timeout_ms=2_000,
    ) as producer:
        assert (await producer.send_and_wait("t", b"v0", partition=0)).offset == 0
        state["phase"] = "lose"
        b = await producer.send("t", b"b", partition=0)
        await until(lambda: state["appended"] == 1)
        await asyncio.sleep(0.5)  # a is younger: it outlives b's delivery timeout
        a = await producer.send("t", b"a", partition=0)
        await until(lambda: state["appended"] == 2)
        state["phase"] = "refuse"
        release.set()
        b_outcome, a_outcome = await asyncio.gather(b, a, return_exceptions=True)
        await producer.send_and_wait("t", b"c", partition=0)
        assert producer.producer_epoch == 1
    assert log_values(broker) == [b"v0", b"b", b"a", b"c"]  # a once
    assert isinstance(b_outcome, PossiblyWrittenError), b_outcome
    assert "may or may not have been written" in str(b_outcome)
    assert isinstance(a_outcome, RecordMetadata) and a_outcome.offset == 2  # its only copy
    numbers = [(h.producer_epoch, h.base_sequence) for h in sent_headers(broker)]
    assert numbers.count((0, 2)) == 2, numbers  # a: first attempt, and resent as it was
    assert [n for n in numbers if n[0] == 1] == [(1, 0)], numbers  # only c at epoch 1


async def test_batch_in_doubt_fails_as_possibly_written_when_its_epoch_is_fenced(
    broker: FakeBroker,
) -> None:
    """Invariant: a batch the leader may have written is never renumbered. Its answer is
    lost, and its resend is refused INVALID_PRODUCER_EPOCH (the leader has seen a newer
    epoch of this producer id, whatever the reason): its old numbers can no longer be
    resolved, so it fails at once with PossiblyWrittenError instead of being written
    again under the next epoch."""
    script_state = {"drop": True}

    def script(body: ProduceRequest) -> object:
        if script_state["drop"]:
            script_state["drop"] = False
            broker.produce(body)  # appended...
            return DROP_CONNECTION  # ...the answer lost
        if producer.producer_epoch == 0:
            return refuse_partition_0(body, ErrorCode.INVALID_PRODUCER_EPOCH)
        return None

    async with AsyncProducer(
        broker.address, linger_ms=0, retry_backoff_ms=5, delivery_timeout_ms=10_000
    ) as producer:
        await producer.send_and_wait("t", b"v0", partition=0)
        broker.overrides[ProduceRequest] = script
        (v1,) = await asyncio.gather(
            await producer.send("t", b"v1", partition=0), return_exceptions=True
        )
        v2 = await producer.send_and_wait("t", b"v2", partition=0)
        assert producer.producer_epoch == 1
    assert log_values(broker) == [b"v0", b"v1", b"v2"]  # v1 once
    assert v2.offset == 2
    assert isinstance(v1, PossiblyWrittenError), v1
    assert "fenced the epoch" in str(v1) and "may or may not have been written" in str(v1)


async def test_a_batch_refused_until_its_delivery_timeout_is_not_called_possibly_written(
    broker: FakeBroker,
) -> None:
    """The other side of the rule: every attempt refused before the append (here
    NOT_ENOUGH_REPLICAS) means nothing was written, and the future says so with a plain
    KafkaTimeoutError."""
    broker.overrides[ProduceRequest] = lambda body: refuse_partition_0(
        body, ErrorCode.NOT_ENOUGH_REPLICAS
    )
    async with AsyncProducer(
        broker.address, linger_ms=0, retry_backoff_ms=5, delivery_timeout_ms=500
    ) as producer:
        with pytest.raises(KafkaTimeoutError, match="NOT_ENOUGH_REPLICAS") as raised:
            await producer.send_and_wait("t", b"v0", partition=0)
    assert not isinstance(raised.value, PossiblyWrittenError)
    assert log_values(broker) == []
