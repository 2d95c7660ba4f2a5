"""What a Spark task runs: read one OffsetRange and yield Arrow record batches.

Stateless (Spark calls `read()` in separate, reused worker processes): each call opens
its own blocking `client.Consumer` (own event loop thread), reads [start, end) and
closes it. The consumer seeks with the plan's start epoch, so it validates the start
with OffsetsForLeaderEpoch itself (KIP-320, auto_offset_reset='none'), and every record
read is checked against the epochs the plan expects (OffsetRange: floor / ceiling,
non-decreasing, exact at end - 1). A mismatch means the log changed between the plan
and this read: failOnDataLoss=true fails the task with a message naming the partition,
the offset and the epochs; false logs a WARNING and stops the range there (nothing of
the other lineage is emitted; the next plan finds the divergence and resumes there).
Every wait is bounded by kafkaConsumer.pollTimeoutMs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from client.errors import LogTruncationError, OffsetOutOfRangeError
from client.spark.options import SourceOptions
from client.spark.planning import DATA_LOSS_HINT, DataLossError, OffsetRange
from client.spark.schema import arrow_schema
from client.sync import Consumer
from client.types import ConsumerRecord, OffsetAndMetadata

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

ROWS_PER_ARROW_BATCH = 8192
POLL_MS = 500
TIMESTAMP_TYPE_CREATE_TIME = 0


class _Stop(Exception):
    """The range ends early (failOnDataLoss=false after a loss)."""


def read_range(r: OffsetRange, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """Every record of `r`, as Arrow batches with the source schema."""
    if r.size == 0:
        return
    columns = _Columns(options.include_headers)
    consumer = Consumer(
        options.bootstrap_servers,
        client_id="minibroker-spark-reader",
        auto_offset_reset="none",
        max_poll_records=ROWS_PER_ARROW_BATCH,
        fetch_max_wait_ms=POLL_MS,
        api_timeout_ms=options.poll_timeout_ms,
    )
    try:
        consumer.assign([r.tp])
        if r.start_epoch >= 0 and r.start > 0:
            consumer.seek(r.tp, OffsetAndMetadata(r.start, "", r.start_epoch))
        else:
            consumer.seek(r.tp, r.start)
        for chunk in _records(consumer, r, options):
            for record in chunk:
                columns.add(record)
            if len(columns) >= ROWS_PER_ARROW_BATCH:
                yield columns.flush()
        if len(columns):
            yield columns.flush()
    finally:
        consumer.close()


def _records(
    consumer: Consumer, r: OffsetRange, options: SourceOptions
) -> Iterator[list[ConsumerRecord]]:
    """Checked records of `r`, chunk by chunk, until end (or an early stop)."""
    checker = _EpochChecker(r)
    next_offset = r.start
    last_progress = time.monotonic()
    while next_offset < r.end:
        try:
            polled = consumer.poll(timeout_ms=POLL_MS)
        except LogTruncationError as exc:
            _loss(
                options,
                f"log truncation detected on topic {r.tp.topic} partition {r.tp.partition} "
                f"while reading offsets {r.start} to {r.end - 1} (planned with leader epochs "
                f"{r.floor_epoch} to {r.ceiling_epoch}): {exc}",
            )
            return
        except OffsetOutOfRangeError as exc:
            low = consumer.beginning_offsets([r.tp])[r.tp]
            if next_offset < low < r.end:
                _loss(
                    options,
                    f"{r.tp.topic} partition {r.tp.partition}: offsets {next_offset} to "
                    f"{low - 1} were deleted (retention) before this task read them ({exc}); "
                    f"skipping to {low}",
                    stop=False,
                )
                consumer.seek(r.tp, low)
                next_offset = low
                continue
            _loss(
                options,
                f"{r.tp.topic} partition {r.tp.partition}: offsets {next_offset} to "
                f"{r.end - 1} are no longer in the log ({exc})",
            )
            return
        chunk = [rec for records in polled.values() for rec in records if rec.offset < r.end]
        if chunk:
            last_progress = time.monotonic()
            bad = checker.first_mismatch(chunk)
            if bad is not None:
                index, why = bad
                if index:
                    yield chunk[:index]
                _loss(options, why)
                return
            next_offset = chunk[-1].offset + 1
            yield chunk
        elif any(rec.offset >= r.end for records in polled.values() for rec in records):
            return  # the records up to end were not there (compacted/control batches)
        if (
            next_offset < r.end
            and time.monotonic() - last_progress > options.poll_timeout_ms / 1000
        ):
            high = consumer.end_offsets([r.tp])[r.tp]
            why = (
                f"{r.tp.topic} partition {r.tp.partition}: no record at offset {next_offset} "
                f"within kafkaConsumer.pollTimeoutMs={options.poll_timeout_ms} (the range "
                f"ends at {r.end}; the high watermark is {high})"
            )
            if high < r.end:
                _loss(options, why + ": the log was truncated after the plan")
                return
            raise TimeoutError(why)


def _loss(options: SourceOptions, message: str, *, stop: bool = True) -> None:
    if options.fail_on_data_loss:
        raise DataLossError(f"{message}. {DATA_LOSS_HINT}")
    log.warning("%s (failOnDataLoss=false: %s)", message, "range stopped" if stop else "going on")


class _EpochChecker:
    """The records of a range must carry the epochs the plan saw."""

    def __init__(self, r: OffsetRange) -> None:
        self.r = r
        self.previous = r.floor_epoch

    def first_mismatch(self, chunk: list[ConsumerRecord]) -> tuple[int, str] | None:
        r = self.r
        for i, rec in enumerate(chunk):
            epoch = rec.leader_epoch
            wrong = (
                (r.floor_epoch >= 0 and epoch < r.floor_epoch)
                or (r.ceiling_epoch >= 0 and epoch > r.ceiling_epoch)
                or epoch < self.previous
                or (rec.offset == r.end - 1 and r.end_epoch >= 0 and epoch != r.end_epoch)
            )
            if wrong:
                return i, (
                    f"log truncation detected on topic {r.tp.topic} partition {r.tp.partition}: "
                    f"the record at offset {rec.offset} carries leader epoch {epoch}, but the "
                    f"plan for offsets {r.start} to {r.end - 1} expects leader epochs "
                    f"{_bounds(r)} (the log changed after the plan: another lineage is there "
                    f"now)"
                )
            self.previous = epoch
        return None


def _bounds(r: OffsetRange) -> str:
    low = "any" if r.floor_epoch < 0 else str(r.floor_epoch)
    high = "any" if r.ceiling_epoch < 0 else str(r.ceiling_epoch)
    end = f", {r.end_epoch} at offset {r.end - 1}" if r.end_epoch >= 0 else ""
    return f"from {low} to {high}, non-decreasing{end}"


class _Columns:
    """Column buffers for one Arrow batch."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.schema = arrow_schema(include_headers)
        self._clear()

    def _clear(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.topics: list[str] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.headers: list[list[dict[str, Any]]] = []
        self.epochs: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, rec: ConsumerRecord) -> None:
        self.keys.append(rec.key)
        self.values.append(rec.value)
        self.topics.append(rec.topic)
        self.partitions.append(rec.partition)
        self.offsets.append(rec.offset)
        self.timestamps.append(rec.timestamp * 1000)  # ms -> us
        if self.include_headers:
            self.headers.append([{"key": k, "value": v} for k, v in rec.headers])
        self.epochs.append(rec.leader_epoch)

    def flush(self) -> pa.RecordBatch:
        import pyarrow as pa

        types = self.schema.types
        n = len(self.offsets)
        arrays = [
            pa.array(self.keys, types[0]),
            pa.array(self.values, types[1]),
            pa.array(self.topics, types[2]),
            pa.array(self.partitions, types[3]),
            pa.array(self.offsets, types[4]),
            pa.array(self.timestamps, types[5]),
            pa.array([TIMESTAMP_TYPE_CREATE_TIME] * n, types[6]),
        ]
        if self.include_headers:
            arrays.append(pa.array(self.headers, types[7]))
        arrays.append(pa.array(self.epochs, types[-1]))
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._clear()
        return batch
