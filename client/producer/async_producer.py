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
import ssl
from collections import defaultdict
from collections import deque
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

from client.cluster import ClusterClient
from client.errors import IllegalStateError
from client.errors import KafkaTimeoutError
from client.errors import MinibrokerError
from client.lifecycle import AsyncClient
from client.partitioner import DefaultPartitioner
from client.producer.accumulator import RecordAccumulator
from client.producer.batches import _MAX_IN_FLIGHT_IDEMPOTENT
from client.producer.batches import _Batch
from client.producer.batches import log
from client.producer.batches import parse_acks
from client.producer.idempotence import IdempotenceState
from client.producer.sender import Sender
from client.types import TopicPartition
from protocol.record_batch import HEADER_SIZE
from protocol.record_batch import NO_PRODUCER_EPOCH
from protocol.record_batch import NO_PRODUCER_ID
from protocol.record_batch import Compression
from runtime import hop_trace


class AsyncProducer(RecordAccumulator, Sender, IdempotenceState, AsyncClient):
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
        security_protocol: str = "PLAINTEXT",
        ssl_context: ssl.SSLContext | None = None,
        sasl_mechanism: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
    ) -> None:
        hop_trace.enable_from_environment("client")  # opt-in, MINIBROKER_TRACE_DIR
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
            security_protocol=security_protocol,
            ssl_context=ssl_context,
            sasl_mechanism=sasl_mechanism,
            sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password,
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

    # ------------------------------------------------------------ the sender

    # else a bump happened since these batches were numbered: they move to it
