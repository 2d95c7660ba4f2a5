"""The accumulator: records appended to per-partition batches (partitioner, linger,
batch size, the buffer-memory bound that blocks `send` up to max_block_ms), and whole
batches handed in by send_batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from client.errors import IllegalStateError
from client.errors import KafkaTimeoutError
from client.errors import MessageSizeTooLargeError
from client.errors import UnknownTopicOrPartitionError
from client.producer.batches import _RECORD_OVERHEAD
from client.producer.batches import ProducerBatch
from client.producer.batches import _Batch
from client.signatures import parameters_of
from client.types import Header
from client.types import RecordMetadata
from client.types import TopicPartition
from protocol.record_batch import HEADER_SIZE
from protocol.record_batch import BatchBuilder


class RecordAccumulator:
    """The accumulator: records appended to per-partition batches (partitioner, linger,"""

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[Header] | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; returns a future of its RecordMetadata."""
        if self._sender_error is not None or not self._started or self._closing:
            self._check_open()
        key_bytes = self._key_serializer(key) if self._key_serializer and key is not None else key
        value_bytes = (
            self._value_serializer(value) if self._value_serializer and value is not None else value
        )
        # The exact-type test first: isinstance against a union is the slower check.
        if not (
            (value_bytes is None or type(value_bytes) is bytes)
            and (key_bytes is None or type(key_bytes) is bytes)
        ) and (
            not isinstance(key_bytes, bytes | None) or not isinstance(value_bytes, bytes | None)
        ):
            raise TypeError("key and value must be bytes or None (or pass serializers)")
        size = _RECORD_OVERHEAD
        if key_bytes is not None:
            size += len(key_bytes)
        if value_bytes is not None:
            size += len(value_bytes)
        if headers:
            headers = tuple(headers)
            size += sum(len(k) + len(v or b"") + 8 for k, v in headers)
        else:
            headers = ()
        if size + HEADER_SIZE > self.max_request_size:
            raise MessageSizeTooLargeError(
                f"a record of about {size} bytes is larger than max_request_size "
                f"{self.max_request_size}",
                topic=topic,
            )
        count = self._cluster.metadata.partition_count(topic)
        if count is None:
            count = await self._wait_for_partition_count(topic)
        topic_entry = self._topic_entries.get(topic)
        if topic_entry is None or len(topic_entry[0]) != count:
            topic_entry = self._topic_entry(topic, count)
        if partition is None:
            partition = self._partitioner.partition(topic, key_bytes, count, topic_entry[1])
        elif not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"partition {partition} does not exist (the topic has {count})", topic=topic
            )
        if self._buffered + size > self.buffer_memory:
            await self._wait_for_buffer(size)
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        return self._append(
            topic_entry[0][partition], key_bytes, value_bytes, headers, timestamp_ms, size
        )

    def _topic_entry(
        self, topic: str, count: int
    ) -> tuple[tuple[TopicPartition, ...], Callable[[], list[int]]]:
        """The TopicPartitions of `topic` and its partitioner's `available` callable,
        made once per topic (and partition count), not per send()."""
        cluster = self._cluster
        entry = (
            tuple(TopicPartition(topic, p) for p in range(count)),
            lambda: cluster.metadata.available_partitions_for_topic(topic),
        )
        self._topic_entries[topic] = entry
        return entry

    def create_batch(self) -> ProducerBatch:
        """An empty batch for `send_batch()`, at most `batch_size` bytes (or one
        record), compressed as this producer's batches are."""
        return ProducerBatch(BatchBuilder(compression=self.compression), self.batch_size)

    async def send_batch(
        self, batch: ProducerBatch, topic: str, *, partition: int
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a batch from `create_batch()` for `partition` of `topic`; returns a
        future of the RecordMetadata of its first record (the batch's base offset, as
        aiokafka's). A batch is sent once; an empty one is refused."""
        self._check_open()
        if batch.sent:
            raise IllegalStateError("this batch was already sent")
        if batch.record_count() == 0:
            raise ValueError("send_batch() of an empty batch")
        size = batch.size()
        if size > self.max_request_size:
            raise MessageSizeTooLargeError(
                f"a batch of {size} bytes is larger than max_request_size {self.max_request_size}",
                topic=topic,
            )
        count = self._cluster.metadata.partition_count(topic)
        if count is None:
            count = await self._wait_for_partition_count(topic)
        if not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"partition {partition} does not exist (the topic has {count})", topic=topic
            )
        if self._buffered + size > self.buffer_memory:
            await self._wait_for_buffer(size)
        builder = batch._take()
        tp = TopicPartition(topic, partition)
        queue = self._batches[tp]
        if queue and not queue[-1].is_full:
            # The open batch of send() goes first: it holds records sent before this one.
            queue[-1].is_full = True
            self._partitioner.on_batch_closed(topic, partition)
        whole = _Batch(tp, builder, time.monotonic())
        whole.is_full = True
        future: asyncio.Future[RecordMetadata] = self._loop_create_future()
        whole.records.append(future)  # one future, resolved with the base offset
        whole.facts += (builder.base_timestamp, -1, -1)
        whole.size = size
        self._buffered += size
        queue.append(whole)
        self._incomplete.add(whole)
        self._wakeup.set()
        return future

    @parameters_of(send)
    async def send_and_wait(self, *args: Any, **kwargs: Any) -> RecordMetadata:
        """send() and wait for the record's RecordMetadata."""
        future = await self.send(*args, **kwargs)
        return await future

    async def _wait_for_topic(self, topic: str) -> None:
        await self._cluster.wait_for_topics([topic], timeout_ms=self.max_block_ms)

    async def _wait_for_partition_count(self, topic: str) -> int:
        """The topic's partition count once its metadata is in (up to max_block_ms)."""
        await self._wait_for_topic(topic)
        return self._cluster.metadata.partition_count(topic) or 0

    async def _wait_for_buffer(self, size: int) -> None:
        deadline = time.monotonic() + self.max_block_ms / 1000
        while self._buffered + size > self.buffer_memory and self._buffered > 0:
            self._buffer_freed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(
                    f"buffer_memory ({self.buffer_memory} bytes) still full after "
                    f"max_block_ms {self.max_block_ms}: the cluster is not keeping up"
                )
            try:
                async with asyncio.timeout(remaining):
                    await self._buffer_freed.wait()
            except TimeoutError:
                continue
            self._check_open()

    def _append(
        self,
        tp: TopicPartition,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[Header, ...],
        timestamp: int,
        size: int,
    ) -> asyncio.Future[RecordMetadata]:
        queue = self._batches[tp]
        batch = queue[-1] if queue else None
        if (
            batch is None
            or batch.is_full
            or (batch.records and batch.builder.estimated_size + size > self.batch_size)
        ):
            if batch is not None and not batch.is_full:
                batch.is_full = True
                self._partitioner.on_batch_closed(tp.topic, tp.partition)
            batch = _Batch(tp, BatchBuilder(compression=self.compression), time.monotonic())
            queue.append(batch)
            self._incomplete.add(batch)
        assert batch.builder is not None
        batch.builder.append(value, key, headers, timestamp)
        future: asyncio.Future[RecordMetadata] = self._loop_create_future()
        batch.records.append(future)
        batch.facts += (
            timestamp,
            -1 if key is None else len(key),
            -1 if value is None else len(value),
        )
        batch.size += size
        self._buffered += size
        if batch.builder.estimated_size >= self.batch_size:
            batch.is_full = True
            self._partitioner.on_batch_closed(tp.topic, tp.partition)
            self._wakeup.set()
        elif self.linger_ms == 0 or (len(queue) == 1 and len(batch.records) == 1):
            # A new batch: the sender must learn its linger deadline.
            self._wakeup.set()
        return future
