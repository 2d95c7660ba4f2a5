"""AsyncConsumer.poll_batches() against the in-test broker: the columns of each fetch
with exact offsets, keys and values, positions advanced as poll() advances them, poll()
and poll_batches() taking turns, a corrupt batch and a diverging epoch reported as
poll() reports them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from client_fakes import FakeBroker
from client_fakes import StartBroker
from test_client_consumer_decode import EPOCH
from test_client_consumer_decode import control_batch
from test_client_consumer_decode import put
from test_client_consumer_decode import put_overlapping_batches
from test_client_consumer_decode import put_two_good_then_a_corrupt_batch
from test_client_producer_consumer import consumer_told_of_divergence

from client.consumer import AsyncConsumer
from client.consumer import async_consumer
from client.consumer import fetcher
from client.errors import CorruptRecordError
from client.errors import LogTruncationError
from client.record_columns import ColumnBuffer
from client.record_columns import decode_columns
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.messages import FetchRequest
from protocol.record_batch import encode_batch

T0 = TopicPartition("t", 0)


@pytest.fixture
async def broker(start_broker: StartBroker) -> FakeBroker:
    return await start_broker(1, leader_epoch=EPOCH)


async def batches_until(consumer: AsyncConsumer, rows: int) -> list[ColumnBuffer]:
    out: list[ColumnBuffer] = []
    for _ in range(50):
        got = await consumer.poll_batches(timeout_ms=100)
        assert set(got) <= {T0}
        out.extend(got.values())
        if sum(len(c) for c in out) >= rows:
            break
    return out


async def test_columns_hold_exact_offsets_keys_values_and_move_the_position(
    broker: FakeBroker,
) -> None:
    put(broker, encode_batch([(b"k%d" % i, b"value-%d" % i) for i in range(40)]), 40)
    put(broker, control_batch(), 1)
    put(broker, encode_batch([(None, b"x"), (b"k", None)]), 2)
    put(broker, encode_batch([(None, b"after")]), 1)
    async with AsyncConsumer(broker.address, max_partition_fetch_bytes=1 << 20) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 3)  # inside the first batch: offsets 0-2 are left out
        columns = await batches_until(consumer, 40)
        offsets = [o for c in columns for o in c.offsets]
        assert offsets == [*range(3, 40), 41, 42, 43]
        assert [k for c in columns for k in c.keys] == [
            *(b"k%d" % i for i in range(3, 40)),
            None,
            b"k",
            None,
        ]
        assert [v for c in columns for v in c.values] == [
            *(b"value-%d" % i for i in range(3, 40)),
            b"x",
            None,
            b"after",
        ]
        assert all(e == EPOCH for c in columns for e in c.epochs())
        assert await consumer.position_with_epoch(T0) == OffsetAndMetadata(44, "", EPOCH)
        # poll() takes over at the position poll_batches() left.
        put(broker, encode_batch([(None, b"by poll")]), 1)
        for _ in range(50):
            records = (await consumer.poll(timeout_ms=100)).get(T0)
            if records:
                break
        assert [(r.offset, r.value) for r in records] == [(44, b"by poll")]


async def test_a_corrupt_batch_comes_after_the_good_columns(broker: FakeBroker) -> None:
    put_two_good_then_a_corrupt_batch(broker)
    async with AsyncConsumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0])
        columns = await batches_until(consumer, 2)
        assert [v for c in columns for v in c.values] == [b"a", b"b"]
        with pytest.raises(CorruptRecordError, match="at offset 2"):
            await batches_until(consumer, 1)


async def test_deserializers_are_refused(broker: FakeBroker) -> None:
    async with AsyncConsumer(broker.address, value_deserializer=bytes.decode) as consumer:
        with pytest.raises(ValueError, match="without key_deserializer"):
            await consumer.poll_batches()


async def test_a_diverging_epoch_raises_log_truncation(start_broker: StartBroker) -> None:
    broker = await start_broker(3, leader_epoch=2)
    async with consumer_told_of_divergence(broker, "none") as consumer:
        with pytest.raises(LogTruncationError) as info:
            for _ in range(20):
                await consumer.poll_batches(timeout_ms=50)
        assert info.value.divergent_offsets == {T0: OffsetAndMetadata(5, "", 2)}


async def test_the_next_fetch_is_on_its_way_when_poll_batches_returns(broker: FakeBroker) -> None:
    """Pipelining (issue 20 item 2), as Kafka's consumer: when poll_batches() returns a
    fetch, the fetch of what follows is already sent, so the broker's read and the
    network overlap the caller's work. A seek while it is out drops its answer: the
    records come from the seek, each once, in order."""
    one = encode_batch([(None, b"v%d" % i) for i in range(10)])
    for _ in range(3):
        put(broker, one, 10)
    async with AsyncConsumer(broker.address, max_partition_fetch_bytes=len(one)) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 0)
        first = await consumer.poll_batches(timeout_ms=1000)
        assert first[T0].offsets == list(range(10))
        await asyncio.sleep(0.1)  # the caller at work; no poll meanwhile
        asked = [
            p.fetch_offset
            for r in broker.requests_of(FetchRequest)
            for t in r.topics
            for p in t.partitions
        ]
        assert asked[-1] == 10, asked  # sent before the caller came back
        consumer.seek(T0, 5)  # the prefetched answer (offsets 10-19) is now stale
        offsets = [o for c in await batches_until(consumer, 25) for o in c.offsets]
        assert offsets == list(range(5, 30))


async def test_the_next_fetch_is_on_the_wire_before_a_fetch_is_decoded(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 item 2: a reader that polls again at once (no work between polls) only
    overlaps the decode with the broker's read if the next fetch goes out before the
    decode, not after it: poll_batches() moves the position to where the batch headers
    say the fetch ends, sends from there, then decodes. Every decode therefore finds a
    fetch in flight, and the rows still come each once, in order."""
    one = encode_batch([(None, b"v%d" % i) for i in range(10)])
    for _ in range(4):
        put(broker, one, 10)
    in_flight_at_decode: list[int] = []

    def decode_watched(*args: Any, **kwargs: Any) -> Any:
        conns = consumer._cluster._conns.values()
        in_flight_at_decode.append(sum(conn.in_flight for conn in conns))
        return decode_columns(*args, **kwargs)

    monkeypatch.setattr(fetcher, "decode_columns", decode_watched)
    async with AsyncConsumer(broker.address, max_partition_fetch_bytes=len(one)) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 0)
        offsets = [o for c in await batches_until(consumer, 40) for o in c.offsets]
    assert offsets == list(range(40))
    assert len(in_flight_at_decode) == 4
    assert all(n >= 1 for n in in_flight_at_decode), in_flight_at_decode


async def test_a_poll_batches_cancelled_before_its_decode_skips_nothing(
    broker: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """poll_batches() moves the position past a fetch before decoding it (so the next
    fetch can go out first). Cancelled at that await (a caller's timeout, the blocking
    Consumer's deadline), it hands nothing out, so it must put the position back: the
    records come on the next poll, each once, in order."""
    one = encode_batch([(None, b"v%d" % i) for i in range(10)])
    for _ in range(3):
        put(broker, one, 10)
    real_sleep = asyncio.sleep
    cancel_next_turn = [True]

    async def sleep_or_cancel(delay: float, *args: Any) -> Any:
        if delay == 0 and cancel_next_turn[0]:
            cancel_next_turn[0] = False
            raise asyncio.CancelledError
        return await real_sleep(delay, *args)

    async with AsyncConsumer(broker.address, max_partition_fetch_bytes=len(one)) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 0)
        monkeypatch.setattr(async_consumer.asyncio, "sleep", sleep_or_cancel)
        with pytest.raises(asyncio.CancelledError):
            await consumer.poll_batches(timeout_ms=1000)
        monkeypatch.setattr(async_consumer.asyncio, "sleep", real_sleep)
        assert await consumer.position(T0) == 0
        offsets = [o for c in await batches_until(consumer, 30) for o in c.offsets]
    assert offsets == list(range(30))


async def test_overlapping_batches_hand_each_offset_out_once(broker: FakeBroker) -> None:
    """poll_batches() as poll(): batches that overlap (5-14 after 0-9) give each
    offset once, in order."""
    put_overlapping_batches(broker)
    async with AsyncConsumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0])
        columns = await batches_until(consumer, 15)
        assert [o for c in columns for o in c.offsets] == list(range(15))
        assert [v for c in columns for v in c.values] == [b"a%d" % i for i in range(10)] + [
            b"b%d" % i for i in range(10, 15)
        ]
        assert await consumer.position(T0) == 15
