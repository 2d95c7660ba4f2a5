"""The streaming source: `spark.readStream.format("minibroker")`.

Spark drives it from one long-lived Python process on the driver (initialOffset,
latestOffset, partitions, commit) and calls `read()` in executor workers, on fresh
instances: nothing read() needs may live on the instance except the options.

Every plan (latestOffset) validates the previous end positions: where each stored
leader epoch ends on the current leader (OffsetsForLeaderEpoch). A truncation below
a stored offset is found even when the log has grown back past it since.
failOnDataLoss=true raises DataLossError (the query fails with the message);
false logs a WARNING, counts it in the offset's "dataLoss", and plans the partition
from the divergence offset. The decision is kept for partitions(start, end); after a
restart (Spark replays the last planned batch) it is made again from the cluster.
`commit()` and `stop()` hold nothing the source relies on (commit arrives late, stop
may never come).

Admission control as Spark's Kafka source: maxOffsetsPerTrigger caps a micro-batch;
minOffsetsPerTrigger holds it back (latestOffset returns its start) until that many
records are there or maxTriggerDelay has passed since the last micro-batch (not under
Trigger.AvailableNow, which reads what is there). subscribePattern topics created while
the stream runs are new partitions, read from their earliest offset.

Lag and loss: PySpark's Python data source API has no source metrics
(ReportsSourceMetrics is Scala's); it has reportLatestOffset, which Spark shows as
`query.lastProgress["sources"][0]["latestOffset"]`. It holds each partition's latest
offset, the records behind it after the micro-batch per partition, Spark's Kafka
metric names avgOffsetsBehindLatest / maxOffsetsBehindLatest / minOffsetsBehindLatest,
and the cumulative dataLoss and truncations; every plan also logs them at INFO.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark.sql.streaming.datasource import ReadMinRows
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from client.epochs import OffsetBeyondLogEndError
from client.spark.offsets import SourceOffset
from client.spark.options import SourceOptions
from client.spark.options import option_errors_first
from client.spark.partition_reader import read_range
from client.spark.planner import Planner
from client.spark.planner import RangePartition
from client.spark.planning import TRUNCATION
from client.spark.planning import StartDecision
from client.spark.planning import cap_ends
from client.types import TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

_REMEMBERED_PLANS = 8
_PLAN_ATTEMPTS = 5


class MinibrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch stream reader with admission control (maxOffsetsPerTrigger) and
    Trigger.AvailableNow."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.planner = Planner(options)
        self._target: dict[TopicPartition, int] | None = None  # availableNow end
        # start offset text -> the decisions latestOffset made from it
        self._plans: OrderedDict[str, dict[TopicPartition, StartDecision]] = OrderedDict()
        # When the last micro-batch was let through (minOffsetsPerTrigger's clock); 0:
        # never, so the first plan is not held back, as in Spark's Kafka source.
        self._last_trigger_s = 0.0
        self._latest_report: dict[str, Any] | None = None
        self._announced = False

    # ------------------------------------------------------------ driver side

    def _announce(self) -> None:
        if not self._announced:
            self._announced = True
            self.options.announce()

    def initialOffset(self) -> dict[str, Any]:
        return option_errors_first(self._initial_offset)

    def _initial_offset(self) -> dict[str, Any]:
        self._announce()
        o = self.options
        partitions = self.planner.current_partitions()
        if not partitions:
            log.warning(
                "no partition to read yet (%s): new ones are read from their earliest "
                "offset when they appear",
                o.describe_subscription(),
            )
        positions = self.planner.positions_from(o.starting, partitions, starting=True)
        return SourceOffset(positions).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Shown as lastProgress["sources"][0]["latestOffset"]: lag and loss (see the
        module docstring); None before the first plan."""
        return self._latest_report

    def prepareForTriggerAvailableNow(self) -> None:
        """Read up to the high watermarks of now, and no partition that appears later."""
        partitions = self.planner.current_partitions()
        self._target = self.planner.view.high_watermarks(partitions)
        log.info("availableNow: reading up to %s", {str(k): v for k, v in self._target.items()})

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._announce()  # a query restarted from its checkpoint gets no initialOffset()
        stored = SourceOffset.from_json(start)
        for attempt in range(1, _PLAN_ATTEMPTS + 1):
            try:
                return self._plan(stored, limit)
            except OffsetBeyondLogEndError as exc:
                # The log changed between reading the high watermark and looking up its
                # epoch (a truncation or a leader change): plan again from the facts.
                if attempt == _PLAN_ATTEMPTS:
                    raise
                log.info("planning again (%d/%d): %s", attempt, _PLAN_ATTEMPTS, exc)
        raise AssertionError("unreachable")

    def _plan(self, stored: SourceOffset, limit: ReadLimit) -> dict[str, Any]:
        decisions, losses = self.planner.decide_starts(dict(stored.positions))
        self.planner.report(losses)
        starts = {tp: d.start for tp, d in decisions.items()}
        if self._target is not None:
            starts = {
                tp: p for tp, p in starts.items() if tp in self._target or tp in stored.positions
            }
        latest = self.planner.view.high_watermarks(starts)
        highs = latest
        if self._target is not None:
            highs = {tp: min(h, self._target.get(tp, starts[tp].offset)) for tp, h in highs.items()}
        start_offsets = {tp: p.offset for tp, p in starts.items()}
        if not losses and self._held_back(start_offsets, highs, limit):
            self._report(stored, latest)
            return stored.to_json()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end_offsets = cap_ends(start_offsets, highs, max_rows)
        moved = {tp: off for tp, off in end_offsets.items() if off != starts[tp].offset}
        moved_to = self.planner.view.positions_at(moved)
        ends = {tp: moved_to.get(tp, starts[tp]) for tp in end_offsets}
        truncations = sum(loss.kind == TRUNCATION for loss in losses)
        end = SourceOffset(ends, stored.data_loss + len(losses), stored.truncations + truncations)
        self._remember(stored.text(), decisions)
        self._report(end, latest)
        return end.to_json()

    def _held_back(
        self, starts: dict[TopicPartition, int], highs: dict[TopicPartition, int], limit: ReadLimit
    ) -> bool:
        """minOffsetsPerTrigger: fewer new records than that, and less than
        maxTriggerDelay since the last micro-batch (Spark's Kafka source rule)."""
        o = self.options
        minimum = limit.min_rows if isinstance(limit, ReadMinRows) else o.min_offsets_per_trigger
        if isinstance(limit, ReadAllAvailable) or self._target is not None:
            minimum = None
        now = time.monotonic()
        if minimum is not None:
            available = sum(max(0, highs[tp] - starts[tp]) for tp in starts)
            waited_ms = (now - self._last_trigger_s) * 1000
            if available < minimum and waited_ms < o.max_trigger_delay_ms:
                log.debug("holding the micro-batch back: %d of %d records", available, minimum)
                return True
        self._last_trigger_s = now
        return False

    def _report(self, end: SourceOffset, latest: dict[TopicPartition, int]) -> None:
        """Lag and loss after the micro-batch that ends at `end` (module docstring)."""
        behind = {
            tp: max(0, latest[tp] - end.positions[tp].offset)
            for tp in latest
            if tp in end.positions
        }
        by_topic: dict[str, dict[str, int]] = {}
        behind_by_topic: dict[str, dict[str, int]] = {}
        for tp in sorted(latest):
            by_topic.setdefault(tp.topic, {})[str(tp.partition)] = latest[tp]
        for tp in sorted(behind):
            behind_by_topic.setdefault(tp.topic, {})[str(tp.partition)] = behind[tp]
        lags = list(behind.values()) or [0]
        self._latest_report = {
            "partitions": by_topic,
            "recordsBehindLatest": behind_by_topic,
            "avgOffsetsBehindLatest": round(sum(lags) / len(lags), 1),
            "maxOffsetsBehindLatest": max(lags),
            "minOffsetsBehindLatest": min(lags),
            "dataLoss": end.data_loss,
            "truncations": end.truncations,
        }
        log.info(
            "micro-batch planned: records behind latest %s (max %d); data losses %d, "
            "truncations %d",
            {str(tp): n for tp, n in sorted(behind.items())},
            max(lags),
            end.data_loss,
            end.truncations,
        )

    def _remember(self, start_text: str, decisions: dict[TopicPartition, StartDecision]) -> None:
        self._plans[start_text] = decisions
        while len(self._plans) > _REMEMBERED_PLANS:
            self._plans.popitem(last=False)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        stored = SourceOffset.from_json(start)
        decisions = self._plans.get(stored.text())
        if decisions is None:
            # Not planned by this process: a batch replayed after a restart.
            decisions, losses = self.planner.decide_starts(dict(stored.positions))
            self.planner.report(losses)
        starts = {tp: d.start for tp, d in decisions.items()}
        ends = dict(SourceOffset.from_json(end).positions)
        return self.planner.input_partitions(starts, ends)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the checkpoint holds every position."""

    def stop(self) -> None:
        self.planner.close()

    # ------------------------------------------------------------ executor side

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition), type(partition)
        return read_range(partition.offset_range, partition.options)
