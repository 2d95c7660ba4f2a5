"""The append path: Produce with acks 0/1/all (min.insync.replicas before and after the
append, a delayed produce answered when the high watermark passes the batch), and the
partition lookup with its leader-epoch answer."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Protocol

from broker.delayed_requests import DelayedProduce
from broker.delayed_requests import log
from broker.groups.records import OFFSETS_TOPIC
from broker.partition import Partition
from broker.partition import Role
from broker.storage.errors import FileOpenError
from broker.storage.errors import InvalidAppendError
from broker.storage.errors import RecordTooLargeError
from broker.storage.errors import StorageError
from broker.storage.producer_state import ProducerStateError
from protocol.errors import CorruptRecordError
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.errors import InvalidRecordError
from protocol.invariants import invariant
from protocol.messages import LeaderIdAndEpoch
from protocol.messages import ProducePartitionResponse
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopicResponse
from runtime import hop_trace

# What a refused append answers, by the exception's class (the most specific listed
# class of the exception wins), and how loudly it is logged (None: not logged).
_REFUSALS: dict[type[Exception], tuple[ErrorCode | None, int | None, str]] = {
    InvalidRecordError: (ErrorCode.INVALID_RECORD, logging.INFO, "refused an invalid produce"),
    CorruptRecordError: (ErrorCode.CORRUPT_MESSAGE, logging.INFO, "refused a corrupt produce"),
    InvalidAppendError: (ErrorCode.CORRUPT_MESSAGE, logging.INFO, "refused a corrupt produce"),
    DecodeError: (ErrorCode.CORRUPT_MESSAGE, logging.INFO, "refused a corrupt produce"),
    RecordTooLargeError: (ErrorCode.MESSAGE_TOO_LARGE, None, ""),
    # None: the producer-state error carries its own code (OUT_OF_ORDER_SEQUENCE...).
    ProducerStateError: (None, logging.INFO, "refused an idempotent produce"),
    StorageError: (ErrorCode.KAFKA_STORAGE_ERROR, logging.ERROR, "append failed"),
    # Logged once per run of failures by the storage layer (file_handles.OpenFailureLog).
    FileOpenError: (ErrorCode.KAFKA_STORAGE_ERROR, logging.DEBUG, "append failed"),
}
_REFUSED_APPENDS = tuple(_REFUSALS)


def _refusal(p: Partition, exc: Exception) -> tuple[int, str]:
    """The error code and message a refused append answers; logs it as _REFUSALS says."""
    listed = next(cls for cls in type(exc).__mro__ if cls in _REFUSALS)
    code, level, what = _REFUSALS[listed]
    if level is not None:
        log.log(level, "%s: %s: %s", p.name, what, exc)
    if code is None:
        invariant(isinstance(exc, ProducerStateError), "only producer-state errors carry a code")
        code = exc.error_code  # type: ignore[attr-defined]
    return code, str(exc)


class _PartitionAnswer(Protocol):
    error_code: int


class AppendPath:
    """The append path: Produce with acks 0/1/all (min.insync.replicas before and after the"""

    def _current_leader(self, topic: str, index: int) -> LeaderIdAndEpoch:
        state = self.image.partition(topic, index)
        if state is None:
            return LeaderIdAndEpoch()
        return LeaderIdAndEpoch(leader_id=state.leader, leader_epoch=state.leader_epoch)

    def _lookup(self, topic: str, index: int) -> tuple[Partition | None, ErrorCode]:
        state = self.image.partition(topic, index)
        if self.log_dir_failure is not None and (
            (topic, index) in self.partitions or (state and self.node_id in state.replicas)
        ):
            # Kafka's answer for a replica in an offline log directory (retriable: the
            # client refreshes metadata and finds the partition's new leader).
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        p = self.partitions.get((topic, index))
        if p is not None and p.role is not Role.STOPPED:
            return p, ErrorCode.NONE
        if state is not None:
            # It exists, just not here: the client's metadata is stale.
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def _leader_at(
        self, answer: _PartitionAnswer, topic: str, index: int, current_leader_epoch: int
    ) -> Partition | None:
        """The partition if this broker leads it at the epoch the client knows; else
        None, with the reason (unknown, not here, offline, fenced or unknown epoch) set
        as the answer's error code."""
        p, err = self._lookup(topic, index)
        if p is not None:
            err = p.check_leader_epoch(current_leader_epoch)
        if err != ErrorCode.NONE:
            answer.error_code = err
            return None
        return p

    async def _epoch_checkpoints_written(self, request: ProduceRequest) -> None:
        """A new leader's epoch is written to its checkpoint by the first append of
        the epoch (epoch_cache.py): here, on the epoch writer's threads, awaited off
        the loop, so taking thousands of leaderships over costs the loop no fsync
        pair each, and leaderships never appended to cost no write at all."""
        writes = []
        for topic in request.topics:
            for part in topic.partitions:
                p = self.partitions.get((topic.name, part.index))
                if p is not None and p.is_leader and p.log.epoch_cache.unwritten:
                    write = p.log.write_epoch_checkpoint_in_background(self._epoch_writer)
                    if write is not None:
                        writes.append(asyncio.wrap_future(write))
        if writes:
            await asyncio.gather(*writes, return_exceptions=True)

    async def produce(self, request: ProduceRequest, *, internal: bool = False) -> ProduceResponse:
        """`internal`: the group coordinator's own append, the only one that may write
        `__consumer_offsets` (a client's Produce to it is INVALID_TOPIC_EXCEPTION, as
        Kafka's internalTopicsAllowed: a record the coordinator cannot read stops it
        loading that partition, and every group there goes unavailable)."""
        await self._epoch_checkpoints_written(request)
        acks = request.acks
        tracer = hop_trace.TRACER
        received_ns = time.monotonic_ns() if tracer is not None else 0
        topics_out: list[ProduceTopicResponse] = []
        waits: list[tuple[Partition, int, int]] = []
        pending: list[ProducePartitionResponse] = []
        flushes: list[Partition] = []
        # Kafka keys a Produce's record sets by partition, so a partition named twice
        # keeps the last and the first is dropped unanswered. Here each is refused and
        # nothing written for that partition: no success for what was not appended.
        pairs = [(t.name, part.index) for t in request.topics for part in t.partitions]
        repeated: set[tuple[str, int]] = set()
        if len(set(pairs)) < len(pairs):  # counted only then: the hot path
            repeated = {tp for tp, n in Counter(pairs).items() if n > 1}
        for topic in request.topics:
            parts_out: list[ProducePartitionResponse] = []
            topics_out.append(ProduceTopicResponse(name=topic.name, partitions=parts_out))
            for part in topic.partitions:
                r = ProducePartitionResponse(index=part.index)
                parts_out.append(r)
                if acks not in (0, 1, -1):
                    r.error_code = ErrorCode.INVALID_REQUIRED_ACKS
                    r.error_message = f"acks must be 0, 1 or -1 (all), got {acks}"
                    continue
                if topic.name == OFFSETS_TOPIC and not internal:
                    r.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
                    r.error_message = (
                        f"{OFFSETS_TOPIC} is internal: only the group coordinator writes it"
                    )
                    continue
                if (topic.name, part.index) in repeated:
                    r.error_code = ErrorCode.INVALID_REQUEST
                    r.error_message = f"partition {topic.name}-{part.index} appears more than once"
                    continue
                p, err = self._lookup(topic.name, part.index)
                if p is None:
                    r.error_code = err
                    r.current_leader = self._current_leader(topic.name, part.index)
                    continue
                r.current_leader = p.current_leader
                err = p.check_leader_epoch(part.current_leader_epoch)
                if err != ErrorCode.NONE:
                    r.error_code = err
                    continue
                if acks == -1 and len(p.isr) < p.min_insync_replicas:
                    r.error_code = ErrorCode.NOT_ENOUGH_REPLICAS
                    r.error_message = (
                        f"ISR {list(p.isr)} is smaller than min.insync.replicas="
                        f"{p.min_insync_replicas}"
                    )
                    continue
                try:
                    records = part.records
                    # Writable: a request read into its own buffer (protocol/framing.py),
                    # read by no one after this append: stamped there, not copied.
                    info = p.append_as_leader(
                        records,
                        in_place=isinstance(records, memoryview) and not records.readonly,
                    )
                except _REFUSED_APPENDS as exc:
                    r.error_code, r.error_message = _refusal(p, exc)
                    continue
                r.base_offset = info.first_offset
                r.log_append_time_ms = info.log_append_time
                r.log_start_offset = p.log_start_offset
                if info.duplicate:
                    log.debug("%s: duplicate batch answered with offset %d", p.name, r.base_offset)
                    # acks=all still waits until the original is committed (Kafka).
                    if acks == -1:
                        waits.append((p, info.last_offset + 1, p.leader_generation))
                        pending.append(r)
                    continue
                if tracer is not None:
                    first, last = info.first_offset, info.last_offset
                    tracer.stamp("leader.recv", topic.name, part.index, first, last, received_ns)
                    tracer.stamp("leader.append", topic.name, part.index, first, last)
                self._notify(p.tp)
                flush_messages = p.log.config.flush_messages
                if flush_messages is not None and p.log.unflushed_messages >= flush_messages:
                    flushes.append(p)
                if acks == -1:
                    waits.append((p, info.last_offset + 1, p.leader_generation))
                    pending.append(r)
        # flush.messages: as in Kafka, the append that crosses the threshold flushes
        # before it is acknowledged (in a worker thread, never on the loop).
        for p in flushes:
            await self.flush_partition(p)
        if waits:
            op = DelayedProduce(waits)
            await self.produce_purgatory.wait(op, max(0, request.timeout_ms) / 1000)
            op.try_complete()  # what was decided by now (nothing changes without a notify)
            for (p, required, _), r, outcome in zip(waits, pending, op.outcomes, strict=True):
                if outcome is None:
                    r.error_code = ErrorCode.REQUEST_TIMED_OUT
                    r.error_message = (
                        f"high watermark {p.high_watermark} did not reach {required} "
                        f"within {request.timeout_ms} ms"
                    )
                elif outcome == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
                    r.error_code = outcome
                    r.error_message = (
                        f"written, but the ISR {list(p.isr)} shrank below "
                        f"min.insync.replicas={p.min_insync_replicas}"
                    )
                elif outcome == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                    r.error_code = outcome
                    r.current_leader = self._current_leader(*p.tp)
                elif tracer is not None:
                    tracer.stamp("leader.ack", p.topic, p.index, r.base_offset, required - 1)
        return ProduceResponse(topics=topics_out)
