"""The sender: one task drains ready batches to their leaders (one Produce per broker,
at most max_in_flight per partition), completes each record's future, retries what
may be retried within delivery_timeout_ms and fails the rest."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict

from client.errors import BrokerResponseError
from client.errors import IllegalStateError
from client.errors import KafkaTimeoutError
from client.errors import MinibrokerError
from client.errors import PossiblyWrittenError
from client.errors import UnknownTopicOrPartitionError
from client.errors import error_for
from client.producer.batches import _SEQUENCE_ERRORS
from client.producer.batches import _SEQUENCE_WRAP
from client.producer.batches import _Batch
from client.producer.batches import _earliest
from client.producer.batches import log
from client.types import RecordMetadata
from protocol.errors import PRODUCE_REFUSED_BEFORE_APPEND
from protocol.errors import ErrorCode
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.record_batch import NO_PRODUCER_EPOCH
from protocol.record_batch import NO_PRODUCER_ID
from protocol.record_batch import NO_SEQUENCE
from runtime import hop_trace


def _trace_produce_answer(
    tracer: hop_trace.HopTracer, batches: list[_Batch], response: object, written_ns: int
) -> None:
    """Opt-in tracing: when each appended batch's Produce was written, and now (its
    answer read); the offsets are known only from the answer."""
    if not isinstance(response, ProduceResponse):
        return
    now = time.monotonic_ns()
    base = {(t.name, p.index): p.base_offset for t in response.topics for p in t.partitions}
    for batch in batches:
        first = base.get((batch.tp.topic, batch.tp.partition), -1)
        if first >= 0:
            last = first + batch.record_count - 1
            tp = batch.tp
            tracer.stamp("producer.write", tp.topic, tp.partition, first, last, written_ns)
            tracer.stamp("producer.answer", tp.topic, tp.partition, first, last, now)


class Sender:
    """The sender: one task drains ready batches to their leaders (one Produce per broker,"""

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
                if expired.last_error is not None:
                    why += f"; last error: {expired.last_error}"
                self._fail(expired, self._give_up_error(expired, why, expired.last_error))
            if queue:  # wake for its expiry, whatever holds it back meanwhile (a bump)
                next_check = _earliest(next_check, queue[0].created + delivery_timeout - now)
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
            tracer = hop_trace.TRACER
            written_ns = time.monotonic_ns() if tracer is not None else 0
            response = await self._cluster.send(node, request)
            if tracer is not None:
                _trace_produce_answer(tracer, batches, response, written_ns)
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
        batch.last_error = error
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
