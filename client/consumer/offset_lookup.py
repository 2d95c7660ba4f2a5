"""Offsets looked up at the leaders: ListOffsets (earliest, latest, by time) with the
leader epoch, partitions of a topic, and the positions of partitions that need a reset."""

from __future__ import annotations

import time
from collections.abc import Iterable

from client.consumer.partition_state import _RESET_TIMESTAMPS
from client.consumer.partition_state import log
from client.errors import KafkaTimeoutError
from client.errors import MinibrokerError
from client.errors import NoOffsetForPartitionError
from client.offsets import list_offsets
from client.types import OffsetAndTimestamp
from client.types import TopicPartition
from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import LATEST_TIMESTAMP
from protocol.errors import ErrorCode


class OffsetLookup:
    """Offsets looked up at the leaders: ListOffsets (earliest, latest, by time) with the"""

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
