"""murmur2 and the default partitioner match Kafka's Java client."""

from __future__ import annotations

import random

import pytest

from client.partitioner import DefaultPartitioner
from client.partitioner import murmur2
from client.partitioner import partition_for_key
from client.partitioner import to_positive

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (signed int32, as in Java).
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# kafka-python's test_murmur2_java_compatibility: partition out of 1000, as the
# Java client's default partitioner places these keys.
KAFKA_PARTITIONS_OF_1000 = {
    b"": 681,
    b"a": 524,
    b"ab": 434,
    b"abc": 107,
    b"123456789": 566,
    b"\x00 ": 742,
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2.items())
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), KAFKA_PARTITIONS_OF_1000.items())
def test_partition_for_key_matches_kafka(key: bytes, expected: int) -> None:
    assert partition_for_key(key, 1000) == expected


def test_non_ascii_and_long_keys() -> None:
    assert -(2**31) <= murmur2(b"\xa4") < 2**31
    assert -(2**31) <= murmur2(b"\x81" * 1000) < 2**31


def test_to_positive_clears_the_sign_bit_like_java() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # abs() would overflow in Java


def test_keyed_records_always_land_on_the_same_partition() -> None:
    p = DefaultPartitioner()
    got = {p.partition("t", b"key-7", 12, lambda: []) for _ in range(20)}
    assert got == {partition_for_key(b"key-7", 12)}


def test_unkeyed_records_stick_until_the_batch_closes() -> None:
    p = DefaultPartitioner(random.Random(1))
    first = p.partition("t", None, 6, lambda: list(range(6)))
    assert all(p.partition("t", None, 6, lambda: list(range(6))) == first for _ in range(10))
    p.on_batch_closed("t", first)
    second = p.partition("t", None, 6, lambda: list(range(6)))
    assert second != first  # moves on to another partition
    assert 0 <= second < 6


def test_unkeyed_records_prefer_partitions_with_a_leader() -> None:
    p = DefaultPartitioner(random.Random(2))
    for _ in range(20):
        assert p.partition("t", None, 6, lambda: [4]) == 4
        p.on_batch_closed("t", 4)
