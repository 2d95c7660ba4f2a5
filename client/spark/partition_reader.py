"""What a Spark task runs: read one OffsetRange and yield Arrow record batches.

Stateless (Spark calls `read()` in separate, reused worker processes): each call opens
its own connection to the cluster on a private event loop driven from this thread (no
loop thread), reads [start, end) and closes it.

The fetch loop is the consumer's KIP-320 protocol, narrowed to one partition and one
range, and decodes record batches straight into Arrow columns (client.record_columns:
no record object per row). The next fetch is sent before the current one is decoded,
so the broker reads while this process decodes.

- The start position carries the plan's start epoch: it is validated with
  OffsetsForLeaderEpoch before the first fetch, and again after any leader change
  (a new leader may hold another lineage); fetches carry last_fetched_epoch, so the
  leader also reports a divergence itself. Where a position leaves the current
  leader's lineage is EpochEndOffset.diverges_at's rule (a position past the end of its
  epoch, or an epoch the leader never had, from where that epoch began: the plan's
  start_epoch_start, then the first record of each new epoch read). The rules of
  client/epochs.py hold here too:
  no leader older than the plan's newest epoch is asked or read from (the metadata
  is refreshed, with backoff, until it shows one), and an "unknown epoch" answer is
  retried, never a loss.
- Every record read is checked against the epochs the plan expects (OffsetRange:
  floor / ceiling, non-decreasing, exact at end - 1); records carry their batch's
  epoch, so the check runs once per batch and names the first record concerned.
- OFFSET_OUT_OF_RANGE: records deleted by retention inside the range are skipped
  (reported like Spark's Kafka source), anything else is a loss.

A loss with failOnDataLoss=true fails the task with a message naming the partition,
the offset and the epochs; false logs a WARNING and stops the range there (nothing of
the other lineage is emitted; the next plan finds the divergence and resumes there).
Every wait is bounded by kafkaConsumer.pollTimeoutMs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING

from client.cluster import ClusterClient
from client.epochs import EpochEndOffset
from client.epochs import end_offsets_for_epochs
from client.errors import BrokerResponseError
from client.errors import MinibrokerError
from client.errors import error_for
from client.record_columns import ColumnBuffer
from client.record_columns import ValuePiece
from client.record_columns import decode_columns
from client.spark.offsets import Position
from client.spark.options import SourceOptions
from client.spark.planning import DataLossError
from client.spark.planning import OffsetRange
from client.spark.planning import data_loss_hint
from client.spark.planning import describe_divergence
from client.spark.schema import arrow_schema
from protocol.api import CONSUMER_REPLICA_ID
from protocol.api import NO_EPOCH
from protocol.errors import CorruptRecordError
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.record_batch import iter_headers

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

# Rows per Arrow batch handed to Spark: fewer, larger batches cost Spark less per row.
ROWS_PER_ARROW_BATCH = 32_768
# Bytes per fetch: several 1 MiB batches per round trip.
FETCH_BYTES = 4 * 1024 * 1024
FETCH_MAX_WAIT_MS = 500
RETRY_BACKOFF_S = 0.1
RETRY_BACKOFF_MAX_S = 1.0
TIMESTAMP_TYPE_CREATE_TIME = 0


def read_range(r: OffsetRange, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """Every record of `r`, as Arrow batches with the source schema."""
    if r.size == 0:
        return
    fetcher = _PartitionFetcher(options, r)
    try:
        yield from _read(fetcher, r, options)
    finally:
        fetcher.close()


def _read(
    fetcher: _PartitionFetcher, r: OffsetRange, options: SourceOptions
) -> Iterator[pa.RecordBatch]:
    arrow = _ArrowBuilder(r, options.include_headers)
    columns = ColumnBuffer(options.include_headers)
    checker = _EpochChecker(r)
    position = r.start
    # Epoch of the record before `position`: validated before the first fetch; and
    # where that epoch began (-1: not known), for client/epochs.py's rule 4.
    position_epoch = r.start_epoch if r.start > 0 else NO_EPOCH
    epoch_start = r.start_epoch_start if position_epoch != NO_EPOCH else -1
    validate = position_epoch != NO_EPOCH
    last_progress = time.monotonic()
    while position < r.end:
        if time.monotonic() - last_progress > options.poll_timeout_ms / 1000:
            _no_progress(fetcher, r, options, position)
            return
        leader_changed = fetcher.refresh_leader()
        if leader_changed and position_epoch != NO_EPOCH:
            validate = True
        if validate:
            outcome = fetcher.validate(Position(position, position_epoch, epoch_start))
            if outcome == _RETRY:
                continue
            if isinstance(outcome, str):
                _loss(options, _truncation(r, outcome))
                return
            validate = False
        answer = fetcher.fetch(position, position_epoch)
        if answer is None:  # retriable error, or no leader yet: backed off already
            continue
        code = answer.error_code
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            low = answer.log_start_offset
            why = (
                f"offset {position} is out of range (log start {low}, high watermark "
                f"{answer.high_watermark})"
            )
            if position < low < r.end:
                _loss(
                    options,
                    f"{r.tp.topic} partition {r.tp.partition}: offsets {position} to "
                    f"{low - 1} were deleted (retention past offset {position}) before this "
                    f"task read them ({why})",
                    f"skips to offset {low}, the first offset still in the log",
                )
                position, position_epoch, epoch_start, validate = low, NO_EPOCH, -1, False
                fetcher.forget_prefetch()
                continue
            _loss(
                options,
                f"{r.tp.topic} partition {r.tp.partition}: offsets {position} to "
                f"{r.end - 1} are no longer in the log ({why})",
            )
            return
        if code in _REVALIDATE:
            validate = position_epoch != NO_EPOCH
            fetcher.back_off(error_for(code, topic=r.tp.topic, partition=r.tp.partition))
            continue
        if code != ErrorCode.NONE:
            error = error_for(code, topic=r.tp.topic, partition=r.tp.partition)
            if not error.retriable:
                raise error
            fetcher.back_off(error)
            continue
        diverging = answer.diverging_epoch
        if diverging.epoch >= 0:
            at = Position(position, position_epoch, epoch_start)
            lineage = EpochEndOffset(diverging.epoch, diverging.end_offset)
            divergence = lineage.diverges_at(at.offset, at.epoch, at.epoch_start)
            if divergence is not None:
                detail = describe_divergence(f"the position {position}", at, lineage, divergence)
                _loss(options, _truncation(r, detail))
                return
            # Our lineage is intact up to the position; only our epoch was unknown there.
            position_epoch, epoch_start = diverging.epoch, -1
            continue
        data = answer.records
        if not data:
            continue  # nothing new within the fetch wait; the timeout bounds this
        next_offset, next_epoch = _next_position(data, position, position_epoch)
        if next_offset < r.end:
            fetcher.prefetch(next_offset, next_epoch)
        try:
            for pos, _ in iter_headers(data):
                before = len(columns)
                header = decode_columns(data, pos, columns, min_offset=position, end_offset=r.end)
                if header.next_offset > position:
                    if header.partition_leader_epoch != position_epoch:
                        # The first record of this epoch read (rule 4's start offset).
                        epoch_start = max(header.base_offset, position)
                    position = header.next_offset
                    position_epoch = header.partition_leader_epoch
                    last_progress = time.monotonic()
                added = columns.offsets[before:]
                if added:
                    bad = checker.first_mismatch(header.partition_leader_epoch, added)
                    if bad is not None:
                        index, why = bad
                        columns.truncate(before + index)
                        if len(columns):
                            yield arrow.build(columns)
                        _loss(options, why)
                        return
                if len(columns) >= ROWS_PER_ARROW_BATCH:
                    yield arrow.build(columns)
                if position >= r.end:
                    break
        except CorruptRecordError as exc:
            raise error_for(
                ErrorCode.CORRUPT_MESSAGE,
                f"at offset {position}: {exc}",
                topic=r.tp.topic,
                partition=r.tp.partition,
            ) from exc
    if len(columns):
        yield arrow.build(columns)


def _next_position(data: memoryview, offset: int, epoch: int) -> tuple[int, int]:
    """Where the fetch after this response starts: the end of its last whole batch,
    and that batch's leader epoch (what decoding the response leaves as position)."""
    for _, header in iter_headers(data):
        if header.next_offset > offset:
            offset, epoch = header.next_offset, header.partition_leader_epoch
    return offset, epoch


def _truncation(r: OffsetRange, detail: str) -> str:
    return (
        f"log truncation detected on topic {r.tp.topic} partition {r.tp.partition} "
        f"while reading offsets {r.start} to {r.end - 1} (planned with leader epochs "
        f"{r.floor_epoch} to {r.ceiling_epoch}): {detail}"
    )


def _no_progress(
    fetcher: _PartitionFetcher, r: OffsetRange, options: SourceOptions, position: int
) -> None:
    high = fetcher.high_watermark
    why = (
        f"{r.tp.topic} partition {r.tp.partition}: no record at offset {position} "
        f"within kafkaConsumer.pollTimeoutMs={options.poll_timeout_ms} (the range "
        f"ends at {r.end}; the high watermark is {high}"
        + (f"; last error: {fetcher.last_error}" if fetcher.last_error is not None else "")
        + ")"
    )
    if 0 <= high < r.end:
        _loss(options, why + ": the log was truncated after the plan")
        return
    raise TimeoutError(why)


# What a task does with failOnDataLoss=false when the lineage changed under it.
_STOPS_RANGE = (
    "stops this task's range there (a stream's next micro-batch finds the divergence and "
    "resumes at the divergence offset; a batch read returns the records before it)"
)


def _loss(options: SourceOptions, message: str, going_on: str = _STOPS_RANGE) -> None:
    if options.fail_on_data_loss:
        raise DataLossError(f"{message}. {data_loss_hint(going_on)}")
    log.warning("%s (failOnDataLoss=false: the source %s)", message, going_on)


# Errors after which the position is validated again (the leader changed under us).
_REVALIDATE = frozenset(
    {
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
    }
)
_RETRY = "retry"


class _PartitionFetcher:
    """One partition's leader, asked from this thread on a private event loop: the
    loop runs only inside the calls below, so nothing runs behind the caller's back
    (and there is no thread to hand work to)."""

    def __init__(self, options: SourceOptions, r: OffsetRange) -> None:
        self.tp = r.tp
        self.timeout_ms = options.poll_timeout_ms
        self.high_watermark = -1
        self.last_error: MinibrokerError | None = None
        self._failures = 0  # retriable failures in a row: the backoff doubles
        self._leader: tuple[int, int] | None = None  # (node, leader epoch) fetched from
        # ((offset, last epoch, node, leader epoch), the fetch already sent for them)
        self._prefetched: tuple[tuple[int, int, int, int], asyncio.Task[FetchResponse]] | None = (
            None
        )
        self._loop = asyncio.new_event_loop()
        self.cluster = ClusterClient(options.bootstrap_servers, client_id="minibroker-spark-reader")
        try:
            self._run(self.cluster.bootstrap())
            self._run(self.cluster.wait_for_topics({self.tp.topic}, timeout_ms=self.timeout_ms))
        except BaseException:
            self.close()
            raise
        # The plan saw leaders at these epochs: none older is asked or read from.
        newest = max(r.start_epoch, r.end_epoch, r.ceiling_epoch)
        if newest != NO_EPOCH:
            self.cluster.metadata.await_leader_epoch(self.tp, newest)

    def _run(self, coro):  # type: ignore[no-untyped-def]
        return self._step(asyncio.wait_for(coro, self.timeout_ms / 1000 + 5))

    def _step(self, awaitable):  # type: ignore[no-untyped-def]
        """Run the private loop until `awaitable` is done. A caller with its own loop
        running in this thread (a test, a notebook) is blocked for that time, as a
        blocking client call blocks it: its loop is set aside and put back."""
        outer = asyncio._get_running_loop()
        if outer is not None:
            asyncio._set_running_loop(None)
        try:
            return self._loop.run_until_complete(awaitable)
        finally:
            if outer is not None:
                asyncio._set_running_loop(outer)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.forget_prefetch()
            self._run(self.cluster.close())
            pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self._step(asyncio.gather(*pending, return_exceptions=True))
        finally:
            self._loop.close()

    def refresh_leader(self) -> bool:
        """Look up the leader in the cache; True when it changed since the last fetch
        (the caller validates its position again)."""
        try:
            current = self.cluster.leader_for(self.tp)
        except BrokerResponseError:
            return False  # fetch() backs off and refreshes
        changed = self._leader is not None and current != self._leader
        if changed:
            log.info("%s: leader changed %s -> %s", self.tp, self._leader, current)
            self.forget_prefetch()
        self._leader = current
        return changed

    def back_off(self, error: MinibrokerError) -> None:
        log.info("%s: %s; refreshing metadata and retrying", self.tp, error)
        self.last_error = error
        self.forget_prefetch()
        delay = min(RETRY_BACKOFF_S * 2 ** min(self._failures, 10), RETRY_BACKOFF_MAX_S)
        self._failures += 1
        self._run(self._refresh_after(delay))

    async def _refresh_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self.cluster.refresh_metadata({self.tp.topic})
        except MinibrokerError as exc:
            log.debug("metadata refresh failed: %s", exc)

    def validate(self, at: Position) -> str | None:
        """OffsetsForLeaderEpoch(at.epoch) on the current leader: None when `at` lies
        on its lineage, a description of the divergence when it does not, _RETRY after
        a retriable error (backed off), among them a leader older than the epoch and an
        "unknown epoch" answer (client/epochs.py)."""
        results, errors = self._run(end_offsets_for_epochs(self.cluster, {self.tp: at.epoch}))
        if self.tp in errors:
            error = errors[self.tp]
            if not error.retriable:
                raise error
            self.back_off(error)
            return _RETRY
        self._failures = 0
        answer = results[self.tp]
        divergence = answer.diverges_at(at.offset, at.epoch, at.epoch_start)
        if divergence is not None:
            return describe_divergence(f"the position {at.offset}", at, answer, divergence)
        return None

    def prefetch(self, offset: int, last_epoch: int) -> None:
        """Send the fetch at (`offset`, `last_epoch`) now; fetch() with the same
        position collects its answer."""
        self.forget_prefetch()
        if self._leader is None:
            return
        node, leader_epoch = self._leader
        task = self._loop.create_task(self._send_fetch(node, leader_epoch, offset, last_epoch))
        self._prefetched = ((offset, last_epoch, node, leader_epoch), task)
        # Run the loop once so the request is written before this thread decodes.
        self._step(asyncio.sleep(0))

    def forget_prefetch(self) -> None:
        if self._prefetched is not None:
            self._prefetched[1].cancel()
            self._prefetched = None

    async def _send_fetch(
        self, node: int, leader_epoch: int, offset: int, last_epoch: int
    ) -> FetchResponse:
        request = FetchRequest(
            replica_id=CONSUMER_REPLICA_ID,
            max_wait_ms=FETCH_MAX_WAIT_MS,
            min_bytes=1,
            max_bytes=FETCH_BYTES,
            topics=[
                FetchTopic(
                    topic=self.tp.topic,
                    partitions=[
                        FetchPartition(
                            partition=self.tp.partition,
                            current_leader_epoch=leader_epoch,
                            fetch_offset=offset,
                            last_fetched_epoch=last_epoch,
                            partition_max_bytes=FETCH_BYTES,
                        )
                    ],
                )
            ],
        )
        response = await self.cluster.send(
            node, request, timeout_ms=self.cluster.request_timeout_ms + FETCH_MAX_WAIT_MS
        )
        assert isinstance(response, FetchResponse)
        return response

    def fetch(self, offset: int, last_epoch: int) -> FetchPartitionResponse | None:
        """The leader's answer for this partition at `offset`; None after a retriable
        failure (backed off, metadata refreshed)."""
        try:
            node, leader_epoch = self.cluster.leader_for(self.tp)
        except BrokerResponseError as exc:
            self.back_off(exc)
            return None
        self._leader = (node, leader_epoch)
        prefetched, self._prefetched = self._prefetched, None
        try:
            if prefetched is not None and prefetched[0] == (offset, last_epoch, node, leader_epoch):
                response = self._run(prefetched[1])
            else:
                if prefetched is not None:
                    prefetched[1].cancel()
                response = self._run(self._send_fetch(node, leader_epoch, offset, last_epoch))
        except MinibrokerError as exc:
            if not exc.retriable:
                raise
            self.back_off(exc)
            return None
        if response.error_code != ErrorCode.NONE:
            error = error_for(response.error_code, f"Fetch refused by broker {node}")
            if not error.retriable:
                raise error
            self.back_off(error)
            return None
        self._failures = 0
        for topic in response.responses:
            for p in topic.partitions:
                if topic.topic == self.tp.topic and p.partition_index == self.tp.partition:
                    if p.high_watermark >= 0:
                        self.high_watermark = p.high_watermark
                    return p
        return None


class _EpochChecker:
    """The records of a range must carry the epochs the plan saw."""

    def __init__(self, r: OffsetRange) -> None:
        self.r = r
        self.previous = r.floor_epoch

    def first_mismatch(self, epoch: int, offsets: Sequence[int]) -> tuple[int, str] | None:
        """Check records at `offsets` (in order), which all carry leader epoch `epoch`
        (one batch): the index of the first that the plan does not expect, and why."""
        r = self.r
        bad: int | None = None
        if (
            (r.floor_epoch >= 0 and epoch < r.floor_epoch)
            or (r.ceiling_epoch >= 0 and epoch > r.ceiling_epoch)
            or epoch < self.previous
        ):
            bad = 0
        elif r.end_epoch >= 0 and epoch != r.end_epoch and offsets[-1] >= r.end - 1:
            bad = next((i for i, off in enumerate(offsets) if off == r.end - 1), None)
        if bad is None:
            self.previous = epoch
            return None
        return bad, (
            f"log truncation detected on topic {r.tp.topic} partition {r.tp.partition}: "
            f"the record at offset {offsets[bad]} carries leader epoch {epoch}, but the "
            f"plan for offsets {r.start} to {r.end - 1} expects leader epochs "
            f"{_bounds(r)} (the log changed after the plan: another lineage is there now)"
        )


def _bounds(r: OffsetRange) -> str:
    low = "any" if r.floor_epoch < 0 else str(r.floor_epoch)
    high = "any" if r.ceiling_epoch < 0 else str(r.ceiling_epoch)
    end = f", {r.end_epoch} at offset {r.end - 1}" if r.end_epoch >= 0 else ""
    return f"from {low} to {high}, non-decreasing{end}"


class _ArrowBuilder:
    """Arrow batches with the source schema from a ColumnBuffer; the columns that are
    the same on every row (topic, partition, timestampType) are built once."""

    def __init__(self, r: OffsetRange, include_headers: bool) -> None:
        import pyarrow as pa

        self.include_headers = include_headers
        self.schema = arrow_schema(include_headers)
        types = self.schema.types
        self._constants = [
            pa.repeat(pa.scalar(r.tp.topic, types[2]), ROWS_PER_ARROW_BATCH),
            pa.repeat(pa.scalar(r.tp.partition, types[3]), ROWS_PER_ARROW_BATCH),
            pa.repeat(pa.scalar(TIMESTAMP_TYPE_CREATE_TIME, types[6]), ROWS_PER_ARROW_BATCH),
        ]

    def _constant(self, which: int, n: int) -> pa.Array:
        import pyarrow as pa

        column = self._constants[which]
        if n <= len(column):
            return column.slice(0, n)
        return pa.repeat(column[0], n)

    def build(self, columns: ColumnBuffer) -> pa.RecordBatch:
        """The buffered rows as one Arrow batch; empties `columns`."""
        import pyarrow as pa
        import pyarrow.compute as pc

        types = self.schema.types
        n = len(columns)
        timestamps = pc.multiply(pa.array(columns.timestamps, pa.int64()), 1000)  # ms -> us
        arrays = [
            pa.array(columns.keys, types[0]),
            _value_array(columns.value_pieces, types[1]),
            self._constant(0, n),
            self._constant(1, n),
            pa.array(columns.offsets.to_list(), types[4]),
            timestamps.cast(types[5]),
            self._constant(2, n),
        ]
        if self.include_headers:
            assert columns.headers is not None
            arrays.append(
                pa.array(
                    [[{"key": k, "value": v} for k, v in hs] for hs in columns.headers], types[7]
                )
            )
        arrays.append(pa.array(columns.epochs(), types[-1]))
        columns.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _value_array(pieces: list[ValuePiece], binary: pa.DataType) -> pa.Array:
    """The value column: lists of values as they are; a run of alike records as
    fixed-size binary records (no copy) whose value bytes are sliced out in C."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = []
    for piece in pieces:
        if isinstance(piece, list):
            arrays.append(pa.array(piece, binary))
            continue
        records = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(piece.stride),
            piece.count,
            [None, pa.py_buffer(piece.data).slice(piece.start, piece.count * piece.stride)],
        )
        values = pc.binary_slice(records, piece.offset, piece.offset + piece.size)
        arrays.append(values.cast(binary))
    if not arrays:
        return pa.array([], binary)
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)
