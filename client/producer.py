"""AsyncProducer: batches records per partition and sends them to the leaders.

aiokafka's shape: `fut = await producer.send(...)` queues a record (waiting only when
`buffer_memory` is full) and returns a future of its RecordMetadata;
`send_and_wait` does both. Records are appended to a per-partition RecordBatch v2
(`protocol.record_batch.BatchBuilder`) that is sent when it reaches `batch_size` or
has waited `linger_ms`; one Produce request per leader carries a batch for each of its
ready partitions.

Every partition in a Produce request carries the leader epoch this producer has
cached (KIP-359): a deposed leader that has not heard of its deposition refuses the
write, and a leader newer than our metadata answers UNKNOWN_LEADER_EPOCH. On those,
NOT_LEADER_OR_FOLLOWER and the other retriable errors the batch goes back to the front
of its partition's queue, metadata is refreshed, and it is retried with a bounded
exponential backoff until `delivery_timeout_ms` after it was created.

Idempotence (default with acks=all, as in Kafka 3): the producer asks for a producer
id once (InitProducerId) and numbers the records of each partition (base_sequence in
every batch, assigned when the batch is first sent). The leader drops a batch it has
already appended and answers DUPLICATE_SEQUENCE_NUMBER with the original offset,
which counts as success: a retry after a lost answer never writes twice. Up to
`max_in_flight` (<= 5) batches per partition are in flight; a batch that fails
retriably goes back into its queue in sequence order, the later ones in flight come
back OUT_OF_ORDER_SEQUENCE_NUMBER and are requeued behind it, and retries are sent one
at a time until the partition is back in order.

KIP-360: UNKNOWN_PRODUCER_ID and INVALID_PRODUCER_EPOCH (the leader lost our state,
e.g. after an unclean election), an OUT_OF_ORDER answer with no earlier batch pending,
and a sequenced batch that failed for good (a sequence gap) make the producer bump its
epoch: InitProducerId with its producer id and epoch returns the same id at the next
epoch (a new id once the epochs run out, or from a broker that cannot bump). Each
partition then moves to the new epoch on its own, once its in-flight batches are
answered and no batch that may have been written is left. A batch may have been
written once an attempt's outcome is unknown: its answer was lost, or it was one that
can follow the append (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND,
NOT_LEADER_OR_FOLLOWER; `protocol.errors.PRODUCE_REFUSED_BEFORE_APPEND` lists the
others). Such a batch is never renumbered: it is resent under its old epoch and
sequence until the leader answers it (a duplicate: its original offset) or proves it
absent with a sequence error, and when its delivery timeout expires first (or the
leader fenced its epoch) it fails with PossiblyWrittenError ("may or may not have been
written"; Kafka fails it with a TimeoutException, librdkafka as "possibly persisted").
Then the partition's unacknowledged batches are renumbered from 0 in queue order
(never reordered). The leaders fence the old epoch (INVALID_PRODUCER_EPOCH) once they
have seen the new one.
A broker that does not support InitProducerId (INVALID_REQUEST / UNSUPPORTED_VERSION)
makes the producer fall back to non-idempotent delivery with a WARNING.

`create_batch()` / `send_batch(batch, topic, partition=...)` (aiokafka's batch API)
send records built by the caller as one batch with one future: per record only the
batch encoding, no future, no partitioner, no size bookkeeping. The batch joins the
partition's queue behind the records sent before it, with the same idempotence,
retries and epoch handling as any other batch.

Without idempotence at most one batch per partition is in flight, so a retry never
overtakes a later batch, but a retry after a lost answer may write a batch twice, as
with Kafka's producer when enable.idempotence=false.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

from client.cluster import ClusterClient
from client.errors import (
    BrokerResponseError,
    IllegalStateError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    MinibrokerError,
    PossiblyWrittenError,
    UnknownTopicOrPartitionError,
    error_for,
)
from client.partitioner import DefaultPartitioner
from client.types import Header, RecordMetadata, TopicPartition
from protocol.errors import PRODUCE_REFUSED_BEFORE_APPEND, ErrorCode
from protocol.messages import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
)
from protocol.record_batch import (
    HEADER_SIZE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchBuilder,
    Compression,
)

log = logging.getLogger(__name__)

# Per-record overhead in a batch besides key, value and headers (varints, attributes).
_RECORD_OVERHEAD = 24
_MAX_IN_FLIGHT_IDEMPOTENT = 5  # the leader remembers the last 5 batches per producer
_SEQUENCE_WRAP = 2**31
_MAX_PRODUCER_EPOCH = 2**15 - 1  # int16: at the last epoch a new producer id is needed
_SEQUENCE_ERRORS = frozenset(
    {
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode.UNKNOWN_PRODUCER_ID,
        ErrorCode.INVALID_PRODUCER_EPOCH,
    }
)


def parse_acks(acks: int | str) -> int:
    """'all' / -1 / 0 / 1 (also as strings) -> -1, 0 or 1."""
    text = str(acks).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"acks must be 0, 1 or all (-1), not {acks!r}")


class ProducerBatch:
    """Records to send as one batch with `AsyncProducer.send_batch` (make it with
    `AsyncProducer.create_batch()`, as in aiokafka). Keys and values are bytes (no
    serializers). Encoded as they are appended."""

    __slots__ = ("_builder", "_max_size")

    def __init__(self, builder: BatchBuilder, max_size: int) -> None:
        self._builder = builder
        self._max_size = max_size

    def append(
        self,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        timestamp: int | None = None,
        headers: Sequence[Header] = (),
    ) -> int | None:
        """Add a record: its offset delta in the batch, or None when the batch is full
        (`max_size` bytes; the first record always fits). Timestamps default to now."""
        builder = self._builder
        if builder is None:
            raise IllegalStateError("this batch was already sent")
        if not (
            (value is None or type(value) is bytes) and (key is None or type(key) is bytes)
        ) and (not isinstance(key, bytes | None) or not isinstance(value, bytes | None)):
            raise TypeError("key and value must be bytes or None")
        size = builder.estimated_size + _RECORD_OVERHEAD
        if key is not None:
            size += len(key)
        if value is not None:
            size += len(value)
        if headers:
            size += sum(len(k) + len(v or b"") + 8 for k, v in headers)
        if size > self._max_size and len(builder):
            return None
        return builder.append(value, key, headers, timestamp)

    @property
    def sent(self) -> bool:
        return self._builder is None

    def record_count(self) -> int:
        return len(self._builder) if self._builder is not None else 0

    def size(self) -> int:
        """Bytes of the batch so far (uncompressed, header included)."""
        return self._builder.estimated_size if self._builder is not None else 0

    def _take(self) -> BatchBuilder:
        """The builder, once: a batch is sent at most once."""
        builder = self._builder
        if builder is None:
            raise IllegalStateError("this batch was already sent")
        self._builder = None  # type: ignore[assignment]
        return builder


class _Batch:
    __slots__ = (
        "attempts",
        "base_sequence",
        "builder",
        "created",
        "done",
        "facts",
        "is_full",
        "leader_epoch",
        "maybe_written",
        "payload",
        "records",
        "retry_at",
        "size",
        "tp",
    )

    def __init__(self, tp: TopicPartition, builder: BatchBuilder, now: float) -> None:
        self.tp = tp
        self.builder: BatchBuilder | None = builder
        self.payload: bytes | None = None
        # One future per record (its offset delta is its index), and per record three
        # ints in a flat list: timestamp, key size, value size. No tuple per record:
        # a long-lived tuple holding a future is one more object for every GC pass
        # while the batch waits (profiled: about half of the per-record GC cost).
        self.records: list[asyncio.Future[RecordMetadata]] = []
        self.facts: list[int] = []
        self.created = now
        self.attempts = 0
        self.retry_at = 0.0
        self.size = 0
        self.is_full = False
        self.leader_epoch = -1
        self.base_sequence: int | None = None  # assigned when first sent (idempotence)
        # An attempt reached a leader and its outcome is unknown (a lost answer, or an
        # answer that may follow the append). Sticky: a later refusal says nothing about
        # that attempt. Only a sequence error from the leader clears it (not in its log).
        self.maybe_written = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def record_count(self) -> int:
        return len(self.builder) if self.builder is not None else len(self.records)


class AsyncProducer:
    """Asynchronous producer. `async with AsyncProducer(...) as p:` or start()/close()."""

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str] = "127.0.0.1:9092",
        *,
        client_id: str = "minibroker-producer",
        acks: int | str = "all",
        compression_type: str | None = None,
        batch_size: int = 16_384,
        linger_ms: int = 5,
        max_request_size: int = 1_048_576,
        buffer_memory: int = 32 * 1024 * 1024,
        max_block_ms: int = 60_000,
        request_timeout_ms: int = 30_000,
        delivery_timeout_ms: int = 120_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        metadata_max_age_ms: int = 300_000,
        key_serializer: Callable[[Any], bytes] | None = None,
        value_serializer: Callable[[Any], bytes] | None = None,
        partitioner: DefaultPartitioner | None = None,
        enable_idempotence: bool | None = None,
        max_in_flight: int = 5,
    ) -> None:
        self.acks = parse_acks(acks)
        if enable_idempotence is None:
            enable_idempotence = self.acks == -1
        if enable_idempotence and self.acks != -1:
            raise ValueError("enable_idempotence=True needs acks='all'")
        if not 1 <= max_in_flight <= (_MAX_IN_FLIGHT_IDEMPOTENT if enable_idempotence else 100):
            raise ValueError(
                f"max_in_flight must be 1..{_MAX_IN_FLIGHT_IDEMPOTENT} with idempotence"
            )
        self.enable_idempotence = enable_idempotence
        self.max_in_flight = max_in_flight
        # Whether this producer numbers its batches (False after falling back).
        self._idempotent = enable_idempotence
        self._producer_id = NO_PRODUCER_ID
        self._producer_epoch = NO_PRODUCER_EPOCH
        self._next_seq: dict[TopicPartition, int] = {}
        # (producer id, epoch) each partition's sequence numbers belong to: a partition
        # moves to a new epoch only once its batches of the old one are resolved.
        self._seq_owner: dict[TopicPartition, tuple[int, int]] = {}
        # Partitions whose unacknowledged batches were refused for their sequence (state
        # lost, a gap): renumbered from 0 under the next epoch.
        self._resets: set[TopicPartition] = set()
        self._need_bump = False
        self._bump_task: asyncio.Task[None] | None = None
        self.compression = Compression.from_name(compression_type)
        if batch_size < 1 or linger_ms < 0 or max_request_size <= HEADER_SIZE:
            raise ValueError("batch_size >= 1, linger_ms >= 0 and max_request_size > 61 needed")
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.max_request_size = max_request_size
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._partitioner = partitioner or DefaultPartitioner()
        # Per topic: its TopicPartitions and the partitioner's `available` callable.
        self._topic_entries: dict[
            str, tuple[tuple[TopicPartition, ...], Callable[[], list[int]]]
        ] = {}
        # The loop's create_future, bound once in start() (one record, one future).
        self._loop_create_future: Callable[[], asyncio.Future[Any]] = lambda: (
            asyncio.get_running_loop().create_future()
        )
        self._cluster = ClusterClient(
            bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms + 5_000,  # the broker waits timeout_ms
            retry_backoff_ms=retry_backoff_ms,
        )
        self._batches: dict[TopicPartition, deque[_Batch]] = defaultdict(deque)
        # Batches in flight per partition, in sequence order.
        self._in_flight: dict[TopicPartition, list[_Batch]] = {}
        self._incomplete: set[_Batch] = set()
        self._buffered = 0
        self._buffer_freed = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._flushing = 0
        self._closing = False
        self._started = False
        self._sender: asyncio.Task[None] | None = None
        self._sender_error: BaseException | None = None
        self._request_tasks: set[asyncio.Task[None]] = set()

    @property
    def cluster(self) -> ClusterClient:
        """The metadata cache and connection pool."""
        return self._cluster

    # ------------------------------------------------------------ lifecycle

    @property
    def producer_id(self) -> int:
        """The producer id from InitProducerId (-1: not idempotent)."""
        return self._producer_id if self._idempotent else NO_PRODUCER_ID

    @property
    def producer_epoch(self) -> int:
        """The producer epoch from InitProducerId (-1: not idempotent)."""
        return self._producer_epoch if self._idempotent else NO_PRODUCER_EPOCH

    async def start(self) -> None:
        """Connect, and get a producer id when idempotent."""
        await self._cluster.bootstrap()
        if self._idempotent:
            await self._init_producer_id()
        self._loop_create_future = asyncio.get_running_loop().create_future
        self._sender = asyncio.get_running_loop().create_task(
            self._run_sender(), name="minibroker-producer-sender"
        )
        self._started = True

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def flush(self, timeout_ms: int | None = None) -> None:
        """Send everything buffered now and wait until each batch is acknowledged or
        failed (bounded by delivery_timeout_ms, or `timeout_ms`)."""
        self._check_open()
        pending = [b.done for b in self._incomplete]
        if not pending:
            return
        self._flushing += 1
        self._wakeup.set()
        try:
            timeout = None if timeout_ms is None else timeout_ms / 1000
            _, not_done = await asyncio.wait(pending, timeout=timeout)
            if not_done:
                raise KafkaTimeoutError(
                    f"flush: {len(not_done)} batches still unacknowledged after {timeout_ms} ms"
                )
        finally:
            self._flushing -= 1

    async def close(self, timeout_ms: int | None = None) -> None:
        """Flush, then stop. Records not delivered by then fail."""
        if not self._started:
            await self._cluster.close()
            return
        try:
            if self._sender_error is None:
                await self.flush(timeout_ms)
        except MinibrokerError as exc:
            log.warning("closing producer with undelivered records: %s", exc)
        finally:
            self._closing = True
            self._started = False
            if self._sender is not None:
                self._sender.cancel()
                await asyncio.gather(self._sender, return_exceptions=True)
            if self._bump_task is not None:
                self._bump_task.cancel()
            for task in list(self._request_tasks):
                task.cancel()
            await asyncio.gather(*self._request_tasks, return_exceptions=True)
            closed = IllegalStateError("the producer was closed before the record was delivered")
            for batch in list(self._incomplete):
                self._fail(batch, closed)
            await self._cluster.close()

    def _check_open(self) -> None:
        if self._sender_error is not None:
            raise IllegalStateError(f"the producer's sender failed: {self._sender_error}")
        if not self._started or self._closing:
            raise IllegalStateError("the producer is not started (await start()) or is closed")

    # ------------------------------------------------------------ sending

    async def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of `topic` (waiting up to max_block_ms for it)."""
        self._check_open()
        await self._wait_for_topic(topic)
        return set(self._cluster.metadata.partitions_for_topic(topic) or ())

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

    async def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[Header] | None = None,
    ) -> RecordMetadata:
        """send() and wait for the record's RecordMetadata."""
        future = await self.send(topic, value, key, partition, timestamp_ms, headers)
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

    # ------------------------------------------------------------ the sender

    async def _run_sender(self) -> None:
        try:
            while True:
                self._wakeup.clear()
                delay = self._send_ready(time.monotonic())
                try:
                    async with asyncio.timeout(delay):
                        await self._wakeup.wait()
                except TimeoutError:
                    pass
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: fail loudly rather than hang callers
            log.exception("producer sender crashed")
            self._sender_error = exc
            for batch in list(self._incomplete):
                self._fail(batch, IllegalStateError(f"the producer's sender failed: {exc}"))
            raise

    def _send_ready(self, now: float) -> float | None:
        """Send every ready batch; return seconds until the next batch may be ready
        (None: nothing pending)."""
        meta = self._cluster.metadata
        if now * 1000 - meta.last_refresh_ms > self.metadata_max_age_ms:
            self._cluster.request_refresh()
        linger = self.linger_ms / 1000
        delivery_timeout = self.delivery_timeout_ms / 1000
        next_check: float | None = None
        by_leader: dict[int, list[_Batch]] = defaultdict(list)
        request_bytes: dict[int, int] = defaultdict(int)
        urgent = self._flushing > 0 or self._closing
        if self._need_bump:
            self._start_epoch_bump()
        for tp, queue in list(self._batches.items()):
            while queue and now - queue[0].created > delivery_timeout:
                expired = queue.popleft()
                why = (
                    f"expiring {expired.record_count} record(s) for {tp}: "
                    f"{self.delivery_timeout_ms} ms passed since the batch was created "
                    f"({expired.attempts} attempts)"
                )
                self._fail(expired, self._give_up_error(expired, why))
            if self._need_bump or (self._idempotent and not self._on_current_epoch(tp, queue)):
                continue
            limit = self.max_in_flight if self._idempotent else 1
            while queue:
                in_flight = len(self._in_flight.get(tp, ()))
                batch = queue[0]
                if in_flight >= limit or (batch.base_sequence is not None and in_flight):
                    break  # a retry goes alone, so the partition's order is restored
                if batch.retry_at > now:
                    next_check = _earliest(next_check, batch.retry_at - now)
                    break
                ready = batch.is_full or len(queue) > 1 or urgent or now - batch.created >= linger
                if not ready:
                    next_check = _earliest(next_check, batch.created + linger - now)
                    break
                try:
                    leader, epoch = self._cluster.leader_for(tp)
                except BrokerResponseError as exc:
                    log.debug("no leader for %s yet (%s); refreshing metadata", tp, exc)
                    self._cluster.add_topics([tp.topic])
                    self._cluster.request_refresh()
                    batch.retry_at = now + self.retry_backoff_ms / 1000
                    next_check = _earliest(next_check, batch.retry_at - now)
                    break
                if any(b.tp == tp for b in by_leader[leader]):
                    next_check = 0.0  # one batch per partition per request
                    break
                if batch.payload is None:
                    self._seal(batch)
                assert batch.payload is not None
                size = len(batch.payload)
                if by_leader[leader] and request_bytes[leader] + size > self.max_request_size:
                    next_check = 0.0  # the next request to this leader takes it
                    break
                queue.popleft()
                batch.leader_epoch = epoch
                by_leader[leader].append(batch)
                request_bytes[leader] += size
                self._in_flight.setdefault(tp, []).append(batch)
                if batch.attempts:
                    break
        for leader, batches in by_leader.items():
            task = asyncio.get_running_loop().create_task(self._produce(leader, batches))
            self._request_tasks.add(task)
            task.add_done_callback(self._request_tasks.discard)
        return next_check

    def _seal(self, batch: _Batch) -> None:
        """Encode the batch, numbering it first when idempotent (sequences are given
        in send order, so a partition's sequences follow its queue)."""
        tp = batch.tp
        if not batch.is_full:
            self._partitioner.on_batch_closed(tp.topic, tp.partition)
            batch.is_full = True
        builder = batch.builder
        assert builder is not None
        if self._idempotent:
            owner = (self._producer_id, self._producer_epoch)
            assert self._seq_owner.setdefault(tp, owner) == owner, "numbering across epochs"
            seq = self._next_seq.get(tp, 0)
            batch.base_sequence = seq
            builder.producer_id = self._producer_id
            builder.producer_epoch = self._producer_epoch
            builder.base_sequence = seq
            self._next_seq[tp] = (seq + len(builder)) % _SEQUENCE_WRAP
        else:
            batch.base_sequence = None
            builder.producer_id = NO_PRODUCER_ID
            builder.producer_epoch = NO_PRODUCER_EPOCH
            builder.base_sequence = NO_SEQUENCE
        batch.payload = builder.build()

    def _on_current_epoch(self, tp: TopicPartition, queue: deque[_Batch]) -> bool:
        """KIP-360: whether `tp` may send now. After an epoch bump a partition keeps its
        old (producer id, epoch) until its in-flight batches are answered, and until no
        batch that may have been written is left: such a batch is resent under its old
        numbers, one at a time, so the leader recognises it as a duplicate (or proves,
        with a sequence error, that it is not in its log), or it fails when its delivery
        timeout expires (PossiblyWrittenError). A partition whose numbering did not
        break resends all its old-epoch retries so. Then the partition moves to the
        current epoch at sequence 0, its remaining batches renumbered in queue order
        (never reordered). A batch behind one the leader proved unwritten is not in its
        log either (a leader appends a producer's sequences only in order)."""
        current = (self._producer_id, self._producer_epoch)
        owner = self._seq_owner.get(tp)
        if owner is None or owner == current:
            return True
        if self._in_flight.get(tp):
            return False  # the answers decide what is resolved
        head = queue[0] if queue else None
        if (
            head is not None
            and head.base_sequence is not None
            and (head.maybe_written or tp not in self._resets)
        ):
            return True  # resolve the old epoch's retries first
        if head is not None and head.maybe_written:
            raise IllegalStateError(f"{tp}: renumbering a batch that may have been written")
        for batch in queue:
            batch.payload = None
            batch.base_sequence = None
            batch.maybe_written = False  # behind the head: not in the leader's log either
        self._next_seq[tp] = 0
        self._seq_owner[tp] = current
        self._resets.discard(tp)
        log.info(
            "%s: sequences restart at 0 under producer id %d epoch %d (were %d epoch %d)",
            tp,
            *current,
            *owner,
        )
        return True

    def _need_reset(self, tp: TopicPartition) -> None:
        """`tp`'s numbering broke (the leader lost our state, or a gap): bump the epoch
        and renumber its unacknowledged batches from 0 once its in-flight ones return."""
        self._resets.add(tp)
        if self._seq_owner.get(tp) == (self._producer_id, self._producer_epoch):
            self._need_bump = True
        # else a bump happened since these batches were numbered: they move to it

    def _start_epoch_bump(self) -> None:
        if self._bump_task is None or self._bump_task.done():
            self._bump_task = asyncio.get_running_loop().create_task(
                self._bump_epoch(), name="minibroker-producer-bump-epoch"
            )

    async def _bump_epoch(self) -> None:
        try:
            await self._init_producer_id(bump=True)
        except MinibrokerError as exc:
            log.error("cannot bump the producer epoch: %s; retrying", exc)
            await asyncio.sleep(self.retry_backoff_max_ms / 1000)
            self._wakeup.set()
            return
        self._need_bump = False
        self._wakeup.set()

    async def _init_producer_id(self, *, bump: bool = False) -> None:
        """InitProducerId, retried within max_block_ms. `bump` (KIP-360) sends the
        current producer id and epoch and gets the next epoch of the same id (a new id
        when the epoch is exhausted or the broker cannot bump). A broker that does not
        support InitProducerId makes this producer fall back to non-idempotent delivery
        (a WARNING)."""
        deadline = time.monotonic() + self.max_block_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        old = (self._producer_id, self._producer_epoch)
        bump = bump and old[0] >= 0 and 0 <= old[1] < _MAX_PRODUCER_EPOCH
        while True:
            error: MinibrokerError
            request = (
                InitProducerIdRequest(producer_id=old[0], producer_epoch=old[1])
                if bump
                else InitProducerIdRequest()
            )
            try:
                response = await self._cluster.send_any(request)
                assert isinstance(response, InitProducerIdResponse)
                if response.error_code == ErrorCode.NONE:
                    new = (response.producer_id, response.producer_epoch)
                    assert new[0] != old[0] or new[1] > old[1], f"epoch went back: {old} -> {new}"
                    self._producer_id, self._producer_epoch = new
                    log.info(
                        "idempotent producer: producer id %d epoch %d%s",
                        *new,
                        f" (bumped from epoch {old[1]})" if new[0] == old[0] else "",
                    )
                    return
                error = error_for(response.error_code, "InitProducerId")
            except BrokerResponseError as exc:
                error = exc
            except MinibrokerError as exc:
                error = exc
            code = getattr(error, "error_code", None)
            if bump and code in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION):
                log.warning(
                    "the broker cannot bump the epoch (%s): getting a new producer id", error
                )
                bump = False
                continue
            if code in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION):
                log.warning(
                    "the broker does not support InitProducerId (%s): idempotence is off, "
                    "a retry after a lost answer may write a batch twice",
                    error,
                )
                self._idempotent = False
                return
            if not error.retriable or time.monotonic() + backoff > deadline:
                raise error
            log.info("InitProducerId failed: %s; retrying", error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.retry_backoff_max_ms / 1000)

    async def _produce(self, node: int, batches: list[_Batch]) -> None:
        by_topic: dict[str, list[ProducePartition]] = defaultdict(list)
        for batch in batches:
            assert batch.payload is not None
            by_topic[batch.tp.topic].append(
                ProducePartition(
                    index=batch.tp.partition,
                    current_leader_epoch=batch.leader_epoch,
                    records=batch.payload,
                )
            )
        request = ProduceRequest(
            acks=self.acks,
            timeout_ms=self.request_timeout_ms,
            topics=[ProduceTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
        )
        try:
            if self.acks == 0:
                await self._cluster.send(node, request, expect_response=False)
                for batch in batches:
                    self._complete(batch, -1, -1, -1)
                return
            response = await self._cluster.send(node, request)
        except MinibrokerError as exc:
            for batch in batches:
                # The request may have reached the leader (or never left: the client
                # cannot tell a refused connection from a lost answer here).
                batch.maybe_written = True
                self._retry_or_fail(batch, exc)
            return
        finally:
            for batch in batches:
                flying = self._in_flight.get(batch.tp)
                if flying is not None and batch in flying:
                    flying.remove(batch)
                    if not flying:
                        del self._in_flight[batch.tp]
            self._wakeup.set()
        assert isinstance(response, ProduceResponse)
        answers = {(t.name, p.index): p for t in response.topics for p in t.partitions}
        for batch in batches:
            answer = answers.get(batch.tp)
            if answer is None or answer.error_code not in PRODUCE_REFUSED_BEFORE_APPEND:
                batch.maybe_written = True  # success and duplicates complete it below
            if answer is None:
                self._retry_or_fail(
                    batch,
                    UnknownTopicOrPartitionError(
                        f"broker {node} did not answer for this partition",
                        topic=batch.tp.topic,
                        partition=batch.tp.partition,
                    ),
                )
            elif answer.error_code == ErrorCode.NONE:
                self._complete(
                    batch, answer.base_offset, answer.log_append_time_ms, answer.log_start_offset
                )
            elif answer.error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and self._idempotent:
                # Appended before, its answer was lost: the leader gives the first offset.
                log.info(
                    "%s: batch with sequence %s was already written at offset %d",
                    batch.tp,
                    batch.base_sequence,
                    answer.base_offset,
                )
                self._complete(
                    batch, answer.base_offset, answer.log_append_time_ms, answer.log_start_offset
                )
            elif answer.error_code in _SEQUENCE_ERRORS and batch.base_sequence is not None:
                error = error_for(
                    answer.error_code, topic=batch.tp.topic, partition=batch.tp.partition
                )
                if answer.error_code == ErrorCode.INVALID_PRODUCER_EPOCH and batch.maybe_written:
                    # The epoch this batch is numbered under is fenced: an earlier
                    # attempt that may be in the log can no longer be found out.
                    why = f"{batch.tp}: the leader fenced the epoch of this batch: {error}"
                    self._fail(batch, self._give_up_error(batch, why, error))
                    continue
                if answer.error_code != ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER or (
                    not self._earlier_pending(batch)
                ):
                    if answer.error_code != ErrorCode.INVALID_PRODUCER_EPOCH:
                        # The leader has no state for us, or expects another sequence:
                        # no attempt of this batch is in its log.
                        batch.maybe_written = False
                    log.warning(
                        "%s: %s for sequence %d (producer id %d epoch %d): bumping the "
                        "epoch and renumbering the partition's unacknowledged batches",
                        batch.tp,
                        error.error_code.name,
                        batch.base_sequence,
                        self._producer_id,
                        self._producer_epoch,
                    )
                    self._need_reset(batch.tp)
                self._retry_or_fail(batch, error, retriable=True)
            else:
                error = error_for(
                    answer.error_code,
                    answer.error_message,
                    topic=batch.tp.topic,
                    partition=batch.tp.partition,
                )
                if answer.current_leader.leader_epoch > batch.leader_epoch:
                    log.info(
                        "%s: leader %d at epoch %d answered %s; the current leader is %d "
                        "at epoch %d",
                        batch.tp,
                        node,
                        batch.leader_epoch,
                        error.error_code.name,
                        answer.current_leader.leader_id,
                        answer.current_leader.leader_epoch,
                    )
                self._retry_or_fail(batch, error)

    def _earlier_pending(self, batch: _Batch) -> bool:
        """Whether a batch with a lower sequence of the same partition is still
        unacknowledged (then OUT_OF_ORDER just means it must go first)."""
        seq = batch.base_sequence
        assert seq is not None
        others = list(self._batches.get(batch.tp, ())) + self._in_flight.get(batch.tp, [])
        return any(
            b is not batch and b.base_sequence is not None and b.base_sequence < seq for b in others
        )

    def _requeue(self, batch: _Batch) -> None:
        """Put a batch back in sequence order (before unnumbered and later batches)."""
        queue = self._batches[batch.tp]
        if batch.base_sequence is None:
            queue.appendleft(batch)
            return
        index = 0
        for index, other in enumerate(queue):  # noqa: B007
            if other.base_sequence is None or other.base_sequence > batch.base_sequence:
                break
        else:
            index = len(queue)
        queue.insert(index, batch)

    def _retry_or_fail(
        self, batch: _Batch, error: MinibrokerError, *, retriable: bool | None = None
    ) -> None:
        now = time.monotonic()
        deadline = batch.created + self.delivery_timeout_ms / 1000
        backoff = (
            min(self.retry_backoff_ms * 2**batch.attempts, self.retry_backoff_max_ms)
            * random.uniform(0.8, 1.2)
            / 1000
        )
        if not (error.retriable if retriable is None else retriable) or self._closing:
            self._fail(batch, error)
            return
        if now + backoff >= deadline:
            why = (
                f"delivery_timeout_ms {self.delivery_timeout_ms} expired for {batch.tp} "
                f"after {batch.attempts + 1} attempts; last error: {error}"
            )
            self._fail(batch, self._give_up_error(batch, why, error))
            return
        batch.attempts += 1
        batch.retry_at = now + backoff
        log.info(
            "retrying %d record(s) for %s in %d ms (attempt %d, sent with leader epoch %d): %s",
            batch.record_count,
            batch.tp,
            backoff * 1000,
            batch.attempts,
            batch.leader_epoch,
            error,
        )
        self._requeue(batch)  # keeps the partition's order
        if error.invalid_metadata:
            self._cluster.request_refresh()

    def _give_up_error(
        self, batch: _Batch, why: str, cause: BaseException | None = None
    ) -> KafkaTimeoutError:
        """The error of a batch the producer stops trying: PossiblyWrittenError when an
        attempt's outcome is unknown (never renumbered, so never written twice; but it
        may be in the log once), KafkaTimeoutError when no attempt can have been
        written."""
        if batch.maybe_written:
            error: KafkaTimeoutError = PossiblyWrittenError(
                f"{why}; the outcome of an earlier attempt is unknown (its answer was lost, "
                f"or the leader gave up waiting for the ISR after appending it): the "
                f"{batch.record_count} record(s) may or may not have been written"
            )
            log.warning("%s", error)
        else:
            error = KafkaTimeoutError(why)
        error.__cause__ = cause
        return error

    def _complete(
        self, batch: _Batch, base_offset: int, log_append_time: int, log_start_offset: int
    ) -> None:
        topic, partition = batch.tp
        epoch = batch.leader_epoch
        facts = batch.facts
        new = tuple.__new__  # a NamedTuple's own __new__ is a Python-level call
        for delta, future in enumerate(batch.records):
            if future.done():
                continue
            i = delta * 3
            future.set_result(
                new(
                    RecordMetadata,
                    (
                        topic,
                        partition,
                        base_offset + delta if base_offset >= 0 else -1,
                        log_append_time if log_append_time >= 0 else facts[i],
                        epoch,
                        log_start_offset,
                        facts[i + 1],
                        facts[i + 2],
                    ),
                )
            )
        self._release(batch)

    def _fail(self, batch: _Batch, error: BaseException) -> None:
        if batch.base_sequence is not None and batch in self._incomplete and not self._closing:
            self._need_reset(batch.tp)  # its sequence is a gap now: renumber the later ones
        for future in batch.records:
            if not future.done():
                future.set_exception(error)
        self._release(batch)

    def _release(self, batch: _Batch) -> None:
        if batch not in self._incomplete:
            return
        self._incomplete.discard(batch)
        self._buffered -= batch.size
        self._buffer_freed.set()
        queue = self._batches.get(batch.tp)
        if queue is not None and not queue and not self._in_flight.get(batch.tp):
            del self._batches[batch.tp]
        if not batch.done.done():
            batch.done.set_result(None)


def _earliest(current: float | None, candidate: float) -> float:
    candidate = max(candidate, 0.0)
    return candidate if current is None else min(current, candidate)
