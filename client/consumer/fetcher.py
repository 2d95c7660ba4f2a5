"""The fetcher: one Fetch per leader for its assigned partitions with their positions
and epochs, the answers decoded into buffered records, and the records handed out by
poll in order."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from itertools import repeat
from typing import NamedTuple

from client.consumer.partition_state import RecordFields
from client.consumer.partition_state import _Fetched
from client.consumer.partition_state import _PartitionState
from client.consumer.partition_state import log
from client.epochs import leader_for_epoch
from client.errors import BrokerResponseError
from client.errors import LeaderEpochBehindError
from client.errors import MinibrokerError
from client.errors import error_for
from client.record_columns import ColumnBuffer
from client.record_columns import decode_columns
from client.types import ConsumerRecord
from client.types import TopicPartition
from protocol.api import CONSUMER_REPLICA_ID
from protocol.api import NO_EPOCH
from protocol.errors import CorruptRecordError as ProtocolCorruptRecordError
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.record_batch import check_batch
from protocol.record_batch import decode_batch_into
from protocol.record_batch import iter_headers
from runtime import hop_trace

_new_tuple = tuple.__new__


class _DrainedFetch(NamedTuple):
    """A fetch taken by poll_batches() before its decode, with the position's epoch
    and epoch start as they were before the drain moved them."""

    fetched: _Fetched
    position_epoch: int
    position_epoch_start: int
    # Where the drain left the position (the fetch's end as its headers say).
    moved_to: tuple[int, int]


def _corrupt_batch(tp: TopicPartition, offset: int, exc: Exception) -> MinibrokerError:
    """The error poll() raises for a batch at `offset` that failed its checks."""
    return error_for(
        ErrorCode.CORRUPT_MESSAGE,
        f"at offset {offset}: {exc}",
        topic=tp.topic,
        partition=tp.partition,
    )


class Fetcher:
    """The fetcher: one Fetch per leader for its assigned partitions with their positions"""

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

    @contextlib.contextmanager
    def _background(
        self, what: str, node: int, in_flight: dict[int, asyncio.Task[None]]
    ) -> Iterator[None]:
        """Around a background request to `node` (a fetch, a validation): an unexpected
        error (a bug, corrupt data) is kept for poll() to raise; either way the node's
        slot in `in_flight` is freed and a waiting poll() woken."""
        try:
            yield
        except Exception as exc:
            log.exception("%s broker %d failed", what, node)
            self._pending_error = exc
        finally:
            in_flight.pop(node, None)
            self._fetch_done.set()

    def _drain(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp in list(self._buffer):
            if limit <= 0:
                break
            fetched = self._buffer[tp]
            state = self._states.get(tp)
            if (
                state is None
                or state.paused
                or state.position != fetched.fetch_offset
                or fetched.data is not None  # fetched for poll_batches: fetch again
            ):
                del self._buffer[tp]  # unassigned, paused or seeked since the fetch
                continue
            fields = fetched.records[fetched.index : fetched.index + limit]
            fetched.index += len(fields)
            limit -= len(fields)
            if fields:
                # The ConsumerRecords are made only now, as they are handed out: held
                # in the buffer they would be GC-tracked (see RecordFields).
                chunk = list(map(_new_tuple, repeat(ConsumerRecord, len(fields)), fields))
                out[tp] = chunk
                last = chunk[-1]
                epoch = last.leader_epoch
                if chunk[0].leader_epoch != epoch:  # the epoch changed in this chunk
                    i = len(chunk) - 1
                    while chunk[i - 1].leader_epoch == epoch:
                        i -= 1
                    state.position_epoch_start = chunk[i].offset
                elif state.position_epoch != epoch:
                    state.position_epoch_start = chunk[0].offset
                state.position = last.offset + 1
                state.position_epoch = epoch
            if fetched.index >= len(fetched.records):
                # Past the last batch even if its tail records were compacted away.
                del self._buffer[tp]
                if fetched.next_offset > state.position:
                    if fetched.next_epoch != state.position_epoch:
                        state.position_epoch_start = -1  # not seen: compacted away
                    state.position = fetched.next_offset
                    state.position_epoch = fetched.next_epoch
            else:
                fetched.fetch_offset = state.position
        return out

    def _drain_undecoded(self) -> dict[TopicPartition, _DrainedFetch]:
        """poll_batches()'s _drain, first half: take each partition's whole undecoded
        fetch and move its position to where the fetch's batch headers say it ends, so
        the next fetch can go out before this one is decoded (_decode_drained, the
        second half, settles the position from what the decode found)."""
        out: dict[TopicPartition, _DrainedFetch] = {}
        for tp in list(self._buffer):
            fetched = self._buffer.pop(tp)
            state = self._states.get(tp)
            if (
                state is None
                or state.paused
                or state.position != fetched.fetch_offset
                or fetched.data is None  # decoded for poll(): fetch again as columns
            ):
                continue
            before = (state.position_epoch, state.position_epoch_start)
            if fetched.next_offset > fetched.fetch_offset:
                state.position = fetched.next_offset
                state.position_epoch = fetched.next_epoch
            out[tp] = _DrainedFetch(fetched, *before, (state.position, state.position_epoch))
        return out

    def _undo_drain(self, drained: dict[TopicPartition, _DrainedFetch]) -> None:
        """Put back the positions _drain_undecoded moved, for fetches that will not be
        decoded (poll_batches() was cancelled before it could hand them out): their
        records are fetched again, and the fetch already sent from further on is
        dropped when it answers."""
        for tp, (fetched, epoch_before, epoch_start_before, moved_to) in drained.items():
            state = self._states.get(tp)
            if state is not None and (state.position, state.position_epoch) == moved_to:
                state.position = fetched.fetch_offset
                state.position_epoch = epoch_before
                state.position_epoch_start = epoch_start_before

    def _decode_drained(
        self, drained: dict[TopicPartition, _DrainedFetch]
    ) -> dict[TopicPartition, ColumnBuffer]:
        """poll_batches()'s _drain, second half: decode each drained fetch into columns
        and move its position past them as _drain moves it past records. A corrupt
        batch ends the columns before it and puts the position back on it (the fetch
        already sent from further on is then dropped), so the next poll fetches it again
        and raises, as poll() does."""
        out: dict[TopicPartition, ColumnBuffer] = {}
        for tp, (fetched, epoch_before, epoch_start_before, moved_to) in drained.items():
            columns, next_offset, next_epoch, error = self._decode_fetch(tp, fetched)
            if columns.offsets:
                out[tp] = columns
            state = self._states.get(tp)
            if state is None or (state.position, state.position_epoch) != moved_to:
                continue  # seeked, or unassigned, since the drain: that position stands
            if error is not None and not columns.offsets:
                self._pending_error = error
            state.position = fetched.fetch_offset
            state.position_epoch = epoch_before
            state.position_epoch_start = epoch_start_before
            if columns.offsets:
                runs = [run for run in columns.epoch_runs if run[1]]
                epoch = runs[-1][0]
                in_last_epoch = 0  # rows at the end carrying the last epoch
                for run_epoch, rows in reversed(runs):
                    if run_epoch != epoch:
                        break
                    in_last_epoch += rows
                if in_last_epoch < len(columns) or state.position_epoch != epoch:
                    state.position_epoch_start = columns.offsets[len(columns) - in_last_epoch]
                state.position = columns.offsets[-1] + 1
                state.position_epoch = epoch
            if next_offset > state.position:
                if next_epoch != state.position_epoch:
                    state.position_epoch_start = -1  # not seen: compacted away
                state.position = next_offset
                state.position_epoch = next_epoch
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
        with self._background("fetch from", node, self._fetching):
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
            tracer = hop_trace.TRACER
            if tracer is not None:
                tracer.stamp_batches("consumer.fetched", tp.topic, tp.partition, p.records)
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
        if self._want_columns:
            self._buffer_columns(tp, fetch_offset, data)
            return
        # Whole batches decode straight into RecordFields tuples, one pass per batch
        # (decode_batch_into); control batches only move the next offset.
        records: list[RecordFields] = []
        next_offset, next_epoch = fetch_offset, state.position_epoch
        topic, partition = tp.topic, tp.partition
        verify = self.check_crcs
        # Records from here on only: the batch holding the position starts below it,
        # and a batch overlapping the one before it (a broker's fault) would repeat
        # offsets; Kafka's consumer skips the records below its position.
        floor = fetch_offset
        try:
            for pos, header in iter_headers(data):
                if verify:
                    check_batch(data, pos, header)
                if not header.is_control:
                    start = len(records)
                    decode_batch_into(records, data, pos, header, topic, partition)
                    if header.base_offset < floor:
                        records[start:] = [r for r in records[start:] if r[2] >= floor]
                    if len(records) > start:
                        floor = records[-1][2] + 1
                if header.next_offset > next_offset:
                    next_offset = header.next_offset
                    next_epoch = header.partition_leader_epoch
        except ProtocolCorruptRecordError as exc:
            # Records decoded before the bad batch are still good: return them first.
            if not records:
                self._pending_error = _corrupt_batch(tp, next_offset, exc)
                return
        kd, vd = self._key_deserializer, self._value_deserializer
        if kd is not None or vd is not None:
            records = [
                (
                    *r[:5],
                    kd(r[5]) if kd is not None and r[5] is not None else r[5],
                    vd(r[6]) if vd is not None and r[6] is not None else r[6],
                    r[7],
                )
                for r in records
            ]
        self._buffer[tp] = _Fetched(fetch_offset, records, next_offset, next_epoch)

    def _buffer_columns(self, tp: TopicPartition, fetch_offset: int, data: bytes) -> None:
        """_buffer_records for poll_batches(): the fetch is kept undecoded, with where
        its complete batches end as their headers say (no CRC check yet: the decode
        after the next fetch is sent checks everything)."""
        next_offset, next_epoch = fetch_offset, self._states[tp].position_epoch
        with contextlib.suppress(ProtocolCorruptRecordError):  # the decode reports it
            for _, header in iter_headers(data):
                if header.next_offset > next_offset:
                    next_offset = header.next_offset
                    next_epoch = header.partition_leader_epoch
        self._buffer[tp] = _Fetched(fetch_offset, [], next_offset, next_epoch, data)

    def _decode_fetch(
        self, tp: TopicPartition, fetched: _Fetched
    ) -> tuple[ColumnBuffer, int, int, MinibrokerError | None]:
        """The batches of an undecoded fetch as columns (decode_columns: runs of alike
        records are cut out, no object per value) with the same checks as poll()'s
        decode; returns them, where the good batches end and their epoch, and the error
        of the batch that failed its checks, if one did."""
        data = fetched.data
        assert data is not None
        columns = ColumnBuffer(with_headers=True)
        next_offset, next_epoch = fetched.fetch_offset, NO_EPOCH
        try:
            for pos, header in iter_headers(data):
                decode_columns(
                    data, pos, columns, min_offset=fetched.fetch_offset, verify_crc=self.check_crcs
                )
                if header.next_offset > next_offset:
                    next_offset = header.next_offset
                    next_epoch = header.partition_leader_epoch
        except ProtocolCorruptRecordError as exc:
            return columns, next_offset, next_epoch, _corrupt_batch(tp, next_offset, exc)
        return columns, next_offset, next_epoch, None
