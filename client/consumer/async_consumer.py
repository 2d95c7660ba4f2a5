"""AsyncConsumer: manual assignment, positions with leader epochs, batched fetching.

`poll()` sends one Fetch request per leader for all of that leader's assigned
partitions (at most one in flight per broker), each partition carrying the cached
current_leader_epoch (a stale or newer leader answers FENCED_LEADER_EPOCH /
UNKNOWN_LEADER_EPOCH instead of serving a different lineage, KIP-320) and
last_fetched_epoch, the leader epoch of the record just before the position. Records
are decoded batch by batch into ConsumerRecords with
`protocol.record_batch.decode_batch_into`; those below the position (the start of the
first batch) are skipped. A position is (offset, leader epoch of the
last consumed record), as `OffsetAndMetadata` carries it.

Retriable errors refresh metadata and back off the partition; OFFSET_OUT_OF_RANGE
resets per `auto_offset_reset` ('earliest', 'latest' or 'none' to raise).

Truncation detection (KIP-320): after a leader change seen in metadata (or a
FENCED_LEADER_EPOCH / NOT_LEADER_OR_FOLLOWER answer), after a seek with an epoch and
when starting from a committed offset, the position awaits validation: the leader is
asked with OffsetsForLeaderEpoch where the position's epoch ends, under the rules of
client/epochs.py (never ask a leader older than the position's epoch: wait for the
metadata to reach it, with backoff, bounded by default_api_timeout_ms; an "unknown"
answer is retried, never a truncation). A leader epoch change drops the partition's
buffered records first, as Kafka's fetcher drops completed fetches of a partition
that is no longer FETCHING, so nothing of a lost lineage is handed out once the
change is known. A diverging_epoch in a Fetch answer is handled the same way
(LogTruncationError with 'none', else resume at the divergence point).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any
from typing import TypeVar

from client.cluster import ClusterClient
from client.consumer.assignors import Assignor
from client.consumer.assignors import assignor
from client.consumer.committed_offsets import CommittedOffsets
from client.consumer.fetcher import Fetcher
from client.consumer.group_membership import GroupMembership
from client.consumer.offset_lookup import OffsetLookup
from client.consumer.partition_state import _ISOLATION
from client.consumer.partition_state import _Fetched
from client.consumer.partition_state import _PartitionState
from client.consumer.subscription_state import SubscriptionState
from client.consumer.truncation import TruncationValidation
from client.errors import IllegalStateError
from client.lifecycle import AsyncClient
from client.record_columns import ColumnBuffer
from client.types import ConsumerRecord
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from runtime import hop_trace

_T = TypeVar("_T")


class AsyncConsumer(
    SubscriptionState, OffsetLookup, CommittedOffsets, Fetcher, TruncationValidation, AsyncClient
):
    """Asynchronous consumer: manual assignment (`assign`, `seek`, `poll`), or a
    group's share of subscribed topics (`subscribe` with a group_id)."""

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str] = "127.0.0.1:9092",
        *,
        client_id: str = "minibroker-consumer",
        group_id: str | None = None,
        auto_offset_reset: str = "latest",
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        max_poll_records: int = 500,
        request_timeout_ms: int = 30_000,
        default_api_timeout_ms: int = 60_000,
        retry_backoff_ms: int = 100,
        check_crcs: bool = True,
        isolation_level: str = "read_uncommitted",
        key_deserializer: Callable[[bytes], Any] | None = None,
        value_deserializer: Callable[[bytes], Any] | None = None,
        on_truncation: Callable[[TopicPartition, int, OffsetAndMetadata], None] | None = None,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        partition_assignment_strategy: Sequence[str | Assignor] = ("range", "roundrobin"),
        commit_on_revoke: bool = True,
        group_instance_id: str | None = None,
        security_protocol: str = "PLAINTEXT",
        ssl_context: ssl.SSLContext | None = None,
        sasl_mechanism: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        if isolation_level not in _ISOLATION:
            raise ValueError("isolation_level must be 'read_uncommitted' or 'read_committed'")
        self.auto_offset_reset = auto_offset_reset
        self.group_id = group_id
        # Called (partition, old position, divergence point) when a truncation is
        # detected and the position reset to the divergence point (not under 'none').
        self.on_truncation = on_truncation
        hop_trace.enable_from_environment("client")  # opt-in, MINIBROKER_TRACE_DIR
        self._subscription: set[str] | None = None
        self._coordinator: int | None = None
        # Group membership (subscribe() with a group_id): Kafka's names and defaults.
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.assignors = [
            assignor(a) if isinstance(a, str) else a for a in partition_assignment_strategy
        ]
        self.commit_on_revoke = commit_on_revoke
        self.group_instance_id = group_instance_id  # static membership (KIP-345)
        self._group: GroupMembership | None = None
        self._background_tasks: set[asyncio.Task[None]] = set()
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.max_poll_records = max_poll_records
        self.request_timeout_ms = request_timeout_ms
        # Bound of commit() / committed() with their retries (Kafka's default.api.timeout.ms).
        self.default_api_timeout_ms = default_api_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.check_crcs = check_crcs
        self.isolation_level = _ISOLATION[isolation_level]
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._cluster = ClusterClient(
            bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            security_protocol=security_protocol,
            ssl_context=ssl_context,
            sasl_mechanism=sasl_mechanism,
            sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password,
        )
        self._states: dict[TopicPartition, _PartitionState] = {}
        self._buffer: dict[TopicPartition, _Fetched] = {}
        self._fetching: dict[int, asyncio.Task[None]] = {}  # node id -> its fetch
        self._validating: dict[int, asyncio.Task[None]] = {}  # node id -> its validation
        self._fetch_done = asyncio.Event()
        self._pending_error: BaseException | None = None
        self._last_metadata_wait = 0.0
        self._started = False
        self._closed = False
        self._iter_buffer: deque[ConsumerRecord] = deque()
        self._want_columns = False  # fetches decode into columns (poll_batches)

    # ------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Leave the group (committing first with commit_on_revoke), stop fetching and
        close every connection."""
        if self._group is not None and self._started:
            await self._group.close()
        self._closed = True
        self._started = False
        tasks = list(self._fetching.values()) + list(self._validating.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetching.clear()
        self._validating.clear()
        await self._cluster.close()

    def _check(self) -> None:
        if not self._started:
            raise IllegalStateError("the consumer is not started (await start()) or is closed")

    # ------------------------------------------------------------ assignment and positions

    # ------------------------------------------------------------ committed offsets

    # ------------------------------------------------------------ iteration

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        """`async for record in consumer`: records one by one, polling as needed."""
        while not self._iter_buffer:
            if self._closed:
                raise StopAsyncIteration
            for records in (await self.poll(timeout_ms=self.fetch_max_wait_ms)).values():
                self._iter_buffer.extend(records)
        return self._iter_buffer.popleft()

    # ------------------------------------------------------------ polling

    async def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records fetched for the assigned partitions, at most `max_records`
        (default max_poll_records), waiting up to `timeout_ms` for some."""
        limit = max_records or self.max_poll_records
        self._want_columns = False
        return await self._poll_with(lambda: self._drain(limit), timeout_ms)

    async def poll_batches(self, timeout_ms: int = 0) -> dict[TopicPartition, ColumnBuffer]:
        """For bulk readers: each assigned partition's next fetch (up to
        max_partition_fetch_bytes) as columns, waiting up to `timeout_ms` for some. No
        ConsumerRecord per record: offsets are an OffsetColumn (consecutive ones a
        range), timestamps and keys are lists, values come as pieces (`value_pieces`:
        runs of alike records cut out of the batch, or lists; `values` joins them).
        Positions, CRC checks, corruption and truncation handling are poll()'s; key
        and value are raw bytes (no deserializers)."""
        if self._key_deserializer is not None or self._value_deserializer is not None:
            raise ValueError(
                "poll_batches() returns raw bytes: create the consumer without "
                "key_deserializer / value_deserializer, or use poll()"
            )
        self._want_columns = True
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            drained = await self._poll_with(self._drain_undecoded, remaining_ms)
            if not drained:
                return {}
            # _poll_with has created the next fetches (pipelining); one turn of the loop
            # writes them to the socket, so the broker reads and sends the next range
            # while this one is decoded.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self._undo_drain(drained)  # nothing was handed out: nothing is skipped
                raise
            columns = self._decode_drained(drained)
            if columns:
                return columns
            if self._pending_error is not None:  # a corrupt batch and nothing before it
                error, self._pending_error = self._pending_error, None
                raise error
            if time.monotonic() >= deadline:
                return {}

    async def _poll_with(
        self, drain: Callable[[], dict[TopicPartition, _T]], timeout_ms: int
    ) -> dict[TopicPartition, _T]:
        """poll()'s loop around `drain`, which takes what is buffered."""
        self._check()
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        deadline = time.monotonic() + timeout_ms / 1000
        if self._group is not None:
            await self._group.poll(max(0.0, deadline - time.monotonic()))
        while True:
            await self._ensure_metadata()
            await self._update_positions(
                timeout_ms=max(0, int((deadline - time.monotonic()) * 1000))
            )
            self._notice_leader_changes()
            drained = drain()
            if drained:
                # Pipelining, as Kafka's consumer does before poll returns: the next
                # fetch of the partitions just drained goes out now, while the caller
                # works on these (at most one fetch per leader in flight; an answer for a
                # position that a seek, pause or rebalance changed meanwhile is dropped).
                self._send_fetches()
                return drained
            if self._pending_error is not None:
                error, self._pending_error = self._pending_error, None
                raise error
            self._fetch_done.clear()
            self._send_fetches()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {}
            # Wake on a finished fetch; re-check at least every backoff, for
            # partitions waiting out a backoff or for a leader.
            wait = min(remaining, max(self.retry_backoff_ms / 1000, 0.01))
            if self._fetching or self._validating:
                wait = remaining
            try:
                async with asyncio.timeout(wait):
                    await self._fetch_done.wait()
            except TimeoutError:
                pass
