"""The driver's view of the cluster while planning: partitions, log start offsets, high
watermarks, and leader epochs (OffsetsForLeaderEpoch, through client.epochs).

A blocking client like client.sync's (its own event loop on a daemon thread) around
one AsyncConsumer, which holds the metadata cache and connections; one per stream
reader, kept for the query's life. Every call retries retriable errors (no leader
during an election, a leader that moved, metadata not yet at a stored leader epoch,
OFFSET_NOT_AVAILABLE from a new leader) with an exponential backoff until `timeout_ms`
has passed, then raises the last error: planning must not fail over a normal
failover, nor wait forever. fetchOffset.numRetries / fetchOffset.retryIntervalMs, when
given, bound the retries instead (Spark's meaning: that many retries, that far apart),
still within `timeout_ms`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TypeVar

from client.consumer import AsyncConsumer
from client.epochs import EpochEndOffset
from client.epochs import end_offsets_for_epochs
from client.epochs import epochs_before_offsets
from client.errors import KafkaTimeoutError
from client.errors import MinibrokerError
from client.offsets import list_offsets
from client.spark.offsets import Position
from client.sync import _SyncClient
from client.types import OffsetAndTimestamp
from client.types import TopicPartition
from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import LATEST_TIMESTAMP

log = logging.getLogger(__name__)

T = TypeVar("T")
_RETRY_BACKOFF_S = 0.2
_RETRY_BACKOFF_MAX_S = 2.0


class ClusterView(_SyncClient):
    """Blocking planning queries against the current leaders."""

    _thread_name = "minibroker-spark-planner"
    _async_client = AsyncConsumer

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        timeout_ms: int,
        retries: int | None = None,
        retry_interval_ms: int | None = None,
    ) -> None:
        self.timeout_ms = timeout_ms
        self.retries = retries
        self.retry_interval_ms = retry_interval_ms
        super().__init__(
            bootstrap_servers,
            api_timeout_ms=timeout_ms,
            client_id="minibroker-spark-planner",
            auto_offset_reset="none",
        )

    @property
    def _consumer(self) -> AsyncConsumer:
        return self._client  # type: ignore[no-any-return]

    def _retrying(self, what: str, step: Callable[[], Awaitable[T]]) -> T:
        async def attempt() -> T:
            deadline = time.monotonic() + self.timeout_ms / 1000
            backoff = _RETRY_BACKOFF_S
            if self.retry_interval_ms is not None:
                backoff = self.retry_interval_ms / 1000
            failures = 0
            while True:
                try:
                    return await step()
                except MinibrokerError as exc:
                    if not exc.retriable or time.monotonic() > deadline:
                        raise
                    failures += 1
                    if self.retries is not None and failures > self.retries:
                        raise KafkaTimeoutError(
                            f"{what} failed {failures} times (fetchOffset.numRetries="
                            f"{self.retries}); last error: {exc}"
                        ) from exc
                    log.info("%s failed (%s); retrying", what, exc)
                await asyncio.sleep(backoff)
                if self.retry_interval_ms is None:
                    backoff = min(backoff * 2, _RETRY_BACKOFF_MAX_S)
                try:
                    await self._consumer.cluster.refresh_metadata()
                except MinibrokerError as exc:
                    log.debug("metadata refresh failed: %s", exc)

        return self._run(attempt(), extra_ms=self.timeout_ms)

    def partitions(
        self,
        topics: Iterable[str],
        assignment: Iterable[TopicPartition] = (),
        pattern: str | None = None,
    ) -> set[TopicPartition]:
        """Every partition of `topics` and of the topics whose whole name matches
        `pattern`, plus the `assignment` partitions that exist (missing topics have
        none). Internal topics (`__consumer_offsets`) never match, as in Kafka."""
        topics, assignment = set(topics), set(assignment)

        async def step() -> set[TopicPartition]:
            cluster = self._consumer.cluster
            names = topics | {tp.topic for tp in assignment}
            if pattern is not None:
                every = await self._consumer.topics()
                matching = {t for t in every if not t.startswith("__") and re.fullmatch(pattern, t)}
                topics.update(matching)
                names |= matching
            await cluster.refresh_metadata(names)
            meta = cluster.metadata
            out = {TopicPartition(t, p) for t in topics for p in meta.partitions_for_topic(t) or ()}
            out |= {tp for tp in assignment if meta.partition(tp) is not None}
            return out

        return self._retrying("metadata", step)

    def log_starts(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset still in each log."""
        found = self._list_offsets(dict.fromkeys(tps, EARLIEST_TIMESTAMP), "earliest")
        return {tp: r.offset for tp, r in found.items()}

    def high_watermarks(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The end of what the leaders say is committed."""
        found = self._list_offsets(dict.fromkeys(tps, LATEST_TIMESTAMP), "latest")
        return {tp: r.offset for tp, r in found.items()}

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        """The first offset whose record's timestamp is >= the given ms (ListOffsets by
        time), or None when every record is older."""
        found = self._list_offsets(dict(timestamps), "by time")
        return {tp: (r.offset if r.offset >= 0 else None) for tp, r in found.items()}

    def _list_offsets(
        self, timestamps: dict[TopicPartition, int], what: str
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """One ListOffsets round per attempt: the retries are _retrying's (so
        fetchOffset.numRetries counts rounds)."""
        if not timestamps:
            return {}

        async def step() -> dict[TopicPartition, OffsetAndTimestamp]:
            await self._ensure_leaders(timestamps)
            results, errors = await list_offsets(self._consumer.cluster, timestamps, max_attempts=1)
            if errors:
                raise next(iter(errors.values()))
            return results

        return self._retrying(f"ListOffsets({what})", step)

    def epoch_ends(
        self, epochs: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, EpochEndOffset]:
        """Where each leader epoch ends on the partition's current leader."""
        if not epochs:
            return {}

        async def step() -> dict[TopicPartition, EpochEndOffset]:
            await self._ensure_leaders(epochs)
            results, errors = await end_offsets_for_epochs(self._consumer.cluster, epochs)
            if errors:
                raise next(iter(errors.values()))
            return results

        return self._retrying("OffsetsForLeaderEpoch", step)

    def positions_at(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, Position]:
        """Each offset as a Position: with the leader epoch of the record at offset - 1
        and where that epoch began, on the current leader."""
        if not offsets:
            return {}

        async def step() -> dict[TopicPartition, Position]:
            await self._ensure_leaders(offsets)
            found = await epochs_before_offsets(self._consumer.cluster, offsets)
            return {tp: Position(offsets[tp], e.epoch, e.start) for tp, e in found.items()}

        return self._retrying("leader epoch lookup", step)

    async def _ensure_leaders(self, tps: Iterable[TopicPartition]) -> None:
        cluster = self._consumer.cluster
        if any(cluster.metadata.partition(tp) is None for tp in tps):
            await cluster.wait_for_topics({tp.topic for tp in tps}, timeout_ms=self.timeout_ms)
