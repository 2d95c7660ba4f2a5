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
import logging
import random
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from client.cluster import ClusterClient
from client.epochs import EpochEndOffset, ask_leader, leader_for_epoch
from client.errors import (
    BrokerResponseError,
    IllegalStateError,
    KafkaTimeoutError,
    LeaderEpochBehindError,
    LogTruncationError,
    MinibrokerError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    error_for,
)
from client.offsets import list_offsets
from client.types import ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from protocol.api import CONSUMER_REPLICA_ID, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, NO_EPOCH
from protocol.errors import CorruptRecordError as ProtocolCorruptRecordError
from protocol.errors import ErrorCode
from protocol.messages import (
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    Message,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopic,
)
from protocol.record_batch import check_batch, decode_batch_into, iter_headers

log = logging.getLogger(__name__)

_RESET_TIMESTAMPS = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP}
_ISOLATION = {"read_uncommitted": 0, "read_committed": 1}
_COORDINATOR_MAX_BACKOFF_S = 1.0
# Longest pause between metadata refreshes while a position waits for its leader
# epoch to appear in the metadata (Kafka's retry.backoff.max.ms).
_EPOCH_WAIT_MAX_BACKOFF_S = 1.0
# Partition or response errors after which the coordinator is looked up again (as
# Kafka's commit handler marks the coordinator unknown).
_COORDINATOR_MOVED = frozenset(
    {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.REQUEST_TIMED_OUT}
)


def _answer_errors(response: Message, group: str) -> list[BrokerResponseError]:
    """The errors of a coordinator answer: its whole-response error code if any, else
    one per partition that failed."""
    code = getattr(response, "error_code", 0)
    if code != ErrorCode.NONE:
        return [error_for(code, f"group {group!r}")]
    return [
        error_for(p.error_code, topic=topic.name, partition=p.partition_index)
        for topic in getattr(response, "topics", ())
        for p in topic.partitions
        if p.error_code != ErrorCode.NONE
    ]


class _PartitionState:
    __slots__ = (
        "awaiting_validation",
        "backoff_until",
        "epoch_wait_since",
        "epoch_waits",
        "high_watermark",
        "leader_epoch_seen",
        "log_start_offset",
        "paused",
        "position",
        "position_epoch",
        "reset",
    )

    def __init__(self) -> None:
        self.position: int | None = None
        # Leader epoch of the record just before `position` (-1: unknown).
        self.position_epoch = NO_EPOCH
        self.reset: str | None = None  # pending 'earliest' / 'latest'
        self.paused = False
        self.high_watermark = -1
        self.log_start_offset = -1
        self.backoff_until = 0.0
        # Leader epoch of the metadata we last fetched with, to notice leader changes.
        self.leader_epoch_seen = NO_EPOCH
        # KIP-320: hold fetching until OffsetsForLeaderEpoch confirms the position
        # (after a leader change, or a seek/committed offset carrying an epoch).
        self.awaiting_validation = False
        # Since when (monotonic s; 0: not) the position waits for a leader at its
        # epoch (client/epochs.py rules 1, 2), and how many retries so far.
        self.epoch_wait_since = 0.0
        self.epoch_waits = 0

    def set_position(self, offset: int, epoch: int, *, validate: bool = False) -> None:
        self.position = offset
        self.position_epoch = epoch
        self.reset = None
        self.awaiting_validation = validate and epoch != NO_EPOCH
        self.epoch_wait_since = 0.0
        self.epoch_waits = 0


class _Fetched:
    """Decoded records of one partition not yet returned by poll()."""

    __slots__ = ("fetch_offset", "index", "next_epoch", "next_offset", "records")

    def __init__(
        self, fetch_offset: int, records: list[ConsumerRecord], next_offset: int, next_epoch: int
    ) -> None:
        self.fetch_offset = fetch_offset
        self.records = records
        self.index = 0
        self.next_offset = next_offset
        self.next_epoch = next_epoch


class AsyncConsumer:
    """Asynchronous consumer with manual assignment (`assign`, `seek`, `poll`)."""

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
        self._subscription: set[str] | None = None
        self._coordinator: int | None = None
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

    @property
    def cluster(self) -> ClusterClient:
        """The metadata cache and connection pool."""
        return self._cluster

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect to a bootstrap broker and load metadata."""
        await self._cluster.bootstrap()
        self._started = True

    async def close(self) -> None:
        """Stop fetching and close every connection."""
        self._closed = True
        self._started = False
        tasks = list(self._fetching.values()) + list(self._validating.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetching.clear()
        self._validating.clear()
        await self._cluster.close()

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _check(self) -> None:
        if not self._started:
            raise IllegalStateError("the consumer is not started (await start()) or is closed")

    # ------------------------------------------------------------ assignment and positions

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing the previous assignment or
        subscription)."""
        self._subscription = None
        wanted = {TopicPartition(*tp) for tp in partitions}
        for tp in list(self._states):
            if tp not in wanted:
                self._forget(tp)
        for tp in wanted:
            self._states.setdefault(tp, _PartitionState())
        self._cluster.add_topics({tp.topic for tp in wanted})

    def subscribe(self, topics: Iterable[str]) -> None:
        """Consume every partition of `topics` (partitions added later are picked up at
        the next metadata refresh). No group rebalancing: each consumer reads all of
        them. Replaces any assign()."""
        names = {topics} if isinstance(topics, str) else set(topics)
        if not names:
            raise ValueError("subscribe() needs at least one topic")
        self._subscription = names
        self._cluster.add_topics(names)
        for tp in list(self._states):
            if tp.topic not in names:
                self._forget(tp)
        self._expand_subscription()

    def subscription(self) -> set[str]:
        """The subscribed topics (empty with manual assignment)."""
        return set(self._subscription or ())

    def unsubscribe(self) -> None:
        """Drop the subscription and every assigned partition."""
        self._subscription = None
        for tp in list(self._states):
            self._forget(tp)

    def _forget(self, tp: TopicPartition) -> None:
        """Stop consuming `tp`: its state, buffered records and awaited epoch go."""
        del self._states[tp]
        self._buffer.pop(tp, None)
        self._cluster.metadata.stop_awaiting(tp)

    def _expand_subscription(self) -> None:
        if self._subscription is None:
            return
        meta = self._cluster.metadata
        for topic in self._subscription:
            for p in meta.partitions_for_topic(topic) or ():
                self._states.setdefault(TopicPartition(topic, p), _PartitionState())

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads."""
        return set(self._states)

    def _state(self, tp: TopicPartition) -> _PartitionState:
        state = self._states.get(tp)
        if state is None:
            raise IllegalStateError(f"partition {tp} is not assigned to this consumer")
        return state

    def seek(self, partition: TopicPartition, offset: int | OffsetAndMetadata) -> None:
        """Fetch from `offset` next. An OffsetAndMetadata with a leader_epoch (stored
        from an earlier position) arms the truncation check for that epoch."""
        state = self._state(partition)
        if isinstance(offset, OffsetAndMetadata):
            position, epoch = offset.offset, offset.leader_epoch
        else:
            position, epoch = int(offset), NO_EPOCH
        if position < 0:
            raise ValueError(f"offset must be >= 0, not {position}")
        state.set_position(position, epoch, validate=True)
        self._await_epoch_of(partition, epoch)
        self._buffer.pop(partition, None)

    def _await_epoch_of(self, tp: TopicPartition, epoch: int) -> None:
        """A position of leader epoch `epoch` was set from outside the log (a seek, a
        committed offset): no leader older than it may be asked about it, and metadata
        answers older than it are stale (client/epochs.py rule 1). Without an epoch,
        nothing is awaited."""
        if epoch == NO_EPOCH:
            self._cluster.metadata.stop_awaiting(tp)
        else:
            self._cluster.metadata.await_leader_epoch(tp, epoch)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset (resolved lazily at the next poll/position)."""
        self._seek_reset(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the high watermark (resolved lazily at the next poll/position)."""
        self._seek_reset(partitions, "latest")

    def _seek_reset(self, partitions: tuple[TopicPartition, ...], strategy: str) -> None:
        for tp in partitions or tuple(self._states):
            state = self._state(tp)
            state.position = None
            state.position_epoch = NO_EPOCH
            state.reset = strategy
            state.awaiting_validation = False
            self._buffer.pop(tp, None)
            self._cluster.metadata.stop_awaiting(tp)

    async def position(self, partition: TopicPartition) -> int:
        """Offset of the next record poll() returns for this partition."""
        return (await self.position_with_epoch(partition)).offset

    async def position_with_epoch(self, partition: TopicPartition) -> OffsetAndMetadata:
        """The position with the leader epoch of the last consumed record: store both
        and pass them back to seek() to resume safely (KIP-320)."""
        self._check()
        state = self._state(partition)
        if state.position is None:
            error = await self._update_positions([partition], self.request_timeout_ms)
            if state.position is None:
                raise error or KafkaTimeoutError(f"{partition} has no position yet")
        return OffsetAndMetadata(state.position, "", state.position_epoch)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these partitions (positions are kept)."""
        for tp in partitions:
            self._state(tp).paused = True
            self._buffer.pop(tp, None)

    def resume(self, *partitions: TopicPartition) -> None:
        """Fetch these paused partitions again."""
        for tp in partitions:
            self._state(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        """The paused partitions."""
        return {tp for tp, s in self._states.items() if s.paused}

    def highwater(self, partition: TopicPartition) -> int | None:
        """High watermark from the last fetch of this partition (None: not fetched)."""
        hw = self._state(partition).high_watermark
        return hw if hw >= 0 else None

    async def partitions_for_topic(self, topic: str, timeout_ms: int | None = None) -> set[int]:
        """Partition ids of `topic`, waiting up to `timeout_ms` (default
        request_timeout_ms) for it to appear; UnknownTopicOrPartitionError if it does not."""
        self._check()
        wait = self.request_timeout_ms if timeout_ms is None else timeout_ms
        await self._cluster.wait_for_topics([topic], timeout_ms=wait)
        return set(self._cluster.metadata.partitions_for_topic(topic) or ())

    async def topics(self) -> set[str]:
        """Every topic in the cluster."""
        self._check()
        response, _ = await self._cluster.fetch_metadata(all_topics=True)
        return {t.name for t in response.topics if t.error_code == ErrorCode.NONE}

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """Log start offsets: the first offset still in each log."""
        return await self._offsets(partitions, EARLIEST_TIMESTAMP)

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """High watermarks: the offset the next produced record will get."""
        return await self._offsets(partitions, LATEST_TIMESTAMP)

    async def _offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int
    ) -> dict[TopicPartition, int]:
        self._check()
        results = await self._list_offsets(dict.fromkeys(partitions, timestamp))
        return {tp: r.offset for tp, r in results.items()}

    async def _list_offsets(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """ListOffsets for the user's calls. Retriable answers (a leader moving,
        OFFSET_NOT_AVAILABLE from a new leader whose high watermark has not reached the
        start of its epoch yet, KIP-207) are retried with backoff for up to
        request_timeout_ms, so an end offset never goes back across a failover; then
        KafkaTimeoutError naming the last error. Other errors raise at once."""
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        await self._cluster.wait_for_topics(
            {tp.topic for tp in timestamps}, timeout_ms=self.request_timeout_ms
        )
        results, errors = await list_offsets(
            self._cluster,
            timestamps,
            timeout_ms=max(0, int((deadline - time.monotonic()) * 1000)),
            isolation_level=self.isolation_level,
        )
        if not errors:
            return results
        fatal = [e for e in errors.values() if not e.retriable]
        if fatal:
            raise fatal[0]
        tp, last = next(iter(errors.items()))
        raise KafkaTimeoutError(
            f"ListOffsets for {tp} did not succeed within request_timeout_ms="
            f"{self.request_timeout_ms}; last error: {last}"
        ) from last

    async def _update_positions(
        self, partitions: Iterable[TopicPartition] | None = None, timeout_ms: int = 0
    ) -> MinibrokerError | None:
        """Resolve pending resets (and missing positions per auto_offset_reset),
        retrying retriable ListOffsets answers for up to `timeout_ms` (at least one
        attempt). Returns the last retriable error of a partition left without a
        position (the next call tries again); raises the others."""
        todo: dict[TopicPartition, int] = {}
        no_offset: list[TopicPartition] = []
        wanted = list(self._states if partitions is None else partitions)
        await self._positions_from_committed(wanted)
        for tp in wanted:
            state = self._states[tp]
            if state.position is not None:
                continue
            strategy = state.reset or self.auto_offset_reset
            if strategy == "none":
                no_offset.append(tp)
            else:
                todo[tp] = _RESET_TIMESTAMPS[strategy]
        if no_offset:
            raise NoOffsetForPartitionError(no_offset)
        if not todo:
            return None
        if any(self._cluster.metadata.partition(tp) is None for tp in todo):
            await self._cluster.wait_for_topics(
                {tp.topic for tp in todo}, timeout_ms=self.request_timeout_ms
            )
        results, errors = await list_offsets(
            self._cluster, todo, timeout_ms=timeout_ms, isolation_level=self.isolation_level
        )
        for tp, found in results.items():
            state = self._states.get(tp)
            if state is None or state.position is not None:
                continue  # unassigned or seeked meanwhile
            state.set_position(found.offset, found.leader_epoch)
            log.info(
                "%s: reset position to %d (%s, leader epoch %d)",
                tp,
                found.offset,
                "earliest" if todo[tp] == EARLIEST_TIMESTAMP else "latest",
                found.leader_epoch,
            )
        fatal = [e for e in errors.values() if not e.retriable]
        if fatal:
            raise fatal[0]
        for tp, exc in errors.items():
            log.info("%s: cannot reset its position yet: %s", tp, exc)
        return next(iter(errors.values()), None)

    async def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the earliest offset whose timestamp is >= the given one
        (ms), with its timestamp and leader epoch; None when there is no such record."""
        self._check()
        if any(ts < 0 for ts in timestamps.values()):
            raise ValueError("timestamps must be >= 0 (use beginning_offsets/end_offsets)")
        results = await self._list_offsets(dict(timestamps))
        return {tp: (r if r.offset >= 0 else None) for tp, r in results.items()}

    # ------------------------------------------------------------ committed offsets

    def _need_group(self) -> str:
        if not self.group_id:
            raise IllegalStateError("commit()/committed() need a group_id")
        return self.group_id

    async def _coordinator_call(
        self, request: Message, *, what: str, timeout_ms: int | None
    ) -> Message:
        """Send to the group coordinator (FindCoordinator first) and check the answer,
        whole-response and per-partition error codes alike. Retriable errors (the
        coordinator moved, is loading, unreachable, timed out) are retried with an
        exponential backoff and a new FindCoordinator when the coordinator may have
        moved, as Kafka's commitSync does, until `timeout_ms` (default
        default_api_timeout_ms) runs out: then KafkaTimeoutError, carrying the last
        error. A non-retriable error is raised at once."""
        group = self._need_group()
        budget_ms = self.default_api_timeout_ms if timeout_ms is None else timeout_ms
        if budget_ms <= 0:
            raise ValueError(f"timeout_ms must be > 0, not {budget_ms}")
        deadline = time.monotonic() + budget_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        attempts = 0
        while True:
            attempts += 1
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                node = await self._find_coordinator(group, remaining_ms)
                response = await self._cluster.send(
                    node, request, timeout_ms=min(self.request_timeout_ms, remaining_ms)
                )
                assert response is not None
                errors = _answer_errors(response, group)
                for error in errors:
                    if not error.retriable:
                        raise error
                if not errors:
                    return response
                last: MinibrokerError = errors[0]
                if any(e.error_code in _COORDINATOR_MOVED for e in errors):
                    self._coordinator = None
            except MinibrokerError as exc:
                if not exc.retriable:
                    raise
                last = exc
                self._coordinator = None  # unreachable or timed out: look it up again
            if time.monotonic() + backoff >= deadline:
                raise KafkaTimeoutError(
                    f"{what} for group {group!r} did not succeed within {budget_ms} ms "
                    f"({attempts} attempts); last error: {last}. Is the cluster up? "
                    "Pass a larger timeout_ms to wait longer"
                ) from last
            log.info(
                "group %s: %s failed: %s; retrying in %.0f ms", group, what, last, backoff * 1000
            )
            await asyncio.sleep(backoff * random.uniform(0.8, 1.0))
            backoff = min(backoff * 2, _COORDINATOR_MAX_BACKOFF_S)

    async def _find_coordinator(self, group: str, timeout_ms: int) -> int:
        """The coordinator's node id (cached until it fails us)."""
        if self._coordinator is None:
            found = await self._cluster.send_any(
                FindCoordinatorRequest(key=group),
                timeout_ms=min(self.request_timeout_ms, timeout_ms),
            )
            assert isinstance(found, FindCoordinatorResponse)
            if found.error_code != ErrorCode.NONE:
                raise error_for(found.error_code, found.error_message)
            self._coordinator = found.node_id
        return self._coordinator

    async def commit(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Store `offsets` (default: the current positions of every assigned partition,
        with the leader epoch of the last consumed record) for group_id. Retriable
        errors (coordinator moved, loading or unreachable) are retried until
        `timeout_ms` (default default_api_timeout_ms), then KafkaTimeoutError;
        others (e.g. INVALID_COMMIT_OFFSET_SIZE) raise at once."""
        self._check()
        if offsets is None:
            offsets = {
                tp: OffsetAndMetadata(s.position, "", s.position_epoch)
                for tp, s in self._states.items()
                if s.position is not None
            }
        if not offsets:
            return
        by_topic: dict[str, list[OffsetCommitPartition]] = defaultdict(list)
        for tp, om in offsets.items():
            om = om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om))
            by_topic[tp.topic].append(
                OffsetCommitPartition(
                    partition_index=tp.partition,
                    committed_offset=om.offset,
                    committed_leader_epoch=om.leader_epoch,
                    committed_metadata=om.metadata,
                )
            )
        response = await self._coordinator_call(
            OffsetCommitRequest(
                group_id=self._need_group(),
                topics=[OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
            ),
            what="OffsetCommit",
            timeout_ms=timeout_ms,
        )
        assert isinstance(response, OffsetCommitResponse)

    async def committed(
        self, partition: TopicPartition, *, timeout_ms: int | None = None
    ) -> OffsetAndMetadata | None:
        """The offset committed for group_id (with its leader epoch), or None.
        Retried like commit() within `timeout_ms` (default default_api_timeout_ms)."""
        self._check()
        return (await self._fetch_committed([partition], timeout_ms=timeout_ms)).get(partition)

    async def _fetch_committed(
        self, partitions: Iterable[TopicPartition], *, timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append(tp.partition)
        response = await self._coordinator_call(
            OffsetFetchRequest(
                group_id=self._need_group(),
                topics=[
                    OffsetFetchTopic(name=t, partition_indexes=ps) for t, ps in by_topic.items()
                ],
            ),
            what="OffsetFetch",
            timeout_ms=timeout_ms,
        )
        assert isinstance(response, OffsetFetchResponse)
        out: dict[TopicPartition, OffsetAndMetadata] = {}
        for topic in response.topics:
            for p in topic.partitions:
                if p.committed_offset >= 0:
                    out[TopicPartition(topic.name, p.partition_index)] = OffsetAndMetadata(
                        p.committed_offset, p.metadata or "", p.committed_leader_epoch
                    )
        return out

    async def _positions_from_committed(self, partitions: list[TopicPartition]) -> None:
        """Partitions without a position and no explicit reset start from the group's
        committed offset, validated like a seek with its epoch (KIP-320)."""
        if not self.group_id:
            return
        todo = [
            tp
            for tp in partitions
            if (s := self._states.get(tp)) is not None and s.position is None and s.reset is None
        ]
        if not todo:
            return
        for tp, om in (await self._fetch_committed(todo)).items():
            state = self._states.get(tp)
            if state is not None and state.position is None:
                log.info(
                    "%s: starting from the committed offset %d (leader epoch %d)",
                    tp,
                    om.offset,
                    om.leader_epoch,
                )
                state.set_position(om.offset, om.leader_epoch, validate=True)
                self._await_epoch_of(tp, om.leader_epoch)

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
        self._check()
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        limit = max_records or self.max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            await self._ensure_metadata()
            await self._update_positions(
                timeout_ms=max(0, int((deadline - time.monotonic()) * 1000))
            )
            self._notice_leader_changes()
            drained = self._drain(limit)
            if drained:
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

    async def _ensure_metadata(self) -> None:
        """Fetch metadata now for assigned partitions the cache does not know yet (the
        first poll after assign), at most once per retry backoff."""
        meta = self._cluster.metadata
        self._expand_subscription()
        missing_topic = self._subscription is not None and any(
            meta.partitions_for_topic(t) is None for t in self._subscription
        )
        if not missing_topic and all(meta.partition(tp) is not None for tp in self._states):
            return
        now = time.monotonic()
        if now - self._last_metadata_wait < self.retry_backoff_ms / 1000:
            return
        self._last_metadata_wait = now
        try:
            await self._cluster.refresh_metadata()
        except MinibrokerError as exc:
            log.debug("metadata refresh failed: %s", exc)
        self._expand_subscription()

    def _drain(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp in list(self._buffer):
            if limit <= 0:
                break
            fetched = self._buffer[tp]
            state = self._states.get(tp)
            if state is None or state.paused or state.position != fetched.fetch_offset:
                del self._buffer[tp]  # unassigned, paused or seeked since the fetch
                continue
            chunk = fetched.records[fetched.index : fetched.index + limit]
            fetched.index += len(chunk)
            limit -= len(chunk)
            if chunk:
                out[tp] = chunk
                last = chunk[-1]
                state.position = last.offset + 1
                state.position_epoch = last.leader_epoch
            if fetched.index >= len(fetched.records):
                # Past the last batch even if its tail records were compacted away.
                del self._buffer[tp]
                if fetched.next_offset > state.position:
                    state.position = fetched.next_offset
                    state.position_epoch = fetched.next_epoch
            else:
                fetched.fetch_offset = state.position
        return out

    def _send_fetches(self) -> None:
        now = time.monotonic()
        by_leader: dict[int, list[tuple[TopicPartition, int, int, int]]] = defaultdict(list)
        to_validate: dict[int, list[tuple[TopicPartition, int, int, int]]] = defaultdict(list)
        for tp, state in self._states.items():
            if state.paused or state.position is None or tp in self._buffer:
                continue
            if state.backoff_until > now:
                continue
            try:
                leader, epoch = leader_for_epoch(self._cluster, tp, state.position_epoch)
            except LeaderEpochBehindError as exc:
                self._wait_for_leader_epoch(tp, state, exc)
                continue
            except BrokerResponseError:
                self._cluster.request_refresh()
                state.backoff_until = now + self.retry_backoff_ms / 1000
                continue
            if epoch != state.leader_epoch_seen:
                self._note_leader_epoch(tp, state, epoch)
            if state.awaiting_validation:
                if leader not in self._validating:
                    to_validate[leader].append((tp, state.position, epoch, state.position_epoch))
                continue
            if leader in self._fetching:
                continue
            state.epoch_wait_since, state.epoch_waits = 0.0, 0
            by_leader[leader].append((tp, state.position, epoch, state.position_epoch))
        loop = asyncio.get_running_loop()
        for node, parts in to_validate.items():
            self._validating[node] = loop.create_task(
                self._validate(node, parts), name=f"minibroker-validate-{node}"
            )
        for node, parts in by_leader.items():
            task = loop.create_task(self._fetch(node, parts), name=f"minibroker-fetch-{node}")
            self._fetching[node] = task

    def _note_leader_epoch(self, tp: TopicPartition, state: _PartitionState, epoch: int) -> None:
        """The partition's leader epoch differs from the one we fetched with last (a
        leader change, or the first fetch). After a leader change the new leader may
        hold a different lineage (unclean election): validate the position against it
        with OffsetsForLeaderEpoch before fetching (KIP-320). Without the epoch of the
        last consumed record there is nothing to validate against (Kafka skips too)."""
        if state.leader_epoch_seen != NO_EPOCH:
            log.info(
                "%s: leader epoch changed %d -> %d at position %s (epoch %d)%s",
                tp,
                state.leader_epoch_seen,
                epoch,
                state.position,
                state.position_epoch,
                "; validating it" if state.position_epoch != NO_EPOCH else "",
            )
            if state.position_epoch != NO_EPOCH:
                state.awaiting_validation = True
        state.leader_epoch_seen = epoch

    def _notice_leader_changes(self) -> None:
        """Kafka's maybeValidatePositionForCurrentLeader, before anything is handed
        out: a partition whose leader epoch in the metadata changed (whatever refreshed
        it: a fetch error, end_offsets(), a background refresh) awaits validation, and
        its buffered records, fetched from the old leader, are dropped (Kafka's fetch
        collector drops completed fetches of a partition that is not FETCHING): after
        an unclean election they belong to a lineage that may be gone."""
        meta = self._cluster.metadata
        for tp, state in self._states.items():
            if state.position is None:
                continue
            partition = meta.partition(tp)
            if partition is None or partition.leader_epoch == state.leader_epoch_seen:
                continue
            self._note_leader_epoch(tp, state, partition.leader_epoch)
            if state.awaiting_validation and self._buffer.pop(tp, None) is not None:
                log.info(
                    "%s: dropped the records buffered from the previous leader; position %d "
                    "(leader epoch %d) is validated first",
                    tp,
                    state.position,
                    state.position_epoch,
                )

    def _wait_for_leader_epoch(
        self, tp: TopicPartition, state: _PartitionState, why: LeaderEpochBehindError
    ) -> None:
        """The position's epoch is newer than the leader the metadata shows, or that
        leader answered "unknown" for it (client/epochs.py rules 1 and 2): refresh
        metadata and try again later, backing off exponentially up to 1 s; poll()
        returns nothing for this partition meanwhile, the others go on. After
        default_api_timeout_ms of waiting poll() raises KafkaTimeoutError (the position
        is kept and the wait starts over)."""
        now = time.monotonic()
        if not state.epoch_wait_since:
            state.epoch_wait_since = now
            log.info("%s: position %s waits for its leader epoch: %s", tp, state.position, why)
        elif now - state.epoch_wait_since >= self.default_api_timeout_ms / 1000:
            state.epoch_wait_since = now
            error = KafkaTimeoutError(
                f"{tp}: the position {state.position} (leader epoch {state.position_epoch}) "
                f"could not be validated within default_api_timeout_ms="
                f"{self.default_api_timeout_ms}: no broker showed a leader at that epoch "
                f"({why}). The consumer keeps the position and goes on waiting; if the "
                "topic was deleted and created again, the epoch belongs to the old topic: "
                "seek() to an offset without an epoch to go on"
            )
            error.__cause__ = why
            self._pending_error = error
        backoff = self.retry_backoff_ms / 1000 * 2 ** min(state.epoch_waits, 10)
        cap = max(_EPOCH_WAIT_MAX_BACKOFF_S, self.retry_backoff_ms / 1000)
        state.epoch_waits += 1
        state.backoff_until = now + min(backoff, cap)
        self._cluster.request_refresh()

    async def _validate(self, node: int, parts: list[tuple[TopicPartition, int, int, int]]) -> None:
        """OffsetsForLeaderEpoch(current_leader_epoch, leader_epoch = epoch of the last
        consumed record) for each partition awaiting validation on leader `node`."""
        asked = {tp: (epoch, last_epoch) for tp, _, epoch, last_epoch in parts}
        sent = {tp: (offset, last_epoch) for tp, offset, _, last_epoch in parts}
        try:
            try:
                outcomes = await ask_leader(
                    self._cluster, node, asked, timeout_ms=self.request_timeout_ms
                )
            except MinibrokerError as exc:  # ask_leader reports most errors per partition
                outcomes = dict.fromkeys(asked, exc)
            for tp, outcome in outcomes.items():
                self._handle_validation(tp, sent[tp], outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: surface it from poll()
            log.exception("validation with broker %d failed", node)
            self._pending_error = exc
        finally:
            self._validating.pop(node, None)
            self._fetch_done.set()

    def _handle_validation(
        self, tp: TopicPartition, sent: tuple[int, int], outcome: EpochEndOffset | MinibrokerError
    ) -> None:
        state = self._states.get(tp)
        if state is None or (state.position, state.position_epoch) != sent:
            return  # unassigned or seeked while the request was out
        if not state.awaiting_validation:
            return
        if isinstance(outcome, LeaderEpochBehindError):
            self._wait_for_leader_epoch(tp, state, outcome)
            return
        if isinstance(outcome, MinibrokerError):
            if not outcome.retriable:
                self._pending_error = outcome
                return
            log.info("%s: cannot validate the position yet: %s", tp, outcome)
            state.backoff_until = time.monotonic() + self.retry_backoff_ms / 1000
            if outcome.invalid_metadata:
                self._cluster.request_refresh()
            return
        position, epoch = sent
        state.awaiting_validation = False
        state.epoch_wait_since = 0.0
        state.epoch_waits = 0
        if outcome.truncates(position):
            self._truncated(tp, state, outcome.leader_epoch, outcome.end_offset)
            return
        log.debug(
            "%s: position %d (epoch %d) is valid: epoch %d ends at %d",
            tp,
            position,
            epoch,
            outcome.leader_epoch,
            outcome.end_offset,
        )

    async def _fetch(self, node: int, parts: list[tuple[TopicPartition, int, int, int]]) -> None:
        by_topic: dict[str, list[FetchPartition]] = defaultdict(list)
        for tp, offset, epoch, last_epoch in parts:
            by_topic[tp.topic].append(
                FetchPartition(
                    partition=tp.partition,
                    current_leader_epoch=epoch,
                    fetch_offset=offset,
                    last_fetched_epoch=last_epoch,
                    partition_max_bytes=self.max_partition_fetch_bytes,
                )
            )
        request = FetchRequest(
            replica_id=CONSUMER_REPLICA_ID,
            max_wait_ms=self.fetch_max_wait_ms,
            min_bytes=self.fetch_min_bytes,
            max_bytes=self.fetch_max_bytes,
            isolation_level=self.isolation_level,
            topics=[FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        )
        offsets = {tp: offset for tp, offset, _, _ in parts}
        try:
            response = await self._cluster.send(
                node, request, timeout_ms=self.request_timeout_ms + self.fetch_max_wait_ms
            )
            assert isinstance(response, FetchResponse)
            if response.error_code != ErrorCode.NONE:
                raise error_for(response.error_code, f"Fetch refused by broker {node}")
            for topic in response.responses:
                for p in topic.partitions:
                    tp = TopicPartition(topic.topic, p.partition_index)
                    if tp in offsets:
                        self._handle_partition(tp, offsets[tp], p)
        except MinibrokerError as exc:
            if not exc.retriable:
                self._pending_error = exc
            else:
                log.info("fetch from broker %d failed: %s; backing off", node, exc)
                until = time.monotonic() + self.retry_backoff_ms / 1000
                for tp in offsets:
                    state = self._states.get(tp)
                    if state is not None:
                        state.backoff_until = until
                if exc.invalid_metadata:
                    self._cluster.request_refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or corrupt data: surface it from poll()
            log.exception("fetch from broker %d failed", node)
            self._pending_error = exc
        finally:
            self._fetching.pop(node, None)
            self._fetch_done.set()

    def _handle_partition(
        self, tp: TopicPartition, fetch_offset: int, p: FetchPartitionResponse
    ) -> None:
        state = self._states.get(tp)
        if state is None or state.position != fetch_offset or state.paused:
            return  # unassigned, seeked or paused while the fetch was out
        code = p.error_code
        if code == ErrorCode.NONE:
            if p.high_watermark >= 0:
                state.high_watermark = p.high_watermark
            if p.log_start_offset >= 0:
                state.log_start_offset = p.log_start_offset
            if p.diverging_epoch.epoch >= 0:
                self._handle_diverging(
                    tp, state, p.diverging_epoch.epoch, p.diverging_epoch.end_offset
                )
                return
            self._buffer_records(tp, state, fetch_offset, p.records)
            return
        error = error_for(code, topic=tp.topic, partition=tp.partition)
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            self._out_of_range(
                tp,
                state,
                fetch_offset,
                f"log start {p.log_start_offset}, high watermark {p.high_watermark}",
            )
            return
        if (
            code in (ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            and state.position_epoch != NO_EPOCH
        ):
            # The leader changed under us: validate before fetching from the new one.
            state.awaiting_validation = True
        if error.retriable:
            log.info("%s: %s; refreshing metadata and retrying", tp, error)
            state.backoff_until = time.monotonic() + self.retry_backoff_ms / 1000
            if error.invalid_metadata:
                self._cluster.request_refresh()
            return
        self._pending_error = error

    def _buffer_records(
        self, tp: TopicPartition, state: _PartitionState, fetch_offset: int, data: bytes
    ) -> None:
        if not data:
            return
        # Whole batches decode straight into ConsumerRecords, one pass per batch
        # (decode_batch_into); control batches only move the next offset.
        records: list[ConsumerRecord] = []
        next_offset, next_epoch = fetch_offset, state.position_epoch
        topic, partition = tp.topic, tp.partition
        verify = self.check_crcs
        try:
            for pos, header in iter_headers(data):
                if verify:
                    check_batch(data, pos, header)
                if not header.is_control:
                    start = len(records)
                    decode_batch_into(records, data, pos, header, ConsumerRecord, topic, partition)
                    if header.base_offset < fetch_offset:  # the batch holding the position
                        records[start:] = [r for r in records[start:] if r[2] >= fetch_offset]
                if header.next_offset > next_offset:
                    next_offset = header.next_offset
                    next_epoch = header.partition_leader_epoch
        except ProtocolCorruptRecordError as exc:
            # Records decoded before the bad batch are still good: return them first.
            if not records:
                self._pending_error = error_for(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"at offset {next_offset}: {exc}",
                    topic=tp.topic,
                    partition=tp.partition,
                )
                return
        kd, vd = self._key_deserializer, self._value_deserializer
        if kd is not None or vd is not None:
            records = [
                r._replace(
                    key=kd(r.key) if kd is not None and r.key is not None else r.key,
                    value=vd(r.value) if vd is not None and r.value is not None else r.value,
                )
                for r in records
            ]
        self._buffer[tp] = _Fetched(fetch_offset, records, next_offset, next_epoch)

    def _handle_diverging(
        self, tp: TopicPartition, state: _PartitionState, epoch: int, end_offset: int
    ) -> None:
        """The leader's log diverges from ours after `end_offset` for `epoch`."""
        position = state.position
        assert position is not None
        if end_offset >= position:
            # Our lineage is intact up to the position; only our epoch was unknown.
            state.position_epoch = epoch
            return
        self._truncated(tp, state, epoch, end_offset)

    def _truncated(
        self, tp: TopicPartition, state: _PartitionState, epoch: int, end_offset: int
    ) -> None:
        """The current leader's lineage ends at `end_offset` for our `epoch`, below our
        position: records we returned are gone (unclean election). Policy 'none' raises
        LogTruncationError; 'earliest'/'latest' resume at the divergence point (Kafka)."""
        position = state.position
        assert position is not None
        if self.auto_offset_reset == "none":
            self._pending_error = LogTruncationError(
                f"log truncation detected on {tp}: the consumer's position {position} "
                f"(leader epoch {state.position_epoch}) is past the end of the current log "
                f"lineage, which diverges at offset {end_offset} (leader epoch {epoch}); "
                f"records from {end_offset} to {position - 1} that were consumed are gone. "
                f"seek({tp.topic!r}, {tp.partition}) to {end_offset} to go on",
                {tp: OffsetAndMetadata(end_offset, "", epoch)},
                {tp: position},
            )
            return
        log.warning(
            "log truncation detected on %s: position %d (leader epoch %d) is past the "
            "divergence offset %d (leader epoch %d); resuming from %d",
            tp,
            position,
            state.position_epoch,
            end_offset,
            epoch,
            end_offset,
        )
        self._buffer.pop(tp, None)
        state.set_position(end_offset, epoch)
        if self.on_truncation is not None:
            self.on_truncation(tp, position, OffsetAndMetadata(end_offset, "", epoch))

    def _out_of_range(
        self, tp: TopicPartition, state: _PartitionState, offset: int, why: str
    ) -> None:
        if self.auto_offset_reset == "none":
            self._pending_error = OffsetOutOfRangeError(
                f"offset {offset} is out of range ({why}) and auto_offset_reset='none'",
                offsets={tp: offset},
                topic=tp.topic,
                partition=tp.partition,
            )
            return
        log.warning(
            "%s: offset %d is out of range (%s); resetting to %s",
            tp,
            offset,
            why,
            self.auto_offset_reset,
        )
        state.position = None
        state.position_epoch = NO_EPOCH
        state.awaiting_validation = False
        state.reset = self.auto_offset_reset
        self._cluster.metadata.stop_awaiting(tp)
