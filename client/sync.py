"""The blocking API: `Producer`, `Consumer` and `Admin`, for scripts and Spark executors.

Each instance runs its own asyncio event loop on a daemon thread and wraps one async
client (AsyncProducer, AsyncConsumer, AsyncAdmin) that lives on that loop; every
method submits a coroutine with `asyncio.run_coroutine_threadsafe` and waits for it
with a timeout (`api_timeout_ms`, plus the call's own wait for poll/flush), so a
caller never blocks forever. Nothing touches the caller's event loop (there may be
one running, as in a notebook) and nothing is shared between instances, which is what
a Spark executor's reused Python worker needs. `close()` closes the async client and
stops and joins the thread; the classes are context managers. Method names are those
of the async classes.

Calling a method from the instance's own loop thread (e.g. inside a callback) would
deadlock: it raises IllegalStateError instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from types import TracebackType
from typing import Any
from typing import ClassVar
from typing import TypeVar

from client.admin import AsyncAdmin
from client.admin import ClusterDescription
from client.admin import CreatedTopic
from client.admin import GroupDescription
from client.admin import GroupListing
from client.admin import LeaderElection
from client.admin import NewTopic
from client.admin import PartitionLag
from client.admin import ReplicaLogDescription
from client.admin import TopicDescription
from client.consumer import AsyncConsumer
from client.consumer.group_membership import RebalanceListener
from client.errors import IllegalStateError
from client.errors import KafkaTimeoutError
from client.health import ClusterHealth
from client.producer import AsyncProducer
from client.producer import ProducerBatch
from client.producer.accumulator import RecordAccumulator
from client.record_columns import ColumnBuffer
from client.signatures import parameters_of
from client.types import ConsumerRecord
from client.types import OffsetAndMetadata
from client.types import OffsetAndTimestamp
from client.types import RecordMetadata
from client.types import TopicPartition

T = TypeVar("T")

_DEFAULT_API_TIMEOUT_MS = 60_000
_JOIN_TIMEOUT = 10.0
# How much longer a sync call waits than the async call's own bound (which fires first).
_MARGIN_MS = 5_000


class _LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            # Cancel what is left (a close() that timed out) and close the loop.
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def run(self, coro: Awaitable[T], timeout: float | None) -> T:
        """Run `coro` on the loop and wait up to `timeout` seconds for its result."""
        if threading.current_thread() is self.thread:
            raise IllegalStateError("a blocking client method was called from its own loop")
        if not self.alive:
            if asyncio.iscoroutine(coro):
                coro.close()
            raise IllegalStateError("the client is closed")
        future = asyncio.run_coroutine_threadsafe(_await(coro), self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise KafkaTimeoutError(f"the call did not finish within {timeout} s") from None

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """Run a plain function on the loop thread (the async client is not thread-safe)."""

        async def invoke() -> T:
            return fn(*args)

        return self.run(invoke(), timeout)

    def stop(self) -> None:
        if self.alive:
            self.loop.call_soon_threadsafe(self.loop.stop)
            if threading.current_thread() is not self.thread:
                self.thread.join(_JOIN_TIMEOUT)


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


class _SyncClient:
    """What the three blocking clients share: the loop thread, timeouts, closing."""

    _thread_name = "minibroker-client"
    _async_client: ClassVar[Callable[..., Any]]  # the asyncio client this one wraps

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str] = "127.0.0.1:9092",
        *,
        api_timeout_ms: int = _DEFAULT_API_TIMEOUT_MS,
        **options: Any,
    ) -> None:
        self.api_timeout_ms = api_timeout_ms
        self._runner = _LoopThread(self._thread_name)
        self._closed = False
        async_client = type(self)._async_client

        async def build_and_start() -> Any:
            client = async_client(bootstrap_servers, **options)  # on the loop it runs on
            await client.start()
            return client

        try:
            self._client = self._runner.run(build_and_start(), self._timeout())
        except BaseException:
            self._runner.stop()
            raise

    def _timeout(self, extra_ms: float = 0) -> float:
        return (self.api_timeout_ms + extra_ms) / 1000

    def _extra_for(self, budget_ms: int) -> float:
        """extra_ms for a call bounded by `budget_ms` itself: its bound fires first."""
        return max(0, budget_ms - self.api_timeout_ms) + _MARGIN_MS

    def _run(self, coro: Awaitable[T], extra_ms: float = 0) -> T:
        if self._closed:
            if asyncio.iscoroutine(coro):
                coro.close()
            raise IllegalStateError("the client is closed")
        return self._runner.run(coro, self._timeout(extra_ms))

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise IllegalStateError("the client is closed")
        return self._runner.call(fn, *args, timeout=self._timeout())

    @property
    def thread(self) -> threading.Thread:
        """The background thread running this client's event loop."""
        return self._runner.thread

    def close(self, timeout_ms: int | None = None) -> None:
        """Close the async client, then stop and join the loop thread. Idempotent."""
        if self._closed:
            return
        try:
            self._runner.run(self._close_async(timeout_ms), self._timeout(timeout_ms or 0))
        finally:
            self._closed = True
            self._runner.stop()

    async def _close_async(self, timeout_ms: int | None) -> None:
        await self._client.close()

    def __enter__(self: Any) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Producer(_SyncClient):
    """Blocking producer: `AsyncProducer`'s options and methods. `send()` returns a
    `concurrent.futures.Future` of RecordMetadata; `send_and_wait()` its result."""

    _thread_name = "minibroker-producer-loop"
    _async_client = AsyncProducer

    @property
    def async_producer(self) -> AsyncProducer:
        """The wrapped AsyncProducer (use it only on its own loop)."""
        return self._client  # type: ignore[no-any-return]

    @property
    def producer_id(self) -> int:
        """The idempotent producer id (-1: not idempotent)."""
        return self.async_producer.producer_id

    @parameters_of(RecordAccumulator.send)
    def send(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record (blocking only while buffer_memory is full)."""
        return self._queue(lambda: self._client.send(*args, **kwargs))

    def create_batch(self) -> ProducerBatch:
        """An empty batch for `send_batch()`; fill it on any thread with
        `batch.append(key=..., value=...)` (no loop is involved until it is sent)."""
        return self.async_producer.create_batch()

    def send_batch(
        self, batch: ProducerBatch, topic: str, *, partition: int
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue a whole batch for `partition` of `topic`: a future of the RecordMetadata
        of its first record (AsyncProducer.send_batch)."""
        return self._queue(lambda: self._client.send_batch(batch, topic, partition=partition))

    def _queue(
        self, send: Callable[[], Awaitable[asyncio.Future[RecordMetadata]]]
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Run `send()` on the loop (called there, so a closed producer makes no
        coroutine); its delivery future, copied to a thread-safe one."""
        result: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()

        async def queue() -> None:
            future = await send()
            future.add_done_callback(lambda f: _copy(f, result))

        self._run(queue())
        return result

    @parameters_of(send)
    def send_and_wait(self, *args: Any, **kwargs: Any) -> RecordMetadata:
        """Send one record and wait for its RecordMetadata."""
        future = self.send(*args, **kwargs)
        delivery = self.async_producer.delivery_timeout_ms
        try:
            return future.result(self._timeout(delivery))
        except concurrent.futures.TimeoutError:
            raise KafkaTimeoutError("no acknowledgement within the delivery timeout") from None

    def flush(self, timeout_ms: int | None = None) -> None:
        """Send everything buffered and wait for the answers."""
        extra = self.async_producer.delivery_timeout_ms if timeout_ms is None else timeout_ms
        self._run(self._client.flush(timeout_ms), extra)

    def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of `topic`."""
        return self._run(self._client.partitions_for(topic))

    async def _close_async(self, timeout_ms: int | None) -> None:
        await self._client.close(timeout_ms)


def _copy(source: asyncio.Future[T], target: concurrent.futures.Future[T]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


class Consumer(_SyncClient):
    """Blocking consumer: `AsyncConsumer`'s options and methods, iterable
    (`for record in consumer`, until close())."""

    _thread_name = "minibroker-consumer-loop"
    _async_client = AsyncConsumer

    @property
    def async_consumer(self) -> AsyncConsumer:
        """The wrapped AsyncConsumer (use it only on its own loop)."""
        return self._client  # type: ignore[no-any-return]

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions."""
        self._call(self._client.assign, list(partitions))

    def subscribe(self, topics: Iterable[str], listener: RebalanceListener | None = None) -> None:
        """Consume `topics`: with a group_id as a member of the group (the listener's
        callbacks run in the client's thread, inside poll()), else every partition."""
        names = [topics] if isinstance(topics, str) else list(topics)
        self._call(self._client.subscribe, names, listener)

    def unsubscribe(self) -> None:
        """Drop the subscription and the assignment."""
        self._call(self._client.unsubscribe)

    def subscription(self) -> set[str]:
        """The subscribed topics."""
        return self._call(self._client.subscription)

    def assignment(self) -> set[TopicPartition]:
        """The assigned partitions."""
        return self._call(self._client.assignment)

    def seek(self, partition: TopicPartition, offset: int | OffsetAndMetadata) -> None:
        """Fetch from `offset` next; an OffsetAndMetadata with an epoch is validated."""
        self._call(self._client.seek, partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset."""
        self._call(self._client.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the high watermark."""
        self._call(self._client.seek_to_end, *partitions)

    def position(self, partition: TopicPartition) -> int:
        """Offset of the next record poll() returns."""
        return self._run(self._client.position(partition))

    def position_with_epoch(self, partition: TopicPartition) -> OffsetAndMetadata:
        """The position with the leader epoch of the last consumed record."""
        return self._run(self._client.position_with_epoch(partition))

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these partitions."""
        self._call(self._client.pause, *partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        """Fetch these partitions again."""
        self._call(self._client.resume, *partitions)

    def paused(self) -> set[TopicPartition]:
        """The paused partitions."""
        return self._call(self._client.paused)

    def highwater(self, partition: TopicPartition) -> int | None:
        """High watermark from the last fetch."""
        return self._call(self._client.highwater, partition)

    def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records per partition, waiting up to `timeout_ms` for some."""
        return self._run(self._client.poll(timeout_ms, max_records), timeout_ms)

    def poll_batches(self, timeout_ms: int = 0) -> dict[TopicPartition, ColumnBuffer]:
        """For bulk readers: each partition's next fetch as columns (raw bytes, no
        ConsumerRecord per record), waiting up to `timeout_ms`; AsyncConsumer.poll_batches.
        The next fetch is on its way while the caller works on these."""
        return self._run(self._client.poll_batches(timeout_ms), timeout_ms)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records one by one until close()."""
        wait = self.async_consumer.fetch_max_wait_ms
        while not self._closed:
            for records in self.poll(wait).values():
                yield from records

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Log start offsets."""
        return self._run(self._client.beginning_offsets(list(partitions)))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """High watermarks."""
        return self._run(self._client.end_offsets(list(partitions)))

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Earliest offsets with a timestamp >= the given ones, with leader epochs."""
        return self._run(self._client.offsets_for_times(dict(timestamps)))

    def commit(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit `offsets` (default: the positions) for group_id, retrying retriable
        errors within `timeout_ms` (default api_timeout_ms)."""
        budget = self.api_timeout_ms if timeout_ms is None else timeout_ms
        self._run(self._client.commit(offsets, timeout_ms=budget), extra_ms=self._extra_for(budget))

    def committed(
        self, partition: TopicPartition, *, timeout_ms: int | None = None
    ) -> OffsetAndMetadata | None:
        """The offset committed for group_id, with its leader epoch (retried like
        commit)."""
        budget = self.api_timeout_ms if timeout_ms is None else timeout_ms
        return self._run(
            self._client.committed(partition, timeout_ms=budget), extra_ms=self._extra_for(budget)
        )

    def partitions_for_topic(self, topic: str) -> set[int]:
        """Partition ids of `topic`."""
        return self._run(self._client.partitions_for_topic(topic))

    def topics(self) -> set[str]:
        """Every topic in the cluster."""
        return self._run(self._client.topics())


class Admin(_SyncClient):
    """Blocking admin: `AsyncAdmin`'s options and methods."""

    _thread_name = "minibroker-admin-loop"
    _async_client = AsyncAdmin

    @property
    def async_admin(self) -> AsyncAdmin:
        """The wrapped AsyncAdmin (use it only on its own loop)."""
        return self._client  # type: ignore[no-any-return]

    def create_topics(self, new_topics: Iterable[NewTopic], **kwargs: Any) -> list[CreatedTopic]:
        """Create topics (see AsyncAdmin.create_topics)."""
        return self._run(self._client.create_topics(list(new_topics), **kwargs))

    def create_topic(self, name: str, *args: Any, **kwargs: Any) -> CreatedTopic:
        """Create one topic (see AsyncAdmin.create_topic)."""
        return self._run(self._client.create_topic(name, *args, **kwargs))

    def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None) -> None:
        """Delete topics."""
        self._run(self._client.delete_topics(list(names), timeout_ms=timeout_ms))

    def elect_leaders(self, *args: Any, **kwargs: Any) -> dict[TopicPartition, LeaderElection]:
        """Unclean leader elections (see AsyncAdmin.elect_leaders)."""
        return self._run(self._client.elect_leaders(*args, **kwargs))

    def list_topics(self) -> list[str]:
        """Topic names."""
        return self._run(self._client.list_topics())

    def describe_topics(self, *args: Any, **kwargs: Any) -> list[TopicDescription]:
        """Describe topics (see AsyncAdmin.describe_topics)."""
        return self._run(self._client.describe_topics(*args, **kwargs))

    def describe_cluster(self) -> ClusterDescription:
        """Cluster id, controller and brokers."""
        return self._run(self._client.describe_cluster())

    def list_offsets(
        self, timestamps: Mapping[TopicPartition, int | str], *, isolation_level: int = 0
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """ListOffsets per partition ('earliest', 'latest' or a timestamp in ms)."""
        return self._run(
            self._client.list_offsets(dict(timestamps), isolation_level=isolation_level)
        )

    def cluster_health(self, **kwargs: Any) -> ClusterHealth:
        """The cluster's health verdict (see AsyncAdmin.cluster_health)."""
        return self._run(self._client.cluster_health(**kwargs))

    health = cluster_health  # the short name, as the CLI calls it

    def describe_replica_log(self, *args: Any, **kwargs: Any) -> ReplicaLogDescription:
        """One replica's batches and epoch cache (see AsyncAdmin.describe_replica_log)."""
        return self._run(self._client.describe_replica_log(*args, **kwargs))

    # Consumer groups (see client/group_admin.py).

    def list_groups(self) -> list[GroupListing]:
        """Every group of every coordinator."""
        return self._run(self._client.list_groups())

    def describe_group(self, group_id: str) -> GroupDescription:
        """A group's state, generation and members with their assignments."""
        return self._run(self._client.describe_group(group_id))

    def list_group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets with their leader epochs."""
        return self._run(self._client.list_group_offsets(group_id))

    def group_lag(self, group_id: str, topics: Iterable[str] = ()) -> list[PartitionLag]:
        """Committed offset, log end, lag and owner per partition."""
        return self._run(self._client.group_lag(group_id, topics))

    def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> None:
        """Reset an empty group's committed offsets."""
        self._run(self._client.alter_group_offsets(group_id, offsets))

    def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete empty groups with their offsets."""
        self._run(self._client.delete_groups(group_ids))
