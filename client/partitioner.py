"""Choosing a partition for a record, as Kafka's Java producer does.

Keyed records: `toPositive(murmur2(key)) % num_partitions`, so a key lands on the same
partition as with the Java client, kafka-python or aiokafka. Records without a key:
the sticky partitioner (KIP-480): keep one partition per topic until its batch is
closed, then move to another, so unkeyed records still fill whole batches.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from collections.abc import Sequence

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: MurmurHash2, 32 bits, seed 0x9747b28c, returned as a
    signed int32 exactly like the Java method."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length & ~3
    for i in range(0, n4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's `Utils.toPositive`: clear the sign bit (not abs(), which differs)."""
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return to_positive(murmur2(key)) % num_partitions


class DefaultPartitioner:
    """murmur2 for keyed records; sticky per topic for the others."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._sticky: dict[str, int] = {}
        self._previous: dict[str, int] = {}
        self._rng = rng or random.Random()

    def partition(
        self,
        topic: str,
        key: bytes | None,
        num_partitions: int,
        available: Callable[[], Sequence[int]],
    ) -> int:
        """Partitions are 0..num_partitions-1 (as in Kafka); `available()` lists those
        with a leader, asked only when a new sticky partition is chosen."""
        if key is not None:
            return partition_for_key(key, num_partitions)
        sticky = self._sticky.get(topic)
        if sticky is None or sticky >= num_partitions:
            choices = available() or range(num_partitions)
            sticky = self._pick(choices, avoid=self._previous.get(topic))
            self._sticky[topic] = sticky
        return sticky

    def on_batch_closed(self, topic: str, partition: int) -> None:
        """The batch that unkeyed records were sticking to is full or sent: move on."""
        if self._sticky.get(topic) == partition:
            del self._sticky[topic]
            self._previous[topic] = partition

    def _pick(self, choices: Sequence[int], avoid: int | None) -> int:
        if len(choices) > 1 and avoid is not None:
            choices = [p for p in choices if p != avoid]
        return self._rng.choice(list(choices))
