"""The read path: Fetch with long-poll (consumers below the high watermark, followers up
to the log end, whose fetch records their progress), ListOffsets and
OffsetsForLeaderEpoch."""

from __future__ import annotations

import logging

from broker.delayed_requests import DelayedFetch
from broker.delayed_requests import _FetchWatch
from broker.delayed_requests import fetch_response_max_bytes
from broker.delayed_requests import log
from broker.delayed_requests import mono_ms
from broker.partition import Partition
from broker.storage.errors import FileOpenError
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.errors import StorageError
from protocol.api import DEBUGGING_REPLICA_ID
from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import LATEST_TIMESTAMP
from protocol.errors import ErrorCode
from protocol.messages import EpochEndOffset
from protocol.messages import EpochEndOffsetResult
from protocol.messages import FetchPartition
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopicResponse
from protocol.messages import ListOffsetsPartition
from protocol.messages import ListOffsetsPartitionResponse
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopicResponse
from protocol.messages import Message
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import OffsetForLeaderPartition
from protocol.messages import OffsetForLeaderTopicResult
from runtime import hop_trace
from runtime.epoch_lineage import OUT_OF_RANGE
from runtime.epoch_lineage import diverging_epoch


def _trace_fetch_answer(
    tracer: hop_trace.HopTracer, request: FetchRequest, responses: list[FetchTopicResponse]
) -> None:
    replica = request.replica_id
    hop = f"leader.fetch.follower-{replica}" if replica >= 0 else "leader.fetch.consumer"
    for topic in responses:
        for r in topic.partitions:
            tracer.stamp_batches(hop, topic.topic, r.partition_index, r.records)


class ReadPath:
    """The read path: Fetch with long-poll (consumers below the high watermark, followers up"""

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        to_leo = request.replica_id >= 0 or request.replica_id == DEBUGGING_REPLICA_ID
        responses, total, watches, answer_now = self._read_fetch(request, first=True)
        max_wait_ms = min(request.max_wait_ms, self.config.max_fetch_wait_ms)
        # Kafka's rule: never wait for more than the response may carry.
        min_bytes = min(request.min_bytes, fetch_response_max_bytes(self.config, request))
        if answer_now or total >= min_bytes or max_wait_ms <= 0 or not watches:
            if hop_trace.TRACER is not None:
                _trace_fetch_answer(hop_trace.TRACER, request, responses)
            return FetchResponse(responses=responses)
        op = DelayedFetch(watches, min_bytes=min_bytes, have_bytes=total, to_leo=to_leo)
        await self.fetch_purgatory.wait(op, max_wait_ms / 1000)
        responses, _, _, _ = self._read_fetch(request, first=False)
        if hop_trace.TRACER is not None:
            _trace_fetch_answer(hop_trace.TRACER, request, responses)
        return FetchResponse(responses=responses)

    def _read_fetch(
        self, request: FetchRequest, *, first: bool
    ) -> tuple[list[FetchTopicResponse], int, list[_FetchWatch], bool]:
        """One pass over the requested partitions: (responses, bytes read, what to
        watch if the fetch waits, whether it must answer now)."""
        replica_id = request.replica_id
        is_follower = replica_id >= 0
        to_leo = is_follower or replica_id == DEBUGGING_REPLICA_ID
        remaining = fetch_response_max_bytes(self.config, request)
        min_one = True  # the first partition with data returns at least one whole batch
        total = 0
        answer_now = False
        watches: list[_FetchWatch] = []
        ts = mono_ms()
        out: list[FetchTopicResponse] = []
        for topic in request.topics:
            parts: list[FetchPartitionResponse] = []
            out.append(FetchTopicResponse(topic=topic.topic, partitions=parts))
            for fp in topic.partitions:
                # Kafka lets a debugging consumer read any replica, not only the leader.
                r, p = self._fetch_partition_checks(
                    topic.topic, fp, require_leader=replica_id != DEBUGGING_REPLICA_ID
                )
                parts.append(r)
                if p is None:
                    answer_now = True
                    continue
                if is_follower and replica_id not in p.replicas:
                    # Only assigned replicas may read past the high watermark.
                    r.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    answer_now = True
                    continue
                if is_follower and first:
                    self._record_follower_fetch(p, replica_id, request.replica_epoch, fp, ts)
                r.high_watermark = p.high_watermark
                r.last_stable_offset = p.high_watermark
                max_offset = p.log_end_offset if to_leo else p.high_watermark
                limit = min(max(0, fp.partition_max_bytes), remaining)
                data = b""
                if fp.fetch_offset < max_offset and (limit > 0 or min_one):
                    try:
                        data = p.log.read(
                            fp.fetch_offset, limit, max_offset=max_offset, min_one_batch=min_one
                        )
                    except OffsetOutOfRangeError:
                        r.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                        r.log_start_offset = p.log_start_offset
                        answer_now = True
                        continue
                    except StorageError as exc:
                        # FileOpenError: logged once per run by the storage layer.
                        level = logging.DEBUG if isinstance(exc, FileOpenError) else logging.ERROR
                        log.log(level, "%s: read at %d failed: %s", p.name, fp.fetch_offset, exc)
                        r.error_code = ErrorCode.KAFKA_STORAGE_ERROR
                        answer_now = True
                        continue
                if data:
                    r.records = data
                    total += len(data)
                    remaining = max(0, remaining - len(data))
                    min_one = False
                watches.append(_FetchWatch(p, fp.fetch_offset))
        return out, total, watches, answer_now

    def fetch_reservation(self, body: Message) -> int:
        """What a request may add to its connection's pending bytes beyond its own
        frame (protocol.connection.ServerConnection reserves it while it is served):
        a Fetch its record-data cap, others nothing worth counting in advance."""
        if isinstance(body, FetchRequest):
            return fetch_response_max_bytes(self.config, body)
        return 0

    def _fetch_partition_checks(
        self, topic: str, fp: FetchPartition, *, require_leader: bool = True
    ) -> tuple[FetchPartitionResponse, Partition | None]:
        r = FetchPartitionResponse(partition_index=fp.partition)
        p, err = self._lookup(topic, fp.partition)
        if p is None:
            r.error_code = err
            r.current_leader = self._current_leader(topic, fp.partition)
            return r, None
        r.current_leader = p.current_leader
        r.high_watermark = p.high_watermark
        r.last_stable_offset = p.high_watermark
        r.log_start_offset = p.log_start_offset
        err = p.check_leader_epoch(fp.current_leader_epoch, require_leader=require_leader)
        if err != ErrorCode.NONE:
            r.error_code = err
            return r, None
        leo = p.log_end_offset
        # Kafka's order (Partition.readRecords): an epoch we cannot place, or an offset
        # below our log start, is out of range whatever the epochs say. A fetch without
        # a last fetched epoch (NO_EPOCH) has nothing to check here.
        diverging = diverging_epoch(
            p.log.epoch_cache.lineage,
            p.log_start_offset,
            leo,
            fp.last_fetched_epoch,
            fp.fetch_offset,
        )
        if diverging == OUT_OF_RANGE:
            r.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            return r, None
        if diverging is not None:
            # KIP-320/595: the fetcher's log diverges from ours; it truncates to this
            # point (or reports LogTruncation) before fetching again.
            r.diverging_epoch = EpochEndOffset(
                epoch=diverging.epoch, end_offset=diverging.end_offset
            )
            return r, None
        if not p.log_start_offset <= fp.fetch_offset <= leo:
            r.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            return r, None
        return r, p

    def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        to_leo = request.replica_id >= 0 or request.replica_id == DEBUGGING_REPLICA_ID
        return ListOffsetsResponse(
            topics=[
                ListOffsetsTopicResponse(
                    name=topic.name,
                    partitions=[
                        self._list_offset(topic.name, lp, to_leo) for lp in topic.partitions
                    ],
                )
                for topic in request.topics
            ]
        )

    def _list_offset(
        self, topic: str, lp: ListOffsetsPartition, to_leo: bool
    ) -> ListOffsetsPartitionResponse:
        r = ListOffsetsPartitionResponse(partition_index=lp.partition_index)
        p = self._leader_at(r, topic, lp.partition_index, lp.current_leader_epoch)
        if p is None:
            return r
        ts = lp.timestamp
        # Kafka's fetchOffsetForTimestamp: for consumers, a new leader whose HW lags its
        # epoch start has no "latest" to give (it would go back), nor a timestamp answer
        # at or past its HW; earliest is served.
        lagging = not to_leo and p.high_watermark_behind_epoch_start
        if ts == EARLIEST_TIMESTAMP:
            r.offset = p.log_start_offset
            epoch = p.log.epoch_cache.epoch_for_offset(r.offset)
            r.leader_epoch = epoch if epoch is not None else -1
        elif ts == LATEST_TIMESTAMP:
            if lagging:
                r.error_code = ErrorCode.OFFSET_NOT_AVAILABLE
                return r
            r.offset = p.log_end_offset if to_leo else p.high_watermark
            r.leader_epoch = p.leader_epoch
        elif ts >= 0:
            found = p.log.offset_for_timestamp(ts)
            limit = p.log_end_offset if to_leo else p.high_watermark
            if found is not None and found[0] < limit:
                r.offset, r.timestamp, r.leader_epoch = found[0], found[1], found[2]
            elif lagging:
                r.error_code = ErrorCode.OFFSET_NOT_AVAILABLE
        else:
            r.error_code = ErrorCode.INVALID_REQUEST
        return r

    def offsets_for_leader_epoch(
        self, request: OffsetForLeaderEpochRequest
    ) -> OffsetForLeaderEpochResponse:
        return OffsetForLeaderEpochResponse(
            topics=[
                OffsetForLeaderTopicResult(
                    topic=topic.topic,
                    partitions=[self._epoch_end_offset(topic.topic, op) for op in topic.partitions],
                )
                for topic in request.topics
            ]
        )

    def _epoch_end_offset(self, topic: str, op: OffsetForLeaderPartition) -> EpochEndOffsetResult:
        r = EpochEndOffsetResult(partition=op.partition)
        p = self._leader_at(r, topic, op.partition, op.current_leader_epoch)
        if p is not None:
            r.leader_epoch, r.end_offset = p.log.epoch_cache.end_offset_for(
                op.leader_epoch, p.log_end_offset
            )
        return r
