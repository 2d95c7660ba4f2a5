"""The consumer's one-pass decode (batches straight into ConsumerRecords) against the
in-test broker: control batches skipped but counted, a fetch starting inside a batch,
deserializers, and the records before a corrupt batch returned before its error."""

from __future__ import annotations

import gc
import struct

import crc32c
import pytest
from client_fakes import FakeBroker
from client_fakes import StartBroker

from client.consumer import AsyncConsumer
from client.errors import CorruptRecordError
from client.types import ConsumerRecord
from client.types import TopicPartition
from protocol.record_batch import encode_batch
from protocol.record_batch import stamp

T0 = TopicPartition("t", 0)
EPOCH = 4


@pytest.fixture
async def broker(start_broker: StartBroker) -> FakeBroker:
    return await start_broker(1, leader_epoch=EPOCH)


def put(broker: FakeBroker, batch: bytes | bytearray, count: int) -> None:
    """Append an encoded batch to partition 0 as a leader would (offset, epoch stamped)."""
    part = broker.topics["t"][0]
    data = bytearray(batch)
    stamp(data, 0, part.log_end, EPOCH)
    part.batches.append((part.log_end, bytes(data)))
    part.log_end += count


def put_overlapping_batches(broker: FakeBroker) -> None:
    """A log no sound broker holds: a batch of offsets 0-9 (values a0..a9), then one
    of 5-14 (b5..b14) overlapping it; the fetch answers both."""
    put(broker, encode_batch([(None, b"a%d" % i) for i in range(10)]), 10)
    part = broker.topics["t"][0]
    part.log_end = 5
    put(broker, encode_batch([(None, b"b%d" % i) for i in range(5, 15)]), 10)


def put_two_good_then_a_corrupt_batch(broker: FakeBroker) -> None:
    """Records a, b (offsets 0-1), then a batch at offset 2 whose CRC does not match."""
    put(broker, encode_batch([(None, b"a"), (None, b"b")]), 2)
    bad = bytearray(encode_batch([(None, b"c")]))
    bad[-1] ^= 0xFF  # inside the CRC: the batch no longer matches it
    put(broker, bad, 1)


def control_batch() -> bytearray:
    """A one-record batch with the control bit set (a transaction marker's shape)."""
    data = bytearray(encode_batch([(b"\x00\x00\x00\x00", b"marker")]))
    (attributes,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attributes | 0x20)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))  # CRC from byte 21
    return data


async def poll_until(consumer: AsyncConsumer, n: int) -> list:
    out: list = []
    for _ in range(50):
        out.extend((await consumer.poll(timeout_ms=100)).get(T0, []))
        if len(out) >= n:
            break
    return out


async def test_control_batches_are_skipped_and_deserializers_applied(broker: FakeBroker) -> None:
    put(broker, encode_batch([(b"k0", b"0"), (None, b"1"), (b"k2", None)]), 3)
    put(broker, control_batch(), 1)
    put(broker, encode_batch([(b"k4", b"4"), (b"k5", b"5")]), 2)
    async with AsyncConsumer(
        broker.address,
        auto_offset_reset="earliest",
        key_deserializer=bytes.decode,
        value_deserializer=lambda v: int(v),
    ) as consumer:
        consumer.assign([T0])
        got = await poll_until(consumer, 5)
        assert [(r.offset, r.key, r.value) for r in got] == [
            (0, "k0", 0),
            (1, None, 1),
            (2, "k2", None),
            (4, "k4", 4),
            (5, "k5", 5),
        ]
        assert {(r.topic, r.partition, r.leader_epoch, r.headers) for r in got} == {
            ("t", 0, EPOCH, ())
        }
        assert await consumer.position(T0) == 6


async def test_a_fetch_inside_a_batch_skips_the_records_below_the_position(
    broker: FakeBroker,
) -> None:
    put(broker, encode_batch([(None, b"%d" % i) for i in range(5)]), 5)
    async with AsyncConsumer(broker.address) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 3)
        got = await poll_until(consumer, 2)
        assert [(r.offset, r.value) for r in got] == [(3, b"3"), (4, b"4")]


async def test_overlapping_batches_hand_each_offset_out_once(broker: FakeBroker) -> None:
    """A broker answering with batches that overlap (5-14 after 0-9): poll() hands out
    each offset once, in order (Kafka's consumer skips the records below its
    position), never 5-9 twice."""
    put_overlapping_batches(broker)
    async with AsyncConsumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0])
        got = await poll_until(consumer, 15)
        assert [r.offset for r in got] == list(range(15))
        assert [r.value for r in got] == [b"a%d" % i for i in range(10)] + [
            b"b%d" % i for i in range(10, 15)
        ]
        assert await consumer.position(T0) == 15


async def test_records_before_a_corrupt_batch_come_first_then_the_error(
    broker: FakeBroker,
) -> None:
    put_two_good_then_a_corrupt_batch(broker)
    async with AsyncConsumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0])
        got = await poll_until(consumer, 2)
        assert [r.value for r in got] == [b"a", b"b"]
        with pytest.raises(CorruptRecordError, match="at offset 2"):
            await poll_until(consumer, 1)


async def test_buffered_records_cost_the_gc_nothing_until_poll_hands_them_out(
    broker: FakeBroker,
) -> None:
    # A ConsumerRecord is a tuple subclass, which CPython's GC never untracks; the
    # fetch buffer holds exact tuples instead, untracked at the first collection, so
    # a fetch of thousands of records is not rescanned by every collection.
    put(broker, encode_batch([(b"k", b"%d" % i) for i in range(1000)]), 1000)
    gc.collect()  # records other tests left alive are not this test's
    before = {id(o) for o in gc.get_objects() if isinstance(o, ConsumerRecord)}
    async with AsyncConsumer(
        broker.address, auto_offset_reset="earliest", max_poll_records=1
    ) as consumer:
        consumer.assign([T0])
        first = await poll_until(consumer, 1)
        gc.collect()
        tracked = [
            o for o in gc.get_objects() if isinstance(o, ConsumerRecord) and id(o) not in before
        ]
        assert tracked == first  # only the one handed out; 999 more are buffered
        assert first == [ConsumerRecord("t", 0, 0, EPOCH, first[0].timestamp, b"k", b"0", ())]
        consumer.max_poll_records = 500
        rest = await poll_until(consumer, 999)
        assert [(r.offset, r.value) for r in rest] == [(i, b"%d" % i) for i in range(1, 1000)]
        assert all(type(r) is ConsumerRecord and r.leader_epoch == EPOCH for r in rest)
        assert await consumer.position(T0) == 1000
