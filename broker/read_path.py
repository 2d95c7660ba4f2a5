"""The read path: Fetch with long-poll (consumers below the high watermark, followers up
to the log end, whose fetch records their progress), ListOffsets and
OffsetsForLeaderEpoch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter

from broker.delayed_requests import DelayedFetch
from broker.delayed_requests import _FetchWatch
from broker.delayed_requests import fetch_response_max_bytes
from broker.delayed_requests import log
from broker.delayed_requests import mono_ms
from broker.fetch_sessions import FINAL_EPOCH
from broker.fetch_sessions import INITIAL_EPOCH
from broker.fetch_sessions import NO_SESSION
from broker.fetch_sessions import FetchSession
from broker.fetch_sessions import FetchSessionCache
from broker.fetch_sessions import next_epoch
from broker.fetch_sessions import urgent
from broker.metadata_image import TopicPartition
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


class _FetchPass:
    """One pass over a fetch's partitions, in the order given: the answers, the bytes
    read (the fetch's byte budget shared by all of them, the first partition with data
    returning at least one whole batch), what to watch if the fetch waits, and
    whether it must answer now (an error)."""

    def __init__(self, read_path: ReadPath, request: FetchRequest, *, first: bool) -> None:
        self.read_path = read_path
        self.replica_id = request.replica_id
        self.replica_epoch = request.replica_epoch
        self.is_follower = self.replica_id >= 0
        self.to_leo = self.is_follower or self.replica_id == DEBUGGING_REPLICA_ID
        self.first = first
        self.remaining = fetch_response_max_bytes(read_path.config, request)
        self.min_one = True
        self.total = 0
        self.answer_now = False
        self.watches: list[_FetchWatch] = []
        self.ts = mono_ms()

    def read(
        self, topic: str, fp: FetchPartition
    ) -> tuple[FetchPartitionResponse, Partition | None]:
        """The answer for one partition, and the partition when it passed the checks."""
        replica_id = self.replica_id
        # Kafka lets a debugging consumer read any replica, not only the leader.
        r, p = self.read_path._fetch_partition_checks(
            topic, fp, require_leader=replica_id != DEBUGGING_REPLICA_ID
        )
        if p is None:
            self.answer_now = True
            return r, None
        if self.is_follower and replica_id not in p.replicas:
            # Only assigned replicas may read past the high watermark.
            r.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
            self.answer_now = True
            return r, None
        if self.is_follower and self.first:
            self.read_path._record_follower_fetch(p, replica_id, self.replica_epoch, fp, self.ts)
        r.high_watermark = p.high_watermark
        r.last_stable_offset = p.high_watermark
        max_offset = p.log_end_offset if self.to_leo else p.high_watermark
        limit = min(max(0, fp.partition_max_bytes), self.remaining)
        data = b""
        if fp.fetch_offset < max_offset and (limit > 0 or self.min_one):
            try:
                data = p.log.read(
                    fp.fetch_offset, limit, max_offset=max_offset, min_one_batch=self.min_one
                )
            except OffsetOutOfRangeError:
                r.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                r.log_start_offset = p.log_start_offset
                self.answer_now = True
                return r, None
            except StorageError as exc:
                # FileOpenError: logged once per run by the storage layer.
                level = logging.DEBUG if isinstance(exc, FileOpenError) else logging.ERROR
                log.log(level, "%s: read at %d failed: %s", p.name, fp.fetch_offset, exc)
                r.error_code = ErrorCode.KAFKA_STORAGE_ERROR
                self.answer_now = True
                return r, None
        if data:
            r.records = data
            self.total += len(data)
            self.remaining = max(0, self.remaining - len(data))
            self.min_one = False
        self.watches.append(_FetchWatch(p, fp.fetch_offset))
        return r, p


class _SessionAnswer:
    """What one pass over a session found: the answers with news, whether any of it
    must go out at once (`urgent`), and what sending it settles (`sent`)."""

    def __init__(self) -> None:
        self.by_topic: dict[str, list[FetchPartitionResponse]] = {}
        self.told: list[tuple[TopicPartition, FetchPartitionResponse, bool]] = []
        self.urgent = False

    def add(
        self,
        topic: str,
        r: FetchPartitionResponse,
        tp: TopicPartition | None = None,
        *,
        settled: bool = False,
    ) -> None:
        self.by_topic.setdefault(topic, []).append(r)
        self.urgent = self.urgent or urgent(r)
        if tp is not None:
            self.told.append((tp, r, settled))

    def sent(self, session: FetchSession) -> list[FetchTopicResponse]:
        """The answer, once it goes out: what it told is no longer news; a settled
        partition leaves the marked ones; one answered with records goes to the back
        (the others get the byte budget first next time)."""
        for tp, r, settled in self.told:
            session.sent(tp, r)
            if tp in session.dirty and (settled or r.records):
                del session.dirty[tp]
                if not settled:
                    session.dirty[tp] = None
        return [FetchTopicResponse(topic=t, partitions=ps) for t, ps in self.by_topic.items()]


class ReadPath:
    """The read path: Fetch with long-poll (consumers below the high watermark, followers up
    to the log end; a follower's fetch may use an incremental session)."""

    fetch_sessions: FetchSessionCache

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        if request.replica_id >= 0 and (
            request.session_id != NO_SESSION or request.session_epoch != FINAL_EPOCH
        ):
            return await self._session_fetch(request)
        return await self._sessionless_fetch(request)

    async def _sessionless_fetch(self, request: FetchRequest) -> FetchResponse:
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
        fetch_pass = _FetchPass(self, request, first=first)
        out: list[FetchTopicResponse] = []
        for topic in request.topics:
            parts = [fetch_pass.read(topic.topic, fp)[0] for fp in topic.partitions]
            out.append(FetchTopicResponse(topic=topic.topic, partitions=parts))
        return out, fetch_pass.total, fetch_pass.watches, fetch_pass.answer_now

    # ------------------------------------------------------------------ fetch sessions

    async def _session_fetch(self, request: FetchRequest) -> FetchResponse:
        """A follower's fetch that opens, continues or closes a session
        (broker/fetch_sessions.py). Only the session's partitions that may have news
        are looked at, and only those with news are answered."""
        sessions = self.fetch_sessions
        if request.session_epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if request.session_id != NO_SESSION:
                sessions.close(request.session_id, request.replica_id)
            session = (
                sessions.open(request.replica_id)
                if request.session_epoch == INITIAL_EPOCH
                else None
            )
            if session is None:
                return await self._sessionless_fetch(request)
        else:
            found = sessions.lookup(request)
            if isinstance(found, ErrorCode):
                return FetchResponse(error_code=found)
            session = found
        session.in_use = True
        session.last_request_ms = mono_ms()
        session.next_epoch = next_epoch(request.session_epoch)
        try:
            return await self._serve_session(session, request)
        finally:
            session.in_use = False
            session.last_used = time.monotonic()

    async def _serve_session(self, session: FetchSession, request: FetchRequest) -> FetchResponse:
        sessions = self.fetch_sessions
        unknown = sessions.update(
            session,
            ((t.topic, fp) for t in request.topics for fp in t.partitions),
            known=self.partitions.__contains__,
        )
        sessions.forget(session, ((t.topic, i) for t in request.forgotten for i in t.partitions))
        max_wait_s = max(0, min(request.max_wait_ms, self.config.max_fetch_wait_ms)) / 1000
        deadline = asyncio.get_running_loop().time() + max_wait_s
        first = True
        while True:
            session.wake.clear()
            answer = self._read_session(session, request, first=first, unknown=unknown)
            first, unknown = False, []
            remaining_s = deadline - asyncio.get_running_loop().time()
            if answer.urgent or remaining_s <= 0 or session.id not in sessions.sessions:
                break
            # Kafka's min_bytes is 1 for followers: records (or an error) answer at
            # once; a high watermark alone waits for them or for max_wait.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_s):
                    await session.wake.wait()
        responses = answer.sent(session)
        if hop_trace.TRACER is not None:
            _trace_fetch_answer(hop_trace.TRACER, request, responses)
        return FetchResponse(responses=responses, session_id=session.id)

    def _read_session(
        self,
        session: FetchSession,
        request: FetchRequest,
        *,
        first: bool,
        unknown: list[tuple[str, FetchPartition]],
    ) -> _SessionAnswer:
        """One pass over the session's partitions that may have news. A partition stays
        marked while the follower is behind (records sent, the byte budget ran out, an
        error) or outside the ISR: it is looked at again next time, with the position
        the follower states by then; and while it has news not sent yet."""
        fetch_pass = _FetchPass(self, request, first=first)
        answer = _SessionAnswer()
        for topic, fp in unknown:  # not kept in the session: answered once
            answer.add(topic, fetch_pass.read(topic, fp)[0])
        for tp in list(session.dirty):
            fp = session.partitions[tp].fetch
            r, p = fetch_pass.read(tp[0], fp)
            # Outside the ISR, every fetch may let the follower join it (Kafka looks
            # at each session partition on each fetch): it stays marked until then.
            behind = (
                p is None or fp.fetch_offset < p.log_end_offset or request.replica_id not in p.isr
            )
            if session.news(tp, r):
                answer.add(tp[0], r, tp, settled=not behind)
            elif not behind:
                del session.dirty[tp]
        return answer

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
        # As Kafka: a partition asked twice is INVALID_REQUEST, each time; the rest are
        # served.
        pairs = [(t.name, lp.partition_index) for t in request.topics for lp in t.partitions]
        repeated: set[tuple[str, int]] = set()
        if len(set(pairs)) < len(pairs):  # counted only then (rare)
            repeated = {tp for tp, n in Counter(pairs).items() if n > 1}
        return ListOffsetsResponse(
            topics=[
                ListOffsetsTopicResponse(
                    name=topic.name,
                    partitions=[
                        ListOffsetsPartitionResponse(
                            partition_index=lp.partition_index,
                            error_code=ErrorCode.INVALID_REQUEST,
                        )
                        if (topic.name, lp.partition_index) in repeated
                        else self._list_offset(topic.name, lp, to_leo)
                        for lp in topic.partitions
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
