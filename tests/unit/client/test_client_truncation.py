"""KIP-320 consumer truncation detection against the in-test broker: after a leader
change (or a seek with an epoch) the consumer validates its position with
OffsetsForLeaderEpoch before fetching again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from client_fakes import FakeBroker
from client_fakes import StartBroker
from client_fakes import poll_records
from client_fakes import produce_values

from client.consumer import AsyncConsumer
from client.errors import LogTruncationError
from client.errors import OffsetOutOfRangeError
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.messages import FetchRequest
from protocol.messages import ListOffsetsRequest
from protocol.messages import OffsetForLeaderEpochRequest

T0 = TopicPartition("t", 0)


@pytest.fixture
async def broker(start_broker: StartBroker) -> FakeBroker:
    return await start_broker(1, leader_epoch=2)


async def unclean_election(broker: FakeBroker, keep: int, new_values: list[bytes]) -> None:
    """The new leader's log ends at `keep`; it then takes new writes at epoch 3."""
    part = broker.topics["t"][0]
    part.truncate_to(keep)
    part.become_leader(3)
    await produce_values(broker, new_values)


@asynccontextmanager
async def consumer_that_read(
    broker: FakeBroker, n: int, **config: Any
) -> AsyncIterator[AsyncConsumer]:
    """A consumer of T0 (retry_backoff_ms=5, `config`) that has read, from offset 0, the
    `n` records first produced at the old epoch."""
    await produce_values(broker, old(n))
    async with AsyncConsumer(broker.address, retry_backoff_ms=5, **config) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 0)
        assert len(await poll_records(consumer, n)) == n
        yield consumer


def old(n: int) -> list[bytes]:
    return [b"old-%d" % i for i in range(n)]


def new(n: int) -> list[bytes]:
    return [b"new-%d" % i for i in range(n)]


async def test_truncation_raises_with_the_exact_divergence_offset(broker: FakeBroker) -> None:
    async with consumer_that_read(broker, 10, auto_offset_reset="none") as consumer:
        # Offsets 6..9 are lost; the log grows back past the position (to 14).
        await unclean_election(broker, 6, new(8))
        with pytest.raises(LogTruncationError) as info:
            await poll_records(consumer, 1)
        assert info.value.divergent_offsets == {T0: OffsetAndMetadata(6, "", 2)}
        assert info.value.positions == {T0: 10}
        assert "t-0" in str(info.value) and "offset 6" in str(info.value)
        # The position is left alone: the application decides.
        assert (await consumer.position_with_epoch(T0)) == OffsetAndMetadata(10, "", 2)
    sent = [
        p
        for r in broker.requests_of(OffsetForLeaderEpochRequest)
        for t in r.topics
        for p in t.partitions
    ]
    assert (sent[-1].current_leader_epoch, sent[-1].leader_epoch) == (3, 2)


@pytest.mark.parametrize("policy", ["earliest", "latest"])
async def test_truncation_resumes_at_the_divergence_offset(
    broker: FakeBroker, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with consumer_that_read(broker, 10, auto_offset_reset=policy) as consumer:
        await unclean_election(broker, 6, new(8))
        with caplog.at_level(logging.WARNING, logger="client.consumer"):
            records = await poll_records(consumer, 8)
    # The new lineage from the divergence point: no duplicate, no skip.
    assert [(r.offset, r.value, r.leader_epoch) for r in records] == [
        (6 + i, b"new-%d" % i, 3) for i in range(8)
    ]
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("t-0" in m and "position 10" in m and "resuming from 6" in m for m in warning)


async def test_no_false_alarm_on_a_normal_failover(broker: FakeBroker) -> None:
    async with consumer_that_read(broker, 10, auto_offset_reset="none") as consumer:
        # A clean failover: the new leader has every record; new writes follow.
        broker.topics["t"][0].become_leader(3)
        await produce_values(broker, new(5))
        records = await poll_records(consumer, 5)
        assert [r.offset for r in records] == [10, 11, 12, 13, 14]
    assert broker.requests_of(OffsetForLeaderEpochRequest)  # it did validate


async def test_failover_in_the_middle_of_consumed_data(broker: FakeBroker) -> None:
    """The consumer is behind the log end when the leader changes: still valid."""
    await produce_values(broker, old(10))
    async with AsyncConsumer(
        broker.address, auto_offset_reset="none", retry_backoff_ms=5, max_poll_records=4
    ) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 0)
        first = await consumer.poll(timeout_ms=500)
        assert [r.offset for r in first[T0]] == [0, 1, 2, 3]
        broker.topics["t"][0].become_leader(3)
        await produce_values(broker, new(2))
        rest = await poll_records(consumer, 8)
        assert [r.offset for r in rest] == list(range(4, 12))


async def test_seek_with_epoch_is_validated_before_fetching(broker: FakeBroker) -> None:
    await produce_values(broker, old(10))
    await unclean_election(broker, 6, new(8))
    async with AsyncConsumer(broker.address, auto_offset_reset="none") as consumer:
        consumer.assign([T0])
        # Stored outside the cluster before the election: offset 9 at epoch 2.
        consumer.seek(T0, OffsetAndMetadata(9, "", 2))
        with pytest.raises(LogTruncationError) as info:
            await poll_records(consumer, 1)
        assert info.value.divergent_offsets[T0].offset == 6
    assert not broker.requests_of(FetchRequest)  # nothing fetched before validating


async def test_seek_with_epoch_valid_position(broker: FakeBroker) -> None:
    await produce_values(broker, old(10))
    async with AsyncConsumer(broker.address, auto_offset_reset="none") as consumer:
        consumer.assign([T0])
        consumer.seek(T0, OffsetAndMetadata(7, "", 2))
        records = await poll_records(consumer, 3)
        assert [r.offset for r in records] == [7, 8, 9]


async def test_seek_without_epoch_skips_validation(broker: FakeBroker) -> None:
    await produce_values(broker, old(10))
    async with AsyncConsumer(broker.address, auto_offset_reset="none") as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 8)
        assert [r.offset for r in await poll_records(consumer, 2)] == [8, 9]
    assert not broker.requests_of(OffsetForLeaderEpochRequest)


async def test_out_of_range_only_below_log_start(broker: FakeBroker) -> None:
    await produce_values(broker, old(10))
    broker.topics["t"][0].log_start = 5
    async with AsyncConsumer(broker.address, auto_offset_reset="none") as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 2)
        with pytest.raises(OffsetOutOfRangeError):
            await poll_records(consumer, 1)


async def test_committed_offset_with_epoch_is_validated_on_start(broker: FakeBroker) -> None:
    async with consumer_that_read(broker, 10, group_id="g", auto_offset_reset="none") as consumer:
        await consumer.commit()
        assert await consumer.committed(T0) == OffsetAndMetadata(10, "", 2)
    await unclean_election(broker, 6, new(8))
    async with AsyncConsumer(broker.address, group_id="g", auto_offset_reset="none") as again:
        again.assign([T0])
        with pytest.raises(LogTruncationError) as info:
            await poll_records(again, 1)
        assert info.value.divergent_offsets[T0].offset == 6


async def test_subscribe_and_iterate(broker: FakeBroker) -> None:
    broker.create_topic("u", 2, leader_epoch=0)
    await produce_values(broker, old(3))
    async with AsyncConsumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.subscribe(["t", "u"])
        got = []
        async with asyncio.timeout(5):
            async for record in consumer:
                got.append(record.offset)
                if len(got) == 3:
                    break
        assert got == [0, 1, 2]
        assert consumer.assignment() == {T0, TopicPartition("u", 0), TopicPartition("u", 1)}


async def test_offsets_for_times_carries_epochs(broker: FakeBroker) -> None:
    await produce_values(broker, old(3))
    async with AsyncConsumer(broker.address) as consumer:
        found = await consumer.offsets_for_times({T0: 0})
        assert found[T0] is not None and found[T0].leader_epoch == 2


async def test_stale_metadata_is_ignored_without_reset_or_validation(broker: FakeBroker) -> None:
    """KIP-232 (scenario 6): a broker with a lagging image answers Metadata with an
    older leader epoch; the consumer keeps its view, no reset, no validation."""
    async with consumer_that_read(broker, 5, auto_offset_reset="none") as consumer:
        broker.topics["t"][0].metadata_epoch = 1  # lagging image
        update = await consumer.cluster.refresh_metadata()
        assert update.stale == [T0]
        assert consumer.cluster.leader_for(T0) == (1, 2)
        await asyncio.sleep(0.1)  # its scheduled re-refreshes see the lagging image too
        assert consumer.cluster.leader_for(T0) == (1, 2)
        broker.topics["t"][0].metadata_epoch = None  # caught up (the producer needs it)
        await produce_values(broker, new(3))
        records = await poll_records(consumer, 3)
        assert [r.offset for r in records] == [5, 6, 7]
    assert not broker.requests_of(OffsetForLeaderEpochRequest)
    assert not broker.requests_of(ListOffsetsRequest)


async def test_a_leader_that_never_had_our_epoch_is_a_truncation(broker: FakeBroker) -> None:
    """Found by the chaos run (unclean divergence): the consumer read offsets 4-5 in
    leader epoch 3; the partition's next leader was elected from a replica that never
    followed epoch 3, whose epoch 2 runs on to offset 10. Asked for epoch 3 it answers
    (epoch 2, ends at 10): past the position 6, which KIP-320's rule alone takes for
    valid, and the records read at 4-5 were silently not in the log. The consumer
    knows epoch 3 began at 4 for it: the lineages part there."""
    await produce_values(broker, old(4))  # 0-3, epoch 2
    part = broker.topics["t"][0]
    part.become_leader(3)
    await produce_values(broker, new(2))  # 4-5, epoch 3
    async with AsyncConsumer(broker.address, retry_backoff_ms=5, auto_offset_reset="none") as c:
        c.assign([T0])
        c.seek(T0, 0)
        assert len(await poll_records(c, 6)) == 6
        # The replica that wins never saw epoch 3: its epoch 2 goes on from offset 4.
        part.truncate_to(4)
        part.epochs = [(2, 0)]
        part.leader_epoch = 2
        await produce_values(broker, [b"other-%d" % i for i in range(6)])  # 4-9, epoch 2
        part.become_leader(4)
        with pytest.raises(LogTruncationError) as info:
            await poll_records(c, 1)
        assert info.value.divergent_offsets == {T0: OffsetAndMetadata(4, "", 2)}
        assert info.value.positions == {T0: 6}
